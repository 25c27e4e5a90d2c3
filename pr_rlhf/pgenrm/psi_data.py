"""PSI training data on the synthetic world: (P-GenRM prompt, oracle chain) pairs, rejection-sampled.

Each seen user's first ``history_size`` train pairs are their history (shown in the prompt as User / Chosen /
Rejected triples); their remaining train pairs are the examples. ``history_variants > 1`` adds, per further
variant, every train pair again with a history of ``history_size`` other train pairs of the same user drawn at
random (seeded), variant v with min(v, history_size) of them: more distinct (history, pair) examples from the
same users, none of them val or test pairs, and histories as short as a cold-start user's.
The slot order of each example is drawn from a
seeded stream per pair, so the chosen answer sits in slot 1 half of the time. A chain is kept only when it
prefers the chosen answer (the paper's rejection sampling of teacher chains); the share kept is reported.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pr_rlhf.pgenrm.oracle_chain import ChainStyle, oracle_chain
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
    hardness: str


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


def psi_examples(world: World, history_size: int = 3, seed: int = 0, keep_incorrect: bool = False,
                 prior: WorldPrior | None = None, style: ChainStyle = "full",
                 history_variants: int = 1) -> tuple[list[PSIExample], PSIStats]:
    """Oracle-chain SFT examples from every seen user's train pairs after their history. ``style="compact"``:
    the compact chain (no ``<final>`` block: the parser recomputes the weighted sums) and the ``sec_compact``
    prompt, for small models; "full": sec.txt and full rubric wording."""
    prior = prior or WorldPrior.of(world)
    out: list[PSIExample] = []
    stats = PSIStats()
    for user in world.users:
        if user.cold_start:
            continue
        train = world.pairs_of(user.user_id, "train")
        for history, pair, key in example_histories(train, history_size, history_variants, seed, user.index):
            first_is_chosen = bool(np.random.default_rng(list(key)).random() < 0.5)
            chain = oracle_chain(world, prior, pair, history, first_is_chosen, style)
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
                                  first_is_chosen, chain.correct, pair.hardness))
    return out, stats
