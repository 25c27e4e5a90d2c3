"""PSI training data on the synthetic world: (P-GenRM prompt, oracle chain) pairs, rejection-sampled.

Each seen user's first ``history_size`` train pairs are their history (shown in the prompt as User / Chosen /
Rejected triples); their remaining train pairs are the examples. ``history_variants > 1`` adds, per further
variant, every train pair again with a history of ``history_size`` other train pairs of the same user drawn at
random (seeded), variant v with min(v, history_size) of them: more distinct (history, pair) examples from the
same users, none of them val or test pairs, and histories as short as a cold-start user's.
The slot order of each example is drawn from a
seeded stream per pair, so the chosen answer sits in slot 1 half of the time. With ``label_filter`` a chain is kept
only when it prefers the chosen answer (the paper's rejection sampling of teacher chains; the share kept is
reported). Without it every chain is kept: rejection sampling with a stochastic teacher is itself a
policy-improvement step, which would absorb part of what the RL stages are there to find.

The teacher (``oracle_chain.TeacherRule``) draws the chain's ``Type`` from its candidate types with a seeded stream
per example. Every example records whether it is *contested*: the types consistent with the evidence (those that
agree with the most recent history pair) disagree about the pair, so a persona consistent with the evidence
prefers the rejected answer. These are the hard negatives of this model (the curriculum's ``hard_kind:
contested``), beside the world's own "differs in one attribute".
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pr_rlhf.pgenrm.oracle_chain import ChainStyle, OracleChain, TeacherRule, oracle_chain, teacher_types
from pr_rlhf.reward.inputs import rm_input
from pr_rlhf.reward.sec import format_sec, sec_compact_prompt, sec_prompt
from pr_rlhf.world.generator import World, WorldPair
from pr_rlhf.world.reference import WorldPrior


@dataclass
class PSIExample:
    pair_id: str
    user_id: str
    messages: list[dict]
    target: str
    first_is_chosen: bool
    correct: bool
    hardness: str                # the world's: "hard" (differs in one attribute) or "standard"
    contested: bool = False      # the types consistent with the evidence disagree about this pair
    history_ids: tuple[str, ...] = ()   # the history pairs shown in the prompt, oldest first


@dataclass
class PSIStats:
    examples: int = 0
    kept: int = 0
    per_hardness: dict[str, list[int]] = field(default_factory=dict)   # hardness -> [kept, seen]

    @property
    def kept_share(self) -> float:
        return self.kept / self.examples if self.examples else float("nan")


def example_histories(train: list[WorldPair], history_size: int, variants: int, seed: int, user_index: int):
    """(history, pair, stream key) for variant 0 (the first pairs as history, the rest as examples) and each
    further variant v (every pair, with min(v, history_size) of the user's other train pairs as history)."""
    for j, pair in enumerate(train[history_size:], history_size):
        yield train[:history_size], pair, (seed, user_index, j)
    for v in range(1, variants):
        for j, pair in enumerate(train):
            others = [p for p in train if p is not pair]
            rng = np.random.default_rng([seed, user_index, j, v, 1])
            size = min(v, history_size, len(others))   # variants 1, 2, ...: 1, 2, ... history pairs (cold starts)
            picked = sorted(rng.choice(len(others), size, replace=False))
            yield [others[i] for i in picked], pair, (seed, user_index, j, v)


def candidate_decisions(world: World, prior: WorldPrior, pair: WorldPair, history: list[WorldPair]
                        ) -> dict[int, bool]:
    """Per type that agrees with the most recent history pair (the ``recent_pair`` teacher's candidates): whether
    the vote chain deciding by it prefers the chosen answer of ``pair``."""
    return {k: oracle_chain(world, prior, pair, history, True, "vote", type_index=k).correct
            for k in teacher_types(world.archetypes, history, "recent_pair")}


def is_contested(world: World, prior: WorldPrior, pair: WorldPair, history: list[WorldPair]) -> bool:
    """Whether the types that agree with the most recent history pair decide ``pair`` differently."""
    return len(set(candidate_decisions(world, prior, pair, history).values())) > 1


def teacher_chain(world: World, prior: WorldPrior, pair: WorldPair, history: list[WorldPair], first_is_chosen: bool,
                  style: ChainStyle, teacher: TeacherRule, rng: np.random.Generator) -> OracleChain:
    """The teacher's chain: for the vote style ``Type`` drawn uniformly from the teacher's candidate types."""
    if style != "vote":
        return oracle_chain(world, prior, pair, history, first_is_chosen, style)
    candidates = teacher_types(world.archetypes, history, teacher)
    k = candidates[int(rng.integers(len(candidates)))] if len(candidates) > 1 else candidates[0]
    return oracle_chain(world, prior, pair, history, first_is_chosen, style, type_index=k)


def psi_examples(world: World, history_size: int = 3, seed: int = 0, keep_incorrect: bool = False,
                 prior: WorldPrior | None = None, style: ChainStyle = "full",
                 history_variants: int = 1, teacher: TeacherRule = "votes") -> tuple[list[PSIExample], PSIStats]:
    """Teacher-chain SFT examples from every seen user's train pairs after their history. ``style="compact"``:
    the compact chain (no ``<final>`` block: the parser recomputes the weighted sums) and the ``sec_compact``
    prompt, for small models; "full": sec.txt and full rubric wording. ``keep_incorrect``: no label filter."""
    prior = prior or WorldPrior.of(world)
    out: list[PSIExample] = []
    stats = PSIStats()
    for user in world.users:
        if user.cold_start:
            continue
        train = world.pairs_of(user.user_id, "train")
        for history, pair, key in example_histories(train, history_size, history_variants, seed, user.index):
            rng = np.random.default_rng(list(key))
            first_is_chosen = bool(rng.random() < 0.5)
            chain = teacher_chain(world, prior, pair, history, first_is_chosen, style, teacher, rng)
            stats.examples += 1
            counts = stats.per_hardness.setdefault(pair.hardness, [0, 0])
            counts[1] += 1
            if not (chain.correct or keep_incorrect):
                continue
            stats.kept += int(chain.correct)
            counts[0] += int(chain.correct)
            r1, r2 = (pair.chosen, pair.rejected) if first_is_chosen else (pair.rejected, pair.chosen)
            inp = rm_input(pair, history)
            prompt = sec_prompt(inp, r1, r2) if style == "full" else sec_compact_prompt(inp, r1, r2)   # compact, trace
            out.append(PSIExample(pair.pair_id, user.user_id, prompt, format_sec(chain.sec, final=style == "full"),
                                  first_is_chosen, chain.correct, pair.hardness,
                                  style == "vote" and is_contested(world, prior, pair, history),
                                  tuple(h.pair_id for h in history)))
    return out, stats


def grpo_pool(examples: list[PSIExample], min_history: int = 0) -> list[PSIExample]:
    """The GRPO stages' prompts: the examples whose history has at least ``min_history`` pairs."""
    pool = [e for e in examples if len(e.history_ids) >= min_history]
    if not pool:
        raise ValueError(f"no example has >= {min_history} history pairs (min_history of a GRPO stage)")
    return pool


def in_other_order(example: PSIExample, world: World) -> PSIExample:
    """The same (history, pair) prompt with the two responses in the other slots (the target is left empty: the
    GRPO stages use the prompt only)."""
    by_id = {p.pair_id: p for p in world.pairs_of(example.user_id)}
    pair = by_id[example.pair_id]
    first = not example.first_is_chosen
    r1, r2 = (pair.chosen, pair.rejected) if first else (pair.rejected, pair.chosen)
    messages = sec_compact_prompt(rm_input(pair, [by_id[h] for h in example.history_ids]), r1, r2)
    return PSIExample(example.pair_id, example.user_id, messages, "", first, example.correct, example.hardness,
                      example.contested, example.history_ids)
