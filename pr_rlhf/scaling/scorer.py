"""Online test-time user-based scaling of a generative reward model (docs/protocols.md section 4).

For each input (a user's pair with their history) :class:`ScaledJudge` gathers the *evidence* once for the largest
(m, n) asked: the single greedy chain (the (0, 0) verdict; its persona text locates the user among the
prototypes), m chains sampled in ONE engine request (n=m: the prompt's forward pass is shared), and the pair
scored once with each of the n nearest member users' histories. :func:`decide` then reads any smaller (m, n) from
that evidence (the first m samples, the n most similar neighbours), so a whole evaluation grid costs one pass.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pr_rlhf.configs.scaling import ScalingConfig
from pr_rlhf.models.base import Engine, Generation, SamplingParams
from pr_rlhf.reward.inputs import InputMode, RMInput
from pr_rlhf.reward.judge import JudgeFormat, PairwiseJudge, Slot, chosen_slot
from pr_rlhf.scaling.embedding import embed_personas, placement_text
from pr_rlhf.scaling.fusion import (
    ChainScores,
    Scores,
    chain_scores,
    fuse,
    mean_of,
    verdict,
)


@dataclass
class Evidence:
    """What scaling reads for one judged input (chosen answer in ``chosen_slot``)."""

    pair_id: str
    user_id: str
    chosen_slot: Slot
    greedy: ChainScores
    samples: ChainScores = field(default_factory=ChainScores)
    neighbours: list[tuple[str, float]] = field(default_factory=list)     # (user id, similarity), best first
    neighbour_scores: list[Scores | None] = field(default_factory=list)   # the pair with each one's history
    neighbour_failures: Counter = field(default_factory=Counter)
    persona: str | None = None        # the persona text that located the user (None: no chain parsed)
    asked: tuple[int, int] = (0, 0)   # the (m, n) it was gathered for: any smaller point can be read from it
    has_greedy: bool = True           # the greedy chain was generated (always when m = 0)


@dataclass(frozen=True)
class Decision:
    predicted: Slot | None
    scores: Scores | None
    failure: str | None               # why there is no verdict: "no_valid_chain" or "tie"

    def correct(self, chosen: Slot) -> bool:
        return self.predicted is not None and self.predicted == chosen


def agreement(samples: ChainScores, m: int) -> float | None:
    """c in [0, 1]: how much the first m valid chains agree on the better slot (|2 share - 1|; None without any)."""
    decided = [s[0] > s[1] for s in samples.per_sample[:m] if s is not None and s[0] != s[1]]
    return abs(2 * sum(decided) / len(decided) - 1) if decided else None


def decide(ev: Evidence, m: int, n: int, self_weight: float = 0.5, neighbour_weight: float = 0.5,
           certainty_weighting: bool = False) -> Decision:
    """The verdict of grid point (m, n) from the evidence: (0, 0) the greedy chain; m > 0 the mean of the first
    m samples' valid chains; n > 0 the mean over the n best neighbours' valid chains, fused with the own mean
    (with ``certainty_weighting`` and m > 0, the neighbours' weight times 1 - the own chains' agreement)."""
    if m > ev.asked[0] or n > ev.asked[1] or (m == 0 and n == 0 and not ev.has_greedy):
        raise ValueError(f"evidence for {ev.pair_id} was gathered for (m, n) = {ev.asked} (greedy chain: "
                         f"{ev.has_greedy}); asked for ({m}, {n})")
    own = ev.greedy.mean() if (m == 0 and n == 0) else (ev.samples.mean(m) if m > 0 else None)
    others = mean_of([s for s in ev.neighbour_scores[:n] if s is not None]) if n > 0 else None
    if certainty_weighting and m > 0 and n > 0:
        c = agreement(ev.samples, m)
        neighbour_weight = neighbour_weight * (1.0 - (c if c is not None else 0.0))
    fused = fuse(own, others, self_weight, neighbour_weight)
    if fused is None:
        return Decision(None, None, "no_valid_chain")
    slot = verdict(fused)
    return Decision(slot, fused, None if slot is not None else "tie")


class ScaledJudge:
    """Gathers :class:`Evidence` with one engine. ``index`` (a :class:`~pr_rlhf.scaling.index.PrototypeIndex`)
    and ``embedder`` are needed only for n > 0; ``histories`` maps a member user id to its history triples;
    ``profiles`` a user id to its profile vector (``scaling.embedding.profile_vectors``), for profile placement."""

    def __init__(self, engine: Engine, cfg: ScalingConfig, *, seed: int = 0, fmt: JudgeFormat = "sec_compact",
                 index: Any = None, embedder: Any = None, histories: Mapping[str, list[dict]] | None = None,
                 mode: InputMode = "none", top_k: int = 10, use_stated: bool = True,
                 profiles: Mapping[str, Any] | None = None):
        self.engine, self.cfg, self.seed = engine, cfg, int(seed)
        self.index, self.embedder, self.histories = index, embedder, histories or {}
        self.placement = cfg.prototypes.placement
        self.profiles = profiles or {}
        built = (getattr(index, "created", None) or {}).get("placement", "persona") if index is not None \
            else self.placement
        if built != self.placement:
            raise ValueError(f"the prototypes were built with placement {built!r}, scaling.prototypes.placement "
                             f"is {self.placement!r}: rebuild them or set the same placement")
        if self.placement == "profile" and index is not None and not self.profiles:
            raise ValueError("placement 'profile' needs the users' profile vectors (profiles=)")
        self.mode, self.top_k = mode, top_k
        self._prompter = PairwiseJudge(engine, params=SamplingParams(), seed=seed, fmt=fmt,
                                       use_stated_preferences=use_stated)

    def _prompts(self, inputs: Sequence[RMInput], slots: Sequence[Slot]) -> list:
        return [self._prompter.prompt(inp, slot, self.mode, self.top_k) for inp, slot in zip(inputs, slots)]

    def _generate(self, prompts: list, params: SamplingParams) -> list[Generation]:
        gens = self.engine.generate(prompts, params) if prompts else []
        if len(gens) != len(prompts):
            raise RuntimeError(f"engine returned {len(gens)} generations for {len(prompts)} prompts")
        return gens

    def evidence(self, inputs: Sequence[RMInput], m: int | None = None, n: int | None = None,
                 slots: Sequence[Slot] | None = None, greedy: bool | None = None) -> list[Evidence]:
        """Evidence for every input at (m, n) (default: the config's), chosen answers in seeded slots. The greedy
        chain is generated when m = 0 or ``greedy`` asks for it (a grid reads (0, 0) too); otherwise the persona
        that locates the user comes from the first valid sampled chain."""
        m = self.cfg.m if m is None else m
        n = self.cfg.n if n is None else n
        greedy = m == 0 if greedy is None else (greedy or m == 0)
        if n > 0 and (self.index is None or self.embedder is None):
            raise ValueError("n > 0 needs user prototypes: pass index= and embedder= (see scaling.prototypes)")
        slots = list(slots) if slots is not None else [chosen_slot(self.seed, inp.pair_id) for inp in inputs]
        prompts = self._prompts(inputs, slots)
        firsts = self._generate(prompts, SamplingParams(temperature=0.0, max_tokens=self.cfg.max_tokens)) \
            if greedy else [None] * len(prompts)
        out = [Evidence(inp.pair_id, inp.user_id, slot, chain_scores(g) if g is not None else ChainScores(),
                        asked=(m, n), has_greedy=greedy)
               for inp, slot, g in zip(inputs, slots, firsts)]
        if m > 0:
            sampled = self._generate(prompts, SamplingParams(n=m, temperature=self.cfg.temperature,
                                                             max_tokens=self.cfg.max_tokens, seed=self.seed))
            for ev, gen in zip(out, sampled):
                ev.samples = chain_scores(gen)
        if n > 0:
            self._add_neighbours(inputs, slots, out, n)
        return out

    def _add_neighbours(self, inputs: Sequence[RMInput], slots: Sequence[Slot], out: list[Evidence],
                        n: int) -> None:
        for ev in out:   # the persona of the greedy chain, else of the first valid sample
            personas = ev.greedy.personas or ev.samples.personas
            ev.persona = personas[0] if personas else None
        if self.placement == "profile":   # placed by their posts: every user with a profile, whatever they wrote
            located = [i for i, ev in enumerate(out) if ev.user_id in self.profiles]
            vectors = [self.profiles[out[i].user_id] for i in located]
        else:
            located = [i for i, ev in enumerate(out) if ev.persona is not None]
            vectors = embed_personas([placement_text(out[i].persona, self.placement) for i in located],
                                     self.embedder) if located else None
        jobs: list[tuple[int, RMInput, Slot]] = []
        for row, i in enumerate(located):
            ev = out[i]
            found = [(u, s) for u, s in self.index.neighbours(vectors[row], n, exclude=ev.user_id)
                     if self.histories.get(u)]
            ev.neighbours = found
            for user, _ in found:
                history = self.histories[user][:self.cfg.neighbour_history_pairs]
                jobs.append((i, replace(inputs[i], history=history), slots[i]))
        gens = self._generate(self._prompts([j[1] for j in jobs], [j[2] for j in jobs]),
                              SamplingParams(temperature=0.0, max_tokens=self.cfg.max_tokens))
        for (i, _, _), gen in zip(jobs, gens):
            scored = chain_scores(gen)
            out[i].neighbour_scores.append(scored.per_sample[0] if scored.per_sample else None)
            out[i].neighbour_failures.update(scored.failures)


def failure_counts(evidence: Sequence[Evidence]) -> dict[str, int]:
    """Invalid chains by kind over the evidence (greedy, samples, neighbours) and inputs without a persona."""
    total: Counter = Counter()
    for ev in evidence:
        total.update(ev.greedy.failures)
        total.update(ev.samples.failures)
        total.update(ev.neighbour_failures)
        if ev.asked[1] > 0 and ev.persona is None:
            total["no_persona"] += 1   # no parsed chain to place the user: no neighbours
    return dict(total)
