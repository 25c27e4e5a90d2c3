"""`pr-rlhf scaling`: the test-time scaling grid of a trained GenRM as a Ray task (docs/protocols.md section 4).

The task loads the GenRM and the embedder once, builds (or loads) the user prototypes from the seen users'
persona texts, gathers each evaluated pair's evidence once for the largest (m, n) of the grid, and reads every grid
point from it. Writes ``<out>/prototypes/`` (artifacts), ``<out>/scaling_grid.{md,json,png}``, every pair's outcome
per point with its user (``scaling_grid_pairs.json``, to re-analyse) and one mlflow run.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from pr_rlhf.configs.recipe import Recipe
from pr_rlhf.configs.scaling import ScalingEvalConfig
from pr_rlhf.threads import set_torch_threads


def build_prototypes(cfg: ScalingEvalConfig, engine: Any, embedder: Any, seed: int, out: Path,
                     log: Any = print) -> tuple[Any, dict[str, list[dict]], dict[str, Any]]:
    """(index, member histories, info): the persona of each seen user (the GenRM's greedy chain on one of their
    train pairs), K-means into k prototypes refined on the users' history triples; loaded instead when the
    artifacts exist for this embedder."""
    from pr_rlhf.scaling.build import build_index
    from pr_rlhf.scaling.embedding import embed_personas, embedder_name, placement_text, profile_vectors
    from pr_rlhf.scaling.grid import member_histories, profile_posts
    from pr_rlhf.scaling.index import PrototypeIndex
    from pr_rlhf.scaling.kmeans import explained_variance
    from pr_rlhf.scaling.refine import UserHistory
    from pr_rlhf.scaling.scorer import ScaledJudge

    pcfg = cfg.scaling.prototypes
    histories, persona_inputs = member_histories(cfg.shards, cfg.seen_history_pairs)
    path = Path(pcfg.path) if pcfg.path else out / "prototypes"
    name = embedder_name(embedder)
    if (path / "prototypes.json").is_file():
        log(f"prototypes: loading {path}")
        index = PrototypeIndex.load(path, expected_embedder=name)
        return index, histories, {"prototypes": str(path), "embedder": index.embedder,
                                  "member_users": len(index.user_ids), "k": index.k, "loaded": True}
    if pcfg.placement == "profile":   # members placed by their posts, as the users looked up will be
        profiles = profile_vectors(profile_posts(cfg.shards), embedder)
        users = [ev.user_id for ev in persona_inputs if ev.user_id in profiles]
        texts = None
        vectors = np.stack([profiles[u] for u in users]) if users else np.zeros((0, 1), np.float32)
        log(f"prototypes: {len(users)} of {len(persona_inputs)} member users placed by their profile posts")
    else:
        judge = ScaledJudge(engine, cfg.scaling.model_copy(update={"m": 0, "n": 0}), seed=seed)
        evidence = judge.evidence(persona_inputs)
        users = [ev.user_id for ev in evidence if ev.greedy.personas]
        texts = [placement_text(ev.greedy.personas[0], pcfg.placement) for ev in evidence if ev.greedy.personas]
        log(f"prototypes: {len(users)} of {len(evidence)} member users have a parsed persona ({pcfg.placement})")
        vectors = embed_personas(texts, embedder) if texts else np.zeros((0, 1), np.float32)
    if len(users) < pcfg.k:
        raise ValueError(f"only {len(users)} of {len(persona_inputs)} member users can be placed "
                         f"({pcfg.placement}), fewer than scaling.prototypes.k={pcfg.k}: is {cfg.model} a trained "
                         f"GenRM?")
    variance = explained_variance(vectors, pcfg.candidate_ks, seed=seed)
    refine = None
    user_histories = None
    if pcfg.refine.steps > 0:
        refine = pcfg.refine.model_copy(update={"seed": seed})
        user_histories = user_history_embeddings(users, histories, embedder, UserHistory)
    index = build_index(users, texts, embedder, pcfg.k, seed, histories=user_histories, refine_cfg=refine,
                        vectors=vectors if texts is None else None, placement=pcfg.placement)
    index.save(path)
    info = {"prototypes": str(path), "embedder": index.embedder, "member_users": len(users), "k": pcfg.k,
            "explained_variance": {str(k): round(v, 4) for k, v in variance.items()}}
    log(f"prototypes: k={pcfg.k}, explained variance by k {info['explained_variance']} -> {path}")
    return index, histories, info


def user_history_embeddings(users: list[str], histories: dict[str, list[dict]], embedder: Any,
                            cls: Any) -> list[Any]:
    """Each user's history triples embedded (question, chosen, rejected): one encoder call per field for all users
    together (one call per user and field would be 3 x users small batches)."""
    from pr_rlhf.scaling.embedding import embed_personas

    sizes = [len(histories[u]) for u in users]
    fields = {key: embed_personas([t[key] for u in users for t in histories[u]], embedder)
              for key in ("question", "chosen", "rejected")}
    ends = np.cumsum(sizes)
    return [cls(u, *(fields[key][end - size:end] for key in ("question", "chosen", "rejected")))
            for u, size, end in zip(users, sizes, ends)]


PAIRS_FILE = "scaling_grid_pairs.json"   # per (m, n): every pair's outcome with its user


def run_grid(cfg_json: str, seed: int, threads: int) -> dict[str, Any]:
    """The whole grid in this process (a Ray task): both user groups, one engine, one embedder."""
    from tqdm import tqdm

    from pr_rlhf.configs.base import engine_config
    from pr_rlhf.eval.groups import EVAL_GROUPS
    from pr_rlhf.models import make_engine
    from pr_rlhf.models.embedders import make_embedder
    from pr_rlhf.scaling.grid import grid_rows, group_inputs, pair_records
    from pr_rlhf.scaling.scorer import ScaledJudge, failure_counts

    set_torch_threads(threads)
    cfg = ScalingEvalConfig.model_validate_json(cfg_json)
    out = Path(cfg.out)
    engine = make_engine(engine_config(backend="hf", model=cfg.model, seed=seed))
    embedder = make_embedder(cfg.scaling.prototypes.embedder, cache=False)
    big_m, big_n = cfg.largest
    t0 = time.perf_counter()
    index, histories, info = build_prototypes(cfg, engine, embedder, seed, out, log=tqdm.write) if big_n > 0 \
        else (None, {}, {})
    info["prototype_seconds"] = round(time.perf_counter() - t0, 1)
    profiles = {}
    if big_n > 0 and cfg.scaling.prototypes.placement == "profile":
        from pr_rlhf.scaling.embedding import profile_vectors
        from pr_rlhf.scaling.grid import profile_posts

        profiles = profile_vectors(profile_posts(cfg.shards), embedder)
    judge = ScaledJudge(engine, cfg.scaling.model_copy(update={"m": big_m, "n": big_n}), seed=seed,
                        index=index, embedder=embedder, histories=histories, profiles=profiles)
    rows, failures, seconds, pairs = [], {}, {}, {}
    for group in EVAL_GROUPS:
        inputs = group_inputs(cfg, group, seed)
        t0 = time.perf_counter()
        evidence = []
        for start in tqdm(range(0, len(inputs), 16), desc=f"scaling {group}", unit="x16 pairs"):
            evidence += judge.evidence(inputs[start:start + 16], greedy=True)
        seconds[group] = round(time.perf_counter() - t0, 1)
        failures[group] = failure_counts(evidence)
        rows += grid_rows(group, evidence, cfg.points, cfg.scaling.self_weight, cfg.scaling.neighbour_weight,
                          cfg.n_bootstrap, seed, cfg.scaling.certainty_weighting)
        for point, records in pair_records(group, evidence, cfg.points, cfg.scaling.self_weight,
                                           cfg.scaling.neighbour_weight, cfg.scaling.certainty_weighting).items():
            pairs.setdefault(point, []).extend(records)
    engine.close()
    info.update({"placement": cfg.scaling.prototypes.placement,
                 "certainty_weighting": cfg.scaling.certainty_weighting})
    return {"rows": [r.as_dict() for r in rows], "failures": failures, "seconds": seconds, "pairs": pairs, **info}


def run_scaling(recipe: Recipe, address: str | None = None, log: Any = print) -> dict[str, Any]:
    """`pr-rlhf scaling`: the recipe's synthetic world built into its shards when absent, Ray joined at ``address``
    (else a local Ray, unless one is up), the grid as a Ray task, its report, its mlflow run."""

    import ray

    from pr_rlhf.actors import cpus_needed, scaling_groups
    from pr_rlhf.pgenrm.report import world_references
    from pr_rlhf.scaling.grid import GridRow, write_grid_report
    from pr_rlhf.tracking import make_tracker
    from pr_rlhf.world.generator import build_world
    from pr_rlhf.world.reference import reference_accuracies
    from workers.ray_utils import check_resources, start_driver

    cfg = recipe.scaling
    if cfg is None:
        raise ValueError("the recipe has no scaling: section")
    (grid_task,) = scaling_groups(cfg)
    start_driver(address, max(2, cpus_needed([grid_task])), shards=cfg.shards, world=cfg.world, log=log)
    check_resources(recipe, "scaling", log=log)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    task = ray.remote(**grid_task.options())(run_grid)
    result = ray.get(task.remote(cfg.model_dump_json(), recipe.seed, cfg.torch_threads))
    world = build_world(cfg.world)
    refs = {"seen": world_references(world, cfg.seen_history_pairs)["seen"],
            "cold": {k: v.as_dict() for k, v in reference_accuracies(
                world, cfg.cold_history_pairs, users="cold_start", splits=("test",)).items()}}
    rows = [GridRow(**r) for r in result["rows"]]
    (out / PAIRS_FILE).write_text(json.dumps(result["pairs"], separators=(",", ":")) + "\n")
    extra = {k: v for k, v in result.items() if k not in ("rows", "failures", "pairs")}
    md, png = write_grid_report(out, rows, refs, result["failures"], extra)
    tracker = make_tracker(recipe.tracking, out, f"{recipe.name}/scaling", tags={"stage": "scaling"})
    with tracker:
        tracker.log_params({"model": cfg.model, "points": json.dumps(cfg.points)})
        tracker.log_metrics({f"scaling/{r.group}/m{r.m}_n{r.n}": r.accuracy for r in rows})
    return {"markdown": str(md), "figure": str(png), "rows": rows, "references": refs, **extra}
