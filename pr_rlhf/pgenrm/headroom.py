"""The headroom check that comes before any RL on the GenRM (docs/protocols.md section 4, "headroom first").

Offline, from the world alone, on exactly the pairs the stages are evaluated on:

- the **teacher's** expected accuracy (its ``Type`` drawn uniformly from its candidate types, each candidate's
  chain decided exactly), the **best rule** available from the student's own inputs (the vote chain's argmax-votes
  type) and the **Bayes oracle** (the posterior given the same history), overall and on the *contested* pairs
  (the types consistent with the evidence disagree: ``psi_data.is_contested``), with the share of pairs where the
  teacher and the rule can decide differently;
- the same numbers for each alternative design (the vote teacher, the beatable ``recent_pair`` teacher, and the
  paper-literal *stated* teacher that decides from a stated user type, stale with probability ``stale``), so the
  report says which setting leaves room;
- on the GRPO prompt pool (seen users' train pairs): the share of prompts whose group of G teacher-like samples
  would carry reward variance, 1 - p^G - (1 - p)^G with p the per-prompt chance of a correct chain.

The gate (research discipline): go to RL only when the best available rule beats the teacher by >= 5 points
overall and >= 20 on the contested pairs, with contested pairs >= 20% of the seen-user evaluation set.

On a trained model (:func:`model_headroom`): greedy accuracy, maj@k and pass@k at the rollout temperature, the
share of prompts with mixed decisions among their k samples, and the entropy at the decision token (the token after
``Type:``), overall and on contested prompts.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pr_rlhf.configs.pgenrm import WorldPGenRMConfig
from pr_rlhf.eval.groups import EVAL_GROUPS
from pr_rlhf.pgenrm.oracle_chain import TeacherRule, oracle_chain, teacher_types, vote_type
from pr_rlhf.pgenrm.psi_data import candidate_decisions, is_contested
from pr_rlhf.stats import paired_difference_ci
from pr_rlhf.world.generator import World, WorldPair
from pr_rlhf.world.reference import WorldPrior

GATE_OVERALL = 0.05      # the best rule beats the teacher by this much overall ...
GATE_CONTESTED = 0.20    # ... and by this much on the contested pairs ...
GATE_CONTESTED_SHARE = 0.20   # ... which are at least this share of the evaluation set
DECISION_MARKER = "Type:"     # the vote chain's decision: every later line follows from it


class HeadroomGateError(RuntimeError):
    """A GRPO stage was asked for while the headroom check says there is nothing for RL to find."""


@dataclass(frozen=True)
class HeldOutItem:
    pair: WorldPair
    history: list[WorldPair]


def held_out_items(world: World, group: str, history_size: int) -> list[HeldOutItem]:
    """The evaluation pairs of ``group`` (seen: val + test of seen users; cold: test of cold-start users), each with
    the user's first ``history_size`` train pairs as history (the evaluation's own)."""
    held_out = EVAL_GROUPS[group]
    out = []
    for user in world.users:
        if user.cold_start != held_out.cold_start:
            continue
        history = world.history(user.user_id, history_size)
        out += [HeldOutItem(p, history) for p in world.pairs_of(user.user_id) if p.split in held_out.splits]
    return out


def type_correct(world: World, prior: WorldPrior, item: HeldOutItem, k: int) -> bool:
    """Whether the vote chain deciding by type ``k`` prefers the chosen answer (a tie is wrong)."""
    return oracle_chain(world, prior, item.pair, item.history, True, "vote", type_index=k).correct


def teacher_expected(world: World, prior: WorldPrior, item: HeldOutItem, rule: TeacherRule | str,
                     stale: float = 0.2) -> float:
    """The expected accuracy on ``item`` of a teacher that draws ``Type`` by ``rule``: "votes", "recent_pair", or
    "stated" (the user's true type, a uniformly drawn other type with probability ``stale``)."""
    n_types = len(world.archetypes)
    if rule == "stated":
        true = world.user(item.pair.user_id).archetype
        others = [k for k in range(n_types) if k != true]
        p_other = stale / len(others) if others else 0.0
        return (1 - stale if others else 1.0) * type_correct(world, prior, item, true) + \
            sum(p_other * type_correct(world, prior, item, k) for k in others)
    candidates = teacher_types(world.archetypes, item.history, rule)   # type: ignore[arg-type]
    return float(np.mean([type_correct(world, prior, item, k) for k in candidates]))


def bayes_score(prior: WorldPrior, item: HeldOutItem) -> float:
    """1 / 0.5 / 0: the posterior's preference for the chosen answer given the history."""
    hist = np.array([p.differing for p in item.history]).reshape(-1, len(item.pair.differing))
    p = float(prior.preference(hist, item.pair.differing[None, :])[0])
    return 1.0 if p > 0.5 else 0.0 if p < 0.5 else 0.5


def _split_means(values: np.ndarray, contested: np.ndarray) -> dict[str, float | None]:
    def mean(mask: np.ndarray) -> float | None:
        return float(values[mask].mean()) if mask.any() else None
    return {"all": mean(np.ones_like(contested)), "contested": mean(contested), "rest": mean(~contested)}


def _paired_gain_split(new: np.ndarray, old: np.ndarray, contested: np.ndarray, users: list[str],
                       seed: int = 0) -> dict[str, dict[str, float]]:
    """new - old with its 95% CI resampling users, on all pairs and on the contested ones."""
    out = {}
    for name, mask in (("all", np.ones_like(contested)), ("contested", contested)):
        if mask.any():
            gain, low, high = paired_difference_ci(new[mask], old[mask], seed=seed,
                                                   clusters=[u for u, m in zip(users, mask) if m])
            out[name] = {"gain": gain, "ci_low": low, "ci_high": high}
    return out


def _mean_or_zero(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else 0.0


def gate(rule: dict, teacher: dict, contested_share: float) -> dict[str, Any]:
    """The go / no-go for RL from the seen-user numbers, with the reason for each failed condition."""
    gain_all = rule["all"] - teacher["all"]
    gain_hard = (rule["contested"] or 0.0) - (teacher["contested"] or 0.0)
    failed = []
    if gain_all < GATE_OVERALL:
        failed.append(f"the best rule beats the teacher by {100 * gain_all:+.1f} points overall "
                      f"(needs >= {100 * GATE_OVERALL:.0f})")
    if gain_hard < GATE_CONTESTED:
        failed.append(f"by {100 * gain_hard:+.1f} on contested pairs (needs >= {100 * GATE_CONTESTED:.0f})")
    if contested_share < GATE_CONTESTED_SHARE:
        failed.append(f"contested pairs are {100 * contested_share:.1f}% of the set (needs >= "
                      f"{100 * GATE_CONTESTED_SHARE:.0f}%)")
    return {"go": not failed, "rule_minus_teacher": gain_all, "rule_minus_teacher_contested": gain_hard,
            "contested_share": contested_share, "failed": failed,
            "verdict": "go: the best available rule leaves room for RL" if not failed else
            "no go: change the setting first (" + "; ".join(failed) + ")"}


def offline_headroom(world: World, teacher: TeacherRule, history_size: int = 3, *, prior: WorldPrior | None = None,
                     group_size: int = 4, pool: Sequence[tuple[WorldPair, list[WorldPair]]] = (),
                     stale: float = 0.2, pool_contested_share: float | None = None) -> dict[str, Any]:
    """The offline part of the check for the recipe's ``teacher``, with the alternative designs beside it.
    ``pool_contested_share``: the share of contested prompts the RL stage draws (None: the pool's natural mix);
    the expected share of groups with reward variance is reported at that mix too."""
    prior = prior or WorldPrior.of(world)
    out: dict[str, Any] = {"teacher": teacher, "designs": {}, "groups": {}}
    designs: tuple[str, ...] = ("votes", "recent_pair", "stated")
    for group in EVAL_GROUPS:
        items = held_out_items(world, group, history_size)
        if not items:
            continue
        contested = np.array([is_contested(world, prior, it.pair, it.history) for it in items])
        rule = np.array([type_correct(world, prior, it, vote_type(world.archetypes, it.history)[2]) for it in items],
                        dtype=float)
        bayes = np.array([bayes_score(prior, it) for it in items])
        per_design = {d: np.array([teacher_expected(world, prior, it, d, stale) for it in items]) for d in designs}
        out["groups"][group] = {
            "pairs": len(items), "contested_share": float(contested.mean()),
            "best_rule": _split_means(rule, contested), "bayes": _split_means(bayes, contested),
            "teachers": {d: _split_means(v, contested) for d, v in per_design.items()},
            # pairs where the teacher can decide otherwise than the best rule (its expected accuracy differs)
            "teacher_differs_share": {d: float(np.mean(np.abs(v - rule) > 1e-9)) for d, v in per_design.items()},
            # what RL could gain over the recipe's teacher, with its CI over users
            "rule_minus_teacher": _paired_gain_split(rule, per_design[teacher], contested,
                                                     [it.pair.user_id for it in items]),
            "candidate_roles": candidate_roles(world, prior, items),
        }
    seen = out["groups"]["seen"]
    for d in designs:
        out["designs"][d] = gate(seen["best_rule"], seen["teachers"][d], seen["contested_share"])
    out["gate"] = out["designs"][teacher]
    if pool:
        p = np.array([teacher_expected(world, prior, HeldOutItem(pair, hist), teacher, stale) for pair, hist in pool])
        mixed = 1 - p ** group_size - (1 - p) ** group_size
        contested = np.array([is_contested(world, prior, pair, hist) for pair, hist in pool])
        share = float(contested.mean()) if pool_contested_share is None else pool_contested_share
        at_mix = share * _mean_or_zero(mixed[contested]) + (1 - share) * _mean_or_zero(mixed[~contested])
        out["grpo_pool"] = {"prompts": len(p), "group_size": group_size,
                            "expected_groups_with_variance": float(mixed.mean()),
                            "contested_share": float(contested.mean()), "stage_contested_share": share,
                            "expected_groups_with_variance_at_stage_mix": float(at_mix),
                            "teacher_accuracy": float(p.mean()),
                            "candidate_roles": candidate_roles(world, prior,
                                                               [HeldOutItem(pair, hist) for pair, hist in pool])}
    return out


# -------------------------------------------------------------------------------------------------------------------
# On a trained model
# -------------------------------------------------------------------------------------------------------------------

def decision_position(token_texts: Sequence[str], marker: str = DECISION_MARKER) -> int | None:
    """Index of the first token with non-space text after the first ``marker`` in the concatenation of
    ``token_texts`` (None when the chain has no marker or nothing follows it)."""
    text, end = "", None
    for i, piece in enumerate(token_texts):
        text += piece
        if end is None and marker in text:
            end = text.index(marker) + len(marker)
            rest = text[end:]
            if rest.strip():
                return i
            continue
        if end is not None and text[end:].strip():
            return i
    return None


def chain_decision(text: str, first_is_chosen: bool) -> int | None:
    """1 when the chain prefers the chosen answer, 0 when the rejected one, None when it does not parse or ties."""
    from pr_rlhf.reward.sec import parse_sec

    parsed = parse_sec(text)
    if not parsed.ok or parsed.value is None:
        return None
    prefers_first = parsed.value.prefers_first
    return None if prefers_first is None else int(prefers_first == first_is_chosen)


TYPE_CHOICES = ("top", "non_top", "tie_first", "tie_other")
_VOTES_LINE = re.compile(r"^Votes:((?:\s+[A-Z]\d+)+)\s*$", re.M)
_TYPE_LINE = re.compile(r"^Type:\s*([A-Z])\s*$", re.M)
_AGREES_LINE = re.compile(r"^Agrees \d+:\s*(.*)$", re.M)


def type_choice(text: str) -> str | None:
    """How a vote chain's ``Type`` relates to its own lines, among the types agreeing with the most recent history
    pair (the ``recent_pair`` teacher's candidates): ``top`` (the one candidate with the most votes), ``non_top``,
    ``tie_first`` (the first of candidates tied on votes: the vote rule's choice) or ``tie_other``. None when the
    chain has no such lines or its Type is not a candidate. Never raises on model output."""
    votes_m, type_m, agrees = _VOTES_LINE.search(text), _TYPE_LINE.search(text), _AGREES_LINE.findall(text)
    if not (votes_m and type_m and agrees):
        return None
    votes = {v[0]: int(v[1:]) for v in votes_m.group(1).split()}
    candidates = [t for t in agrees[-1].split() if t in votes]
    return candidate_role(votes, candidates, type_m.group(1))


def candidate_role(votes: dict, candidates: Sequence, chosen) -> str | None:
    """The role of ``chosen`` among ``candidates`` by their ``votes`` (see :func:`type_choice`); None when it
    is not a candidate."""
    if chosen not in candidates:
        return None
    best = max(votes[t] for t in candidates)
    tops = [t for t in candidates if votes[t] == best]
    if len(tops) == 1:
        return "top" if chosen == tops[0] else "non_top"
    return "tie_first" if chosen == tops[0] else ("tie_other" if chosen in tops else "non_top")


def candidate_roles(world: World, prior: WorldPrior, items: Sequence[HeldOutItem]) -> dict[str, dict[str, float]]:
    """On the contested items, how often deciding by a ``recent_pair`` candidate of each role is right: what a
    policy choosing among the candidates can learn from these items ({role: {"candidates", "right"}}). Compare
    the GRPO pool's with the evaluation's: RL learns the pool's."""
    table: dict[str, list[float]] = {}
    for it in items:
        right = candidate_decisions(world, prior, it.pair, it.history)
        if len(set(right.values())) < 2:       # not contested (is_contested): every candidate decides alike
            continue
        votes = dict(enumerate(vote_type(world.archetypes, it.history)[1]))
        for k, ok in right.items():
            table.setdefault(str(candidate_role(votes, list(right), k)), []).append(float(ok))
    return {r: {"candidates": len(table[r]), "right": float(np.mean(table[r]))} for r in TYPE_CHOICES if r in table}


def type_choice_table(rows: Sequence[dict], only: set[str] | None = None) -> dict[str, dict[str, float]]:
    """{choice: {"pairs", "accuracy"}} over evaluation rows (``pair_id``, ``raw``, ``correct``), with the chains
    whose choice cannot be read counted under ``unread``."""
    table: dict[str, list[float]] = {}
    for r in rows:
        if only is not None and r["pair_id"] not in only:
            continue
        table.setdefault(type_choice(r.get("raw") or "") or "unread", []).append(float(r["correct"]))
    return {k: {"pairs": len(v), "accuracy": float(np.mean(v))}
            for k, v in sorted(table.items(), key=lambda kv: (TYPE_CHOICES + ("unread",)).index(kv[0]))}


def sample_statistics(decisions: Sequence[Sequence[int | None]], greedy: Sequence[int | None]) -> dict[str, float]:
    """greedy, maj@k (most common valid decision; a tie of votes counts half, as the coin flip that breaks it
    would; no valid sample is wrong), pass@k and the share of prompts whose valid samples hold both decisions."""
    maj, passed, mixed = [], [], []
    for ds in decisions:
        valid = [d for d in ds if d is not None]
        ones = sum(valid)
        maj.append(0.5 if valid and ones * 2 == len(valid) else float(ones * 2 > len(valid)))
        passed.append(float(ones > 0))
        mixed.append(float(0 < ones < len(valid)))
    return {"greedy": float(np.mean([g == 1 for g in greedy])), "maj": float(np.mean(maj)),
            "pass": float(np.mean(passed)), "mixed_share": float(np.mean(mixed)),
            "invalid_sample_share": float(np.mean([d is None for ds in decisions for d in ds]))}


def model_headroom(model_dir: str, world: World, items: Sequence[HeldOutItem], *, k: int = 8,
                   temperature: float = 1.0, max_tokens: int = 320, seed: int = 0, max_model_len: int = 2048,
                   contested: Sequence[bool] | None = None) -> dict[str, Any]:
    """The model part of the check on ``items`` (each prompt in the evaluation's seeded slot order)."""
    import torch
    from transformers import AutoModelForCausalLM

    from pr_rlhf.configs.base import engine_config
    from pr_rlhf.models import make_engine
    from pr_rlhf.models.base import SamplingParams
    from pr_rlhf.models.prompting import load_tokenizer
    from pr_rlhf.reward.inputs import rm_input
    from pr_rlhf.reward.judge import chosen_slot
    from pr_rlhf.reward.sec import sec_compact_prompt

    slots = [chosen_slot(seed, it.pair.pair_id) == "A" for it in items]
    prompts = []
    for it, first in zip(items, slots):
        r1, r2 = (it.pair.chosen, it.pair.rejected) if first else (it.pair.rejected, it.pair.chosen)
        prompts.append(sec_compact_prompt(rm_input(it.pair, it.history), r1, r2))
    engine = make_engine(engine_config(backend="hf", model=model_dir, max_model_len=max_model_len))
    try:
        greedy = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=seed))
        sampled = engine.generate(prompts, SamplingParams(n=k, temperature=temperature, max_tokens=max_tokens,
                                                          seed=seed))
    finally:
        engine.close()
    greedy_dec = [chain_decision(g.samples[0].text, f) if g.ok and g.samples else None
                  for g, f in zip(greedy, slots)]
    sample_dec = [[chain_decision(s.text, f) for s in g.samples] if g.ok else [None] * k
                  for g, f in zip(sampled, slots)]

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    fork_entropy: list[float | None] = []
    token_entropy: list[float] = []
    with torch.no_grad():
        for g in greedy:
            if not g.ok or not g.samples or not g.samples[0].token_ids:
                fork_entropy.append(None)
                continue
            response = list(g.samples[0].token_ids)
            ids = torch.tensor([list(g.prompt_token_ids or []) + response])
            logits = model(input_ids=ids).logits[0, len(ids[0]) - len(response) - 1:-1].float()
            ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
            token_entropy.append(float(ent.mean()))
            pos = decision_position([tokenizer.decode([t]) for t in response])
            fork_entropy.append(None if pos is None else float(ent[pos]))
    contested_arr = np.array(contested if contested is not None else [False] * len(items), dtype=bool)
    out: dict[str, Any] = {"prompts": len(items), "k": k, "temperature": temperature,
                           "contested_share": float(contested_arr.mean()),
                           "all": sample_statistics(sample_dec, greedy_dec),
                           "mean_token_entropy": float(np.mean(token_entropy)) if token_entropy else None}
    for name, mask in (("contested", contested_arr), ("rest", ~contested_arr)):
        idx = np.flatnonzero(mask)
        if idx.size:
            out[name] = sample_statistics([sample_dec[i] for i in idx], [greedy_dec[i] for i in idx])
    for name, mask in (("all", np.ones_like(contested_arr)), ("contested", contested_arr), ("rest", ~contested_arr)):
        vals = [fork_entropy[i] for i in np.flatnonzero(mask) if fork_entropy[i] is not None]
        if name in out:
            out[name]["decision_entropy"] = float(np.mean(vals)) if vals else None
            out[name]["decision_found_share"] = len(vals) / max(int(mask.sum()), 1)
    return out


