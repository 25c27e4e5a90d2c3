"""PSI training data on the synthetic world: (P-GenRM prompt, oracle chain) pairs, rejection-sampled.

Each seen user's first ``history_size`` train pairs are their history (shown in the prompt as User / Chosen /
Rejected triples); their remaining train pairs are the examples. The slot order of each example is drawn from a
seeded stream per pair, so the chosen answer sits in slot 1 half of the time. A chain is kept only when it
prefers the chosen answer (the paper's rejection sampling of teacher chains); the share kept is reported.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pr_rlhf.pgenrm.oracle_chain import ChainStyle, oracle_chain
from pr_rlhf.prompts import chat
from pr_rlhf.reward.inputs import RMInput
from pr_rlhf.reward.sec import format_sec, sec_prompt
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


def history_triples(history: list[WorldPair]) -> list[dict]:
    return [{"question": p.question, "chosen": p.chosen, "rejected": p.rejected} for p in history]


def rm_input(pair: WorldPair, history: list[WorldPair]) -> RMInput:
    return RMInput(pair_id=pair.pair_id, user_id=pair.user_id, subset=pair.subset, question=pair.question,
                   chosen=pair.chosen, rejected=pair.rejected, history=history_triples(history))


def compact_prompt(pair: WorldPair, history: list[WorldPair], response_1: str, response_2: str) -> list[dict]:
    """The ``sec_compact`` prompt: one line per history choice, the query, both responses."""
    lines = "\n".join(f"User {i}: {p.question} | chose: {p.chosen} | over: {p.rejected}"
                       for i, p in enumerate(history, 1))
    return chat("sec_compact", history_lines=lines, question=pair.question, response_1=response_1,
                response_2=response_2)


def psi_examples(world: World, history_size: int = 3, seed: int = 0, keep_incorrect: bool = False,
                 prior: WorldPrior | None = None, style: ChainStyle = "full") -> tuple[list[PSIExample], PSIStats]:
    """Oracle-chain SFT examples from every seen user's train pairs after their history. ``style="compact"``:
    the compact chain and the ``sec_compact`` prompt (small models); "full": sec.txt and full rubric wording."""
    prior = prior or WorldPrior.of(world)
    out: list[PSIExample] = []
    stats = PSIStats()
    for user in world.users:
        if user.cold_start:
            continue
        train = world.pairs_of(user.user_id, "train")
        history, examples = train[:history_size], train[history_size:]
        for j, pair in enumerate(examples):
            first_is_chosen = bool(np.random.default_rng([seed, user.index, j]).random() < 0.5)
            chain = oracle_chain(world, prior, pair, history, first_is_chosen, style)
            stats.examples += 1
            counts = stats.per_hardness.setdefault(pair.hardness, [0, 0])
            counts[1] += 1
            if not (chain.correct or keep_incorrect):
                continue
            stats.kept += int(chain.correct)
            counts[0] += int(chain.correct)
            r1, r2 = (pair.chosen, pair.rejected) if first_is_chosen else (pair.rejected, pair.chosen)
            prompt = sec_prompt(rm_input(pair, history), r1, r2) if style == "full" else \
                compact_prompt(pair, history, r1, r2)
            out.append(PSIExample(pair.pair_id, user.user_id, prompt, format_sec(chain.sec), first_is_chosen,
                                  chain.correct, pair.hardness))
    return out, stats
