"""P-GenRM's data on real data (``psi.source: teacher``): the seen users' train pairs of shards built by
``pr-rlhf data build`` (pgenrm.real_data), a teacher engine's rejection-sampled chains for PSI (pgenrm.teacher),
the GRPO stages' PR graded by an LLM judge (pgenrm.pr_judge) or none, label-margin hard negatives. There is no
world, so no headroom check.

The teacher and the judge run in the driver's process behind the run's generation cache (``psi.cache``, default
``<out>/cache/``): a rerun or a resumed run never asks for a chain or a grade twice. Files: ``<out>/real_data.json``
(examples, users, the hard-negative rule and threshold), ``<out>/psi/teacher.json`` (the teacher's cost report),
each stage's training prompts (``examples.jsonl``) and each GRPO stage's ``pr_judge.json``.
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pr_rlhf.configs.pgenrm import GRPOStageConfig, RealPGenRMConfig
from pr_rlhf.files import atomic_write_text
from pr_rlhf.models.base import SamplingParams
from pr_rlhf.models.generation_cache import CachedEngine, engine_identity
from pr_rlhf.pgenrm.cre_reward import CREReward
from pr_rlhf.pgenrm.pr_judge import ChainGroup, CoverageJudge, JudgeStats, judged_rewards
from pr_rlhf.pgenrm.psi_data import PSIExample, grpo_pool
from pr_rlhf.pgenrm.real_data import grpo_item, load_real_data
from pr_rlhf.pgenrm.sources import PROMPTS_FILE, Log, PGenRMSource, pair_kinds

REAL_DATA_FILE = "real_data.json"
TEACHER_REPORT = "teacher.json"
JUDGE_REPORT = "pr_judge.json"


def write_prompts(path: Path, examples: Sequence[PSIExample], **columns: Sequence[Any]) -> None:
    """What a stage trained on, one JSON line per example: pair id, messages and ``columns``."""
    path.write_text("".join(json.dumps({"pair_id": e.pair_id, "messages": e.messages,
                                        **{k: v[i] for k, v in columns.items()}}) + "\n"
                            for i, e in enumerate(examples)))


def judge_counts(judge: CoverageJudge | None) -> dict[str, int]:
    """The judge's running counts: chains graded, failed and without gold criteria (all 0 without a judge)."""
    stats = judge.stats if judge is not None else JudgeStats()
    return {"graded": stats.graded, "failed": sum(stats.failed.values()), "unavailable": stats.unavailable}