# -------------------------------------------------------------------------------------------------------------------
# Report
# -------------------------------------------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _gain_ci(g: dict[str, float]) -> str:
    return f"{100 * g['gain']:+.1f} [{100 * g['ci_low']:+.1f}, {100 * g['ci_high']:+.1f}]"


def headroom_markdown(offline: dict[str, Any], model: dict[str, Any] | None = None) -> str:
    """The headroom check as markdown: the offline designs per group, the gate's verdict, and the model part."""
    lines = [f"### Headroom (teacher: {offline['teacher']})", "",
             f"**Gate: {offline['gate']['verdict']}.**", "",
             "| pairs | design | teacher % | best rule (votes) % | Bayes % | teacher on contested | rule on contested "
             "| Bayes on contested | contested share | teacher may differ from rule | gate |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for group, g in offline["groups"].items():
        for design, t in g["teachers"].items():
            verdict = offline["designs"][design]["go"] if group == "seen" else None
            lines.append(f"| {group} ({g['pairs']}) | {design} | {_pct(t['all'])} | {_pct(g['best_rule']['all'])} | "
                         f"{_pct(g['bayes']['all'])} | {_pct(t['contested'])} | {_pct(g['best_rule']['contested'])} | "
                         f"{_pct(g['bayes']['contested'])} | {_pct(g['contested_share'])} | "
                         f"{_pct(g['teacher_differs_share'][design])} | "
                         f"{'' if verdict is None else 'go' if verdict else 'no go'} |")
    gains = [(group, g["rule_minus_teacher"]) for group, g in offline["groups"].items() if g.get("rule_minus_teacher")]
    if gains:
        lines += ["", f"Best rule - {offline['teacher']} teacher, points [95% CI resampling users]: " + "; ".join(
            f"{group} {_gain_ci(r['all'])} (contested {_gain_ci(r['contested']) if 'contested' in r else '-'})"
            for group, r in gains) + "."]
    pool = offline.get("grpo_pool")
    if pool:
        lines += ["", f"GRPO prompt pool: {pool['prompts']} prompts; the teacher's own accuracy there "
                      f"{_pct(pool['teacher_accuracy'])}%; expected share of groups of {pool['group_size']} with "
                      f"reward variance under a teacher-like policy: {_pct(pool['expected_groups_with_variance'])}% "
                      f"at the pool's mix ({_pct(pool['contested_share'])}% contested), "
                      f"{_pct(pool['expected_groups_with_variance_at_stage_mix'])}% at the RL stage's "
                      f"({_pct(pool['stage_contested_share'])}% contested)."]
    sources = [(f"{group} pairs", g.get("candidate_roles")) for group, g in offline["groups"].items()]
    sources.append(("GRPO pool", (pool or {}).get("candidate_roles")))
    if any(roles for _, roles in sources):
        lines += ["", "What a choice among the teacher's candidates earns on contested items (RL learns the pool's "
                      "column; the evaluation scores the others): % right by the candidate's role, (candidates)", "",
                  "| candidate | " + " | ".join(name for name, _ in sources) + " |",
                  "|---|" + "---|" * len(sources)]
        for role in TYPE_CHOICES:
            lines.append(f"| {role} | " + " | ".join(
                f"{_pct(roles[role]['right'])} ({roles[role]['candidates']})" if roles and role in roles else "-"
                for _, roles in sources) + " |")
    if model:
        lines += ["", f"**On the model** ({model['prompts']} held-out seen-user prompts, {model['k']} samples at "
                      f"temperature {model['temperature']}; contested share {_pct(model['contested_share'])}%):", "",
                  f"| prompts | greedy % | maj@{model['k']} % | pass@{model['k']} % | mixed decisions % | "
                  "invalid samples % | decision-token entropy (nats) |", "|---|---|---|---|---|---|---|"]
        for part in ("all", "contested", "rest"):
            m = model.get(part)
            if m:
                ent = m.get("decision_entropy")
                lines.append(f"| {part} | {_pct(m['greedy'])} | {_pct(m['maj'])} | {_pct(m['pass'])} | "
                             f"{_pct(m['mixed_share'])} | {_pct(m['invalid_sample_share'])} | "
                             f"{'-' if ent is None else f'{ent:.3f}'} |")
        if model.get("mean_token_entropy") is not None:
            lines.append(f"\nMean per-token entropy of the greedy chains: {model['mean_token_entropy']:.4f} nats.")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------------------------
# For a pipeline recipe
# -------------------------------------------------------------------------------------------------------------------

def pipeline_headroom(cfg: WorldPGenRMConfig, seed: int, world: World | None = None, prior: WorldPrior | None = None,
                      examples: Sequence[Any] | None = None) -> dict[str, Any]:
    """The offline check of a ``pgenrm:`` recipe section: its world, teacher and history size, and its GRPO pool
    (the seen users' (history, pair) train examples with >= ``cre.min_history`` history pairs; ``examples``: when
    already built)."""
    from pr_rlhf.pgenrm.psi_data import grpo_pool, psi_examples
    from pr_rlhf.world.generator import build_world

    world = world or build_world(cfg.world)
    prior = prior or WorldPrior.of(world)
    if examples is None:
        examples, _ = psi_examples(world, cfg.history_size, seed=seed, keep_incorrect=True, prior=prior,
                                   style=cfg.chain_style, history_variants=cfg.psi.history_variants,
                                   teacher=cfg.psi.teacher)
    by_id = {p.pair_id: p for p in world.pairs}
    pool = [(by_id[e.pair_id], [by_id[h] for h in e.history_ids])
            for e in grpo_pool(list(examples), cfg.cre.min_history)]
    stage_share = cfg.cre.hard_share_start if cfg.cre.hard_kind == "contested" else None
    return offline_headroom(world, cfg.psi.teacher, cfg.history_size, prior=prior, group_size=cfg.cre.group_size,
                            pool=pool, pool_contested_share=stage_share)


def sampled_model_headroom(model_dir: str, world: World, cfg: WorldPGenRMConfig, seed: int,
                           prior: WorldPrior | None = None) -> dict[str, Any]:
    """:func:`model_headroom` on ``cfg.headroom.prompts`` seeded held-out seen-user prompts."""
    prior = prior or WorldPrior.of(world)
    items = held_out_items(world, "seen", cfg.history_size)
    keep = np.sort(np.random.default_rng([seed, 29]).permutation(len(items))[:cfg.headroom.prompts])
    items = [items[i] for i in keep]
    contested = [is_contested(world, prior, it.pair, it.history) for it in items]
    return model_headroom(model_dir, world, items, k=cfg.headroom.k, temperature=cfg.headroom.temperature,
                          max_tokens=cfg.eval.max_tokens, seed=seed, max_model_len=cfg.rollout.max_model_len,
                          contested=contested)
