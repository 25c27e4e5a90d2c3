"""PSI training data on real data: a teacher engine (``openai`` for a served strong model, or ``vllm`` / ``hf``)
writes structured evaluation chains for labelled pairs, and rejection sampling keeps a chain only when it parses
and its final scores prefer the labelled chosen answer (docs/protocols.md section 4). Model output is never trusted:
unparseable chains, ties, wrong choices and engine errors are counted per kind, never raised.

The prompt is the full P-GenRM prompt (``prompts/sec.txt``: history triples, stated preferences) with the chosen
answer in a seeded slot (``reward.judge.chosen_slot``: balanced over pairs, stable across runs); the SFT target
is the teacher's chain, written back in the canonical format (``format_sec``).
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from pr_rlhf.models.base import Engine, SamplingParams
from pr_rlhf.pgenrm.psi_data import PSIExample
from pr_rlhf.reward.inputs import RMInput
from pr_rlhf.reward.judge import chosen_slot
from pr_rlhf.reward.sec import format_sec, parse_sec, sec_prompt


@dataclass
class TeacherStats:
    pairs: int = 0
    chains: int = 0
    kept: int = 0
    rejected: Counter = field(default_factory=Counter)   # kind -> count: engine_error, <parse error>, tie, wrong
    first_engine_error: str = ""                          # what the engine said the first time it failed

    @property
    def kept_share(self) -> float:
        return self.kept / self.chains if self.chains else float("nan")


def teacher_examples(inputs: Sequence[RMInput], engine: Engine, params: SamplingParams, seed: int = 0,
                     samples_per_pair: int = 1, use_stated: bool = True) -> tuple[list[PSIExample], TeacherStats]:
    """Chains for each pair (``samples_per_pair`` per pair, one engine request with n samples), rejection-sampled:
    at most one kept chain per pair (the first correct one)."""
    stats = TeacherStats(pairs=len(inputs))
    prompts = []
    for inp in inputs:
        first_is_chosen = chosen_slot(seed, inp.pair_id) == "A"
        r1, r2 = (inp.chosen, inp.rejected) if first_is_chosen else (inp.rejected, inp.chosen)
        prompts.append((sec_prompt(inp, r1, r2, use_stated=use_stated), first_is_chosen))
    gens = engine.generate([p for p, _ in prompts], dataclasses.replace(params, n=samples_per_pair))
    out: list[PSIExample] = []
    for inp, (prompt, first_is_chosen), gen in zip(inputs, prompts, gens):
        if gen.error is not None or not gen.samples:
            stats.chains += samples_per_pair
            stats.rejected["engine_error"] += samples_per_pair
            stats.first_engine_error = stats.first_engine_error or str(gen.error or "no samples")[:500]
            continue
        kept = False
        for sample in gen.samples:
            stats.chains += 1
            parsed = parse_sec(sample.text)
            if not parsed.ok or parsed.value is None:
                stats.rejected[str(parsed.error)] += 1
                continue
            prefers_first = parsed.value.prefers_first
            if prefers_first is None:
                stats.rejected["tie"] += 1
            elif prefers_first != first_is_chosen:
                stats.rejected["wrong"] += 1
            elif not kept:
                kept = True
                stats.kept += 1
                out.append(PSIExample(inp.pair_id, inp.user_id, prompt, format_sec(parsed.value), first_is_chosen,
                                      True, "standard"))
            else:
                stats.rejected["duplicate"] += 1   # a second correct chain for the same pair is not kept
    return out, stats