class RealSource(PGenRMSource):
    eval_format = "sec"   # the full SEC prompt, with the history only (no stated preferences: CRE's information)

    def __init__(self, cfg: RealPGenRMConfig, seed: int, out: Path, on_event: Log):
        super().__init__(out, seed, on_event)
        self.cfg = cfg
        self.data = load_real_data(cfg.shards, cfg.history_size, seed, cfg.hard_quantile)
        self.by_pair = {e.inp.pair_id: e for e in self.data.examples}
        self._chains: list[PSIExample] | None = None
        self._judge: CoverageJudge | None = None

    def prepare(self) -> None:
        atomic_write_text(self.out / REAL_DATA_FILE, json.dumps(self.data.summary(), indent=1))
        self.on_event(f"real data: {self.data.summary()}; no world, so no offline headroom check")

    def cached_engine(self, cfg: Any, name: str) -> CachedEngine:
        """The engine of ``cfg`` behind the run's generation cache ``<cache>/<name>.jsonl``."""
        from pr_rlhf.models import make_engine

        folder = Path(self.cfg.psi.cache) if self.cfg.psi.cache else self.out / "cache"
        return CachedEngine(make_engine(cfg), folder / f"{name}.jsonl", engine_identity(cfg))

    def teacher_chains(self, report_dir: Path) -> list[PSIExample]:
        """The teacher engine's chains for every training example (stated preferences and history in the
        prompt), rejection-sampled, from the cache where it has them; the cost report ``report_dir/teacher.json``
        (pairs, chains, kept, rejected per kind, requests sent, cache hits, tokens)."""
        from pr_rlhf.pgenrm.teacher import teacher_examples

        psi = self.cfg.psi
        t0 = time.perf_counter()
        engine = self.cached_engine(psi.teacher, "teacher")
        try:
            self.on_event(f"teacher: {len(self.data.examples)} pairs x {psi.samples_per_pair} chains "
                          f"({len(engine)} prompts cached)")
            params = SamplingParams(temperature=psi.teacher_temperature, max_tokens=psi.teacher_max_tokens,
                                    seed=self.seed)
            examples, stats = teacher_examples([e.inp for e in self.data.examples], engine, params, seed=self.seed,
                                               samples_per_pair=psi.samples_per_pair, use_stated=True)
        finally:
            engine.close()
        examples = [dataclasses.replace(e, hardness="hard" if self.by_pair[e.pair_id].hard else "standard",
                                        history_ids=self.by_pair[e.pair_id].history_ids) for e in examples]
        report = {"pairs": stats.pairs, "chains": stats.chains, "kept": stats.kept, "kept_share": stats.kept_share,
                  "rejected": dict(stats.rejected), "first_engine_error": stats.first_engine_error,
                  "cache": engine.stats.as_dict(), "seconds": time.perf_counter() - t0}
        report_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(report_dir / TEACHER_REPORT, json.dumps(report, indent=1))
        self.on_event(f"teacher: kept {stats.kept} of {stats.chains} chains; rejected {dict(stats.rejected)}; "
                      f"{engine.stats.requests} requests sent, {engine.stats.hits} from the cache")
        if not examples:
            said = f"; first engine error: {stats.first_engine_error}" if stats.first_engine_error else ""
            raise ValueError(f"the teacher kept no chain of {stats.chains} ({dict(stats.rejected)}{said}): PSI has "
                             f"nothing to learn (see {report_dir / TEACHER_REPORT})")
        return examples

    def psi_examples(self, stage_dir: Path) -> list[PSIExample]:
        if self._chains is None:
            self._chains = self.teacher_chains(stage_dir)
        # what PSI saw, for the user (and the test that stated preferences reach it)
        write_prompts(stage_dir / PROMPTS_FILE, self._chains, target=[e.target for e in self._chains])
        return self._chains

    def grpo_pool(self, scfg: GRPOStageConfig, stage_dir: Path) -> tuple[list[PSIExample], list[bool]]:
        pool = grpo_pool([grpo_item(e) for e in self.data.examples], scfg.min_history)
        hard = [e.hardness == "hard" for e in pool]   # the label-margin rule (real_data.hard_flags)
        write_prompts(stage_dir / PROMPTS_FILE, pool, hard=hard)   # the pool as the GenRM sees it (history only)
        return pool, hard

    def other_order(self, item: PSIExample) -> PSIExample:
        return grpo_item(self.by_pair[item.pair_id], not item.first_is_chosen)

    def pr_judge(self) -> CoverageJudge | None:
        """The PR judge behind the cache, built on first use (None: the recipe has none, every alpha is 0)."""
        if self._judge is None and self.cfg.pr_judge is not None:
            self._judge = CoverageJudge(self.cached_engine(self.cfg.pr_judge, "pr_judge"),
                                        SamplingParams(temperature=0.0, max_tokens=self.cfg.pr_judge_max_tokens,
                                                       seed=self.seed))
        return self._judge

    def rewards(self, items: Sequence[PSIExample], texts: Sequence[Sequence[str]], scfg: GRPOStageConfig
                ) -> tuple[list[list[CREReward]], dict[str, float]]:
        judge = self.pr_judge()
        before = judge_counts(judge)
        groups = [ChainGroup(chains, item.first_is_chosen, self.data.gold.get(item.pair_id, ""),
                             self.by_pair[item.pair_id].inp.question) for item, chains in zip(items, texts)]
        rewards = judged_rewards(groups, judge, scfg.alpha, scfg.beta, scfg.format_penalty)
        after = judge_counts(judge)
        return rewards, {f"reward/pr_{k}": after[k] - before[k] for k in after}

    def end_stage(self, stage_dir: Path) -> None:
        if self._judge is not None:
            atomic_write_text(stage_dir / JUDGE_REPORT, json.dumps({**self._judge.stats.as_dict(),
                                                                    "cache": self._judge.engine.stats.as_dict()}))
            self._judge.engine.close()
            self._judge = None

    def pair_kinds(self) -> dict[str, set[str]]:
        return pair_kinds({p: "hard" if h else "standard" for p, h in self.data.hard.items()})
