"""Best-of-N sweeps on Ray (docs/protocols.md section 5): one pool of N samples per prompt, generated once on rollout
workers (the prompt shared by its N samples), every sample scored once by each reward model and by the downstream
judge through reward pools; best-of-k for every k from that one pool (``pr_rlhf.bon.estimator``).

Resumable: the pool is written per rollout call (``<out>/pool/part-*.parquet``) and each scorer's results per
call (``<out>/scores/<name>/part-*.parquet``); a restarted sweep skips the prompts whose samples (or scores) are
on disk. A GenRM scorer in ``sec_reference`` mode compares every sample with the prompt's sample 0 (the same
reference for all k-subsets, so its ranking is consistent). A sample a reward model could not score ranks below
every scored one (counted); a sample the downstream judge could not score leaves the pool (counted).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pr_rlhf.configs.bon import BoNConfig
from pr_rlhf.configs.recipe import Recipe
from pr_rlhf.eval.benchmark import benchmark_accuracies
from pr_rlhf.files import atomic_write
from pr_rlhf.models.base import SamplingParams
from pr_rlhf.report_files import write_report_files
from pr_rlhf.rl.prompts import PromptItem, make_item
from pr_rlhf.shards import ShardReader

DOWNSTREAM = "downstream"


def load_bon_prompts(cfg: BoNConfig, seed: int) -> list[tuple[PromptItem, dict]]:
    """A seeded sample of held-out queries (cold-start users', or the test split): (policy prompt, what reward
    models and judges may see: the query's retrieved profile posts, the user's first ``history_pairs`` train pairs
    as (question, chosen, rejected) triples, and the query's rubric aspects and narrative for a rubric judge)."""
    from pr_rlhf.configs.rl import RLDataConfig
    from pr_rlhf.rl.prompts import user_histories

    reader = ShardReader(cfg.shards)
    cold = reader.cold_start_users()
    if cfg.prompts_from == "cold_start":
        rows = [r for r in reader.iter_rows("queries") if (r["user_id"], r["subset"]) in cold]
    else:
        rows = list(reader.iter_rows("queries", "test"))
    if not rows:
        raise ValueError(f"{cfg.shards}: no {cfg.prompts_from} queries for the sweep")
    keep = np.sort(np.random.default_rng(seed).permutation(len(rows))[:cfg.prompts])
    rubrics = {r["query_id"]: r for r in reader.iter_rows("rubrics")}
    histories = user_histories(reader, cfg.history_pairs)
    data = RLDataConfig(shards=cfg.shards, profile_top_k=cfg.profile_top_k)
    out = []
    for i in keep:
        row = rows[i]
        seen = {"retrieved": [dict(x) for x in row.get("retrieved") or []],
                "history": [dict(t) for t in histories.get((row["user_id"], row["subset"]), ())],
                "rubric": [dict(a) for a in (rubrics.get(row["query_id"]) or {}).get("aspects") or []],
                "narrative": str((rubrics.get(row["query_id"]) or {}).get("narrative") or "")}
        out.append((make_item(row, data, {}), seen))
    return out


def read_parts(folder: Path) -> list[dict]:
    """Every row of the ``part-*.parquet`` files in ``folder``, in part order (a pool's samples or its scores)."""
    import pyarrow.parquet as pq

    rows: list[dict] = []
    for part in sorted(folder.glob("part-*.parquet")):
        rows += pq.read_table(part).to_pylist()
    return rows


def _write_part(folder: Path, index: int, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # a part is complete or absent, never half written
    atomic_write(folder / f"part-{index:05d}.parquet", lambda tmp: pq.write_table(pa.Table.from_pylist(rows), tmp))


class BoNSweep:
    """Runs a ``bon:`` recipe section (Ray must be initialized)."""

    def __init__(self, cfg: BoNConfig, seed: int = 0, log: Any = print):
        self.cfg, self.seed, self.log = cfg, seed, log
        self.out = Path(cfg.out)

    # ------------------------------------------------------------------------------------------ pool
    def generate_pool(self, prompts: Sequence[tuple[PromptItem, dict]]) -> list[dict]:
        import ray

        from pr_rlhf.actors import bon_groups
        from workers.rl_loop import generate_sharded
        from workers.rollout import spawn_rollout_worker

        folder = self.out / "pool"
        rows = read_parts(folder)
        done = {r["prompt_id"] for r in rows}
        todo = [p for p in prompts if p[0].prompt_id not in done]
        self.log(f"pool: {len(done)} prompts on disk, {len(todo)} to generate (n={self.cfg.n})")
        if not todo:
            return rows
        rollout = next(g for g in bon_groups(self.cfg) if g.role == "rollout")
        workers = [spawn_rollout_worker(self.cfg.policy.model_copy(update={"seed": self.seed}), **rollout.options())
                   for _ in range(rollout.count)]
        try:
            part = len(list(folder.glob("part-*.parquet")))
            step = self.cfg.prompts_per_call * self.cfg.rollout_workers
            for start in range(0, len(todo), step):
                chunk = todo[start:start + step]
                params = SamplingParams(n=self.cfg.n, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                        max_tokens=self.cfg.max_tokens, seed=self.seed * 1_000_003 + part)
                gens = generate_sharded(workers, [item.messages for item, _ in chunk], params)
                new = []
                for (item, seen), gen in zip(chunk, gens):
                    if gen.error is not None:
                        raise RuntimeError(f"rollout failed for prompt {item.prompt_id}: {gen.error}")
                    new += [{"prompt_id": item.prompt_id, "user_id": item.user_id, "subset": item.subset,
                             "question": item.question, "retrieved": json.dumps(seen["retrieved"]),
                             "history": json.dumps(seen["history"]), "rubric": json.dumps(seen["rubric"]),
                             "narrative": seen["narrative"], "sample": i,
                             "text": s.text, "tokens": len(s.token_ids)} for i, s in enumerate(gen.samples)]
                _write_part(folder, part, new)
                part += 1
                rows += new
                self.log(f"pool: {len({r['prompt_id'] for r in rows})}/{len(prompts)} prompts")
        finally:
            for w in workers:
                ray.kill(w)
        return rows

    # ------------------------------------------------------------------------------------------ scores
    def score(self, name: str, reward_cfg: Any, pool: list[dict]) -> dict[tuple[str, int], float | None]:
        """(prompt id, sample) -> score (None: unscored), scoring only the prompts not yet on disk."""
        from pr_rlhf.scorers import RewardRequest
        from workers.reward import RewardPool

        folder = self.out / "scores" / name
        rows = read_parts(folder)
        done = {r["prompt_id"] for r in rows}
        by_prompt: dict[str, list[dict]] = {}
        for r in pool:
            by_prompt.setdefault(r["prompt_id"], []).append(r)
        todo = [pid for pid in by_prompt if pid not in done]
        if todo:
            with RewardPool(reward_cfg) as rewards:
                part = len(list(folder.glob("part-*.parquet")))
                for start in range(0, len(todo), self.cfg.prompts_per_call):
                    pids = todo[start:start + self.cfg.prompts_per_call]
                    samples = [s for pid in pids for s in sorted(by_prompt[pid], key=lambda x: x["sample"])]
                    reference = {pid: min(by_prompt[pid], key=lambda x: x["sample"])["text"] for pid in pids}
                    reqs = [RewardRequest(f"{s['prompt_id']}#{s['sample']}", s["user_id"], s["question"], s["text"],
                                          meta={"subset": s["subset"], "retrieved": json.loads(s["retrieved"]),
                                                "history": json.loads(s.get("history") or "[]"),
                                                "rubric": json.loads(s.get("rubric") or "[]"),
                                                "narrative": s.get("narrative") or "",
                                                "reference": reference[s["prompt_id"]]}) for s in samples]
                    results = rewards.score(reqs)
                    new = [{"prompt_id": s["prompt_id"], "sample": s["sample"], "score": r.score, "error": r.error}
                           for s, r in zip(samples, results)]
                    _write_part(folder, part, new)
                    part += 1
                    rows += new
        unscored = sum(r["score"] is None for r in rows)
        self.log(f"scores {name}: {len(rows)} samples, {unscored} unscored")
        return {(r["prompt_id"], int(r["sample"])): r["score"] for r in rows}

    # ------------------------------------------------------------------------------------------ run
    def run(self) -> dict[str, Any]:
        from pr_rlhf.bon.correlation import correlation_report, write_correlation_report
        from pr_rlhf.bon.curves import curve, mlflow_metrics, plot_curves, plot_reward_models, scored_pool

        prompts = load_bon_prompts(self.cfg, self.seed)
        pool = self.generate_pool(prompts)
        quality = self.score(DOWNSTREAM, self.cfg.downstream, pool)
        curves: dict[str, list] = {}
        counts: dict[str, dict[str, int]] = {}
        by_prompt: dict[str, list[dict]] = {}   # grouped once, not rescanned per prompt and reward model
        for r in sorted(pool, key=lambda r: r["sample"]):
            by_prompt.setdefault(r["prompt_id"], []).append(r)
        for name, rcfg in self.cfg.reward_models.items():
            scores = self.score(name, rcfg, pool)
            pools, dropped, unscored = [], 0, 0
            for pid, samples in by_prompt.items():
                kept = [s for s in samples if quality.get((pid, s["sample"])) is not None]
                dropped += len(samples) - len(kept)
                raw = [scores.get((pid, s["sample"])) for s in kept]
                unscored += sum(v is None for v in raw)
                if kept:
                    pools.append(scored_pool(pid, kept[0]["subset"], kept[0]["user_id"], raw,
                                             [quality[(pid, s["sample"])] for s in kept]))
            curves[name] = curve(pools, self.cfg.ks, self.cfg.n_bootstrap, self.seed)
            counts[name] = {"prompts": len(pools), "downstream_unscored": dropped, "rm_unscored": unscored}
        bench = self.benchmark_accuracies()
        report = self.write_report(curves, counts)
        report["benchmark_accuracy"] = bench
        for name, points in curves.items():
            plot_curves(points, self.out / f"bon_{name}.png", title=f"Best-of-k: {name}")
        plot_reward_models(curves, self.out / "bon.png")
        report["metrics"] = {name: mlflow_metrics(points, prefix=f"bon/{name}") for name, points in curves.items()}
        (self.out / "bon.json").write_text(json.dumps(report, indent=1, default=str))
        corr = correlation_report([report])
        if corr.agreements:
            write_correlation_report(corr, self.out, title=f"Benchmark validity ({len(bench)} reward models)")
            top = corr.agreements[-1]
            report["validity"] = {"downstream": top.downstream, "reward_models": top.reward_models,
                                  "spearman_rho": top.spearman_rho, "ndcg": top.ndcg_minmax}
        return report

    def benchmark_accuracies(self) -> dict[str, float]:
        """The recipe's ``benchmark_accuracy``, plus (when not given there) each ``world_estimate`` and ``gold``
        reward model's accuracy on the world's held-out pairs of the sweep's user group."""
        users = "cold_start" if self.cfg.prompts_from == "cold_start" else "seen"
        return benchmark_accuracies(self.cfg.reward_models, self.cfg.benchmark_accuracy, users)

    def write_report(self, curves: dict[str, list], counts: dict[str, dict[str, int]]) -> dict[str, Any]:
        intro = (f"Pool: n = {self.cfg.n} samples per prompt; quality = the downstream judge "
                 f"({self.cfg.downstream.kind}); exact expectation over all k-subsets, 95% bootstrap CI resampling "
                 "users; first-k = the public protocol's estimate.")
        lines = ["## Best-of-k", "", intro, ""]
        for name, points in curves.items():
            rows = sorted((p for p in points if p.subset == "all"), key=lambda p: p.k)
            lines += [f"### {name} ({counts[name]})", "", "| k | quality [95% CI] | first-k |", "|---|---|---|"]
            lines += [f"| {p.k} | {p.mean:.4f} [{p.ci_low:.4f}, {p.ci_high:.4f}] | {p.first_k_mean:.4f} |"
                      for p in rows]
            lines.append("")
        write_report_files(self.out, "bon", markdown="\n".join(lines) + "\n")
        return {"curves": {n: [p.__dict__ for p in pts] for n, pts in curves.items()}, "counts": counts}


def run_bon(recipe: Recipe, address: str | None = None, log: Any = print) -> dict[str, Any]:
    """`pr-rlhf bon`: the recipe's synthetic world built into the sweep's shards when absent, Ray joined at
    ``address`` (else a local Ray), the sweep (resumed when killed), its metrics in one mlflow run; returns the
    sweep's report (``<bon.out>/bon.md`` holds its tables)."""

    from pr_rlhf.actors import bon_groups, cpus_needed
    from pr_rlhf.tracking import make_tracker
    from workers.ray_utils import check_resources, start_driver

    cfg = recipe.bon
    if cfg is None:
        raise ValueError("the recipe has no bon: section")
    start_driver(address, max(2, cpus_needed(bon_groups(cfg))), shards=cfg.shards, world=cfg.world, log=log)
    check_resources(recipe, "bon", log=log)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    report = BoNSweep(cfg, seed=recipe.seed, log=log).run()
    with make_tracker(recipe.tracking, cfg.out, f"{recipe.name}/bon", tags={"stage": "bon"}) as tracker:
        tracker.log_params({"n": cfg.n, "prompts": cfg.prompts, "reward_models": ",".join(cfg.reward_models)})
        for metrics in report["metrics"].values():
            tracker.log_metrics(metrics)
    return report
