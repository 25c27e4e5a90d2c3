"""`pr-rlhf leaderboard RECIPE`: the embedding methods trained on each world's seen users (one Ray task per method),
scored on the world's evaluation pairs through reward pools (each method is a reward kind), beside the world's
reference predictors and reused committed outcomes (P-GenRM's), in one table (``pr_rlhf.leaderboard.board``).

Under ``<out>``: ``w<seed>/`` per world (``train.npz``: the training pairs' embeddings; ``models/<method>/``, each
COMPLETE when trained; ``arms/<method>.json``: its per-pair outcomes and seconds; ``outcomes.json``: every row's
per-pair outcomes with user ids; ``bt_rm/``: the fine-tuned BT RMs' shards and one folder per input mode, as
`pr-rlhf train-rm` writes them), then ``leaderboard.{json,md,png}`` over the reported worlds and
``development.{json,md,png}`` over the development worlds, and ``few_shot{,_development}.{json,md,png}`` (the
cold-start users' curve; per-pair outcomes in ``w<seed>/few_shot.json``). A rerun redoes nothing that
is there: a trained model, a scored method.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pr_rlhf.actors import (
    LEADERBOARD_SERVICE_CPUS,
    cpus_needed,
    leaderboard_bt_reward,
    leaderboard_groups,
    leaderboard_model_reward,
)
from pr_rlhf.configs.leaderboard import LeaderboardConfig
from pr_rlhf.eval.worlds import WorldOutcomes
from pr_rlhf.files import atomic_write_text, is_complete, mark_complete
from pr_rlhf.leaderboard import board as table
from pr_rlhf.leaderboard.data import (
    Item,
    embed_training,
    evaluation_items,
    first_pairs,
    first_users,
    reference_outcomes,
    training_pairs,
    with_profiles,
)
from pr_rlhf.world import build_world

LABELS = {"bt_embedding": "global BT (embeddings)", "pal": "PAL", "lore": "LoRe", "vpl": "VPL", "gpo": "GPO",
          "oracle": "Bayes oracle (3 pairs)", "logistic_regression": "per-user LR (3 pairs)",
          "no_history": "prior only (no pairs)", "oracle@all": "Bayes oracle (seen: all train pairs)",
          "logistic_regression@all": "per-user LR (seen: all train pairs)",
          "pgenrm_psi": "P-GenRM PSI (SFT)", "pgenrm_cre": "P-GenRM CRE (GRPO)",
          "pgenrm_full": "P-GenRM full pipeline", "pgenrm_psi_scaled": "P-GenRM PSI + scaling (m 16, n 8)",
          "bt_none": "fine-tuned BT RM (no user information)", "bt_history": "fine-tuned BT RM + preference history",
          "bt_profile": "fine-tuned BT RM + retrieved profile posts"}


def _train_task(data_file: str, method: str, hyper: dict, settings: dict, folder: str, embedder: str) -> dict:
    """Train one method on one world's training pairs (a Ray task: module-level so that it pickles by name)."""
    import torch

    from pr_rlhf.embedrm.methods import Context
    from pr_rlhf.embedrm.train import PairData, TrainSettings, save_method, train_method

    torch.set_num_threads(1)
    data = np.load(data_file, allow_pickle=False)
    users = [str(u) for u in data["users"]]
    contexts: dict[str, Context] = {}
    for user in dict.fromkeys(users):
        rows = [i for i, u in enumerate(users) if u == user]
        contexts[user] = Context(torch.from_numpy(data["chosen"][rows]), torch.from_numpy(data["rejected"][rows]))
    start = time.perf_counter()
    model = train_method(method, PairData(contexts), TrainSettings(**settings), **hyper)
    seconds = time.perf_counter() - start
    save_method(model, folder, extra={"embedder": embedder, "train_s": seconds})
    mark_complete(folder)
    return {"train_s": seconds}


class Leaderboard:
    def __init__(self, cfg: LeaderboardConfig, log: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.log = log
        self._embedder = None
        self._last_score_s = 0.0
        self.labels = {**LABELS, **{name: row.label for name, row in cfg.models.items() if row.label}}

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            from pr_rlhf.models.embedders import make_embedder

            self._embedder = make_embedder(self.cfg.embedder, cache_dir=self.out / "embeddings")
        return self._embedder

    # -- one world -------------------------------------------------------------------------------------------
    def world_config(self, seed: int, **changes: Any):
        return self.cfg.world.model_copy(update={"seed": seed, **changes})

    def run_world(self, seed: int) -> WorldOutcomes:
        folder = self.out / f"w{seed}"
        world = build_world(self.world_config(seed))
        items = evaluation_items(world)
        outcomes = self._frame(seed, items)
        few = self._few_shot_sets(seed)
        arms, costs = self._methods(f"world {seed}", folder, items, lambda: training_pairs(world), few, seed)
        arms.update(self._models(folder, items, costs, few, seed))
        arms.update(self._bt_rms(f"w{seed}", folder, items, costs, few, seed))
        rows = {**arms, **reference_outcomes(world, self.cfg.references), **self._reused(seed)}
        users = {it.pair_id: it.user_id for it in items}
        for name, per_pair in rows.items():
            outcomes.add_arm(name, {p: v for p, v in per_pair.items() if p in users}, users)
        outcomes.meta = {"costs": costs, "world": self.world_config(seed).model_dump(mode="json")}
        outcomes.save(folder / "outcomes.json")
        self.log(f"world {seed}: {len(items)} evaluation pairs, rows: {', '.join(outcomes.arms)}")
        return outcomes

    def _frame(self, seed: int, items: list[Item]) -> WorldOutcomes:
        """The world's evaluation pairs; where a reused file exists, in its order with its contested flags (the
        pairs must be the same: the world is rebuilt from the same settings)."""
        for name, spec in self.cfg.reuse.items():
            path = Path(spec.split(":", 1)[0].format(world=seed))
            if path.is_file():
                known = WorldOutcomes.load(path)
                if sorted(known.pairs) != sorted(it.pair_id for it in items):
                    raise ValueError(f"reuse.{name}: {path} holds other evaluation pairs than world {seed} (is "
                                     "leaderboard.world the world of that study?)")
                return WorldOutcomes(seed, known.pairs, known.users, known.groups, known.contested)
        return WorldOutcomes(seed, [it.pair_id for it in items], [it.user_id for it in items],
                             [it.group for it in items], [False] * len(items))

    def _reused(self, seed: int) -> dict[str, dict[str, float]]:
        out = {}
        for name, spec in self.cfg.reuse.items():
            file, arm = spec.split(":", 1)
            path = Path(file.format(world=seed))
            if not path.is_file():
                continue
            known = WorldOutcomes.load(path)
            if arm not in known.arms:   # that study did not run it in this world: the row is absent here
                self.log(f"world {seed}: reuse.{name}: {path} has no arm {arm!r}; no such row in this world")
                continue
            out[name] = {p: v for p, v in zip(known.pairs, known.arms[arm]) if v is not None}
        return out

    def _methods(self, where: str, folder: Path, items: list[Item], training: Callable[[], list],
                 few: dict[str, list[Item]], seed: int | None) -> tuple[dict, dict]:
        """Each method trained (unless COMPLETE) on the ``training()`` pairs, then scored (unless scored) on the
        evaluation pairs and, through the same pool, on the few-shot sets."""
        arms: dict[str, dict[str, float]] = {}
        costs: dict[str, dict[str, float]] = {}
        todo = [m for m in self.cfg.methods if not is_complete(folder / "models" / m)]
        if todo:
            self._train(where, folder, todo, training)
        for method in self.cfg.methods:
            saved = self._score_row(folder, method, items, few, seed, lambda sets, m=method: self.method_config(
                m, folder / "models" / m, sets))
            config = json.loads((folder / "models" / method / "config.json").read_text())
            arms[method] = self._with_failures(method, saved, items)
            costs[method] = {"train_s": config.get("train_s", float("nan")), "score_s": saved["score_s"]}
        return arms, costs

    def _models(self, folder: Path, items: list[Item], costs: dict, few: dict[str, list[Item]],
                seed: int | None) -> dict[str, dict[str, float]]:
        """The recipe's other reward models (``models``: any kind) scored once each on the pairs of the worlds (or
        sets) they are listed for, and through the same pool on the few-shot sets."""
        arms = {}
        for name, row in self.cfg.models.items():
            if (seed is None and not row.datasets) or (seed is not None and row.worlds is not None
                                                       and seed not in row.worlds):
                continue
            main = [it if it.group != "seen" or row.seen_history is None else
                    replace(it, history=it.history[:row.seen_history])
                    for it in first_pairs(first_users(items, row.users_per_group), row.pairs_per_user)]
            sets = {key: first_users(its, row.users_per_group) for key, its in few.items()} if row.few_shot else {}
            saved = self._score_row(folder, name, main, sets, seed, lambda _, n=name: leaderboard_model_reward(
                self.cfg, n, seed))
            arms[name] = self._with_failures(name, saved, main)
            costs[name] = {"score_s": saved["score_s"]}
        return arms

    def _bt_rms(self, where: str, folder: Path, items: list[Item], costs: dict, few: dict[str, list[Item]],
                seed: int | None, shards: str | None = None) -> dict[str, dict[str, float]]:
        """The fine-tuned BT RMs (``bt_rm``): each input mode's scalar RM trained on the training pairs of the world
        ``seed`` (its shards built under ``folder``) or of a real set's ``shards`` by `pr-rlhf train-rm`'s trainer
        (unless COMPLETE), then scored like a model row (``bt_history`` also on the few-shot sets; ``bt_none`` reads
        no pairs; ``bt_profile`` the posts its shards retrieved for each pair, whatever k)."""
        bt = self.cfg.bt_rm
        if bt is None:
            return {}
        from data_pipelines.build import ensure_world_shards
        from pr_rlhf.configs.recipe import Recipe
        from workers.rm_training import RMTrainer

        out = folder / "bt_rm"
        rm = bt.model_copy(update={"shards": shards or str(out / "data"), "out": str(out), "world": None})
        if shards is None:
            ensure_world_shards(rm.shards, self.world_config(seed), log=self.log)

        def progress(mode: str, step: int, steps: int, metrics: dict) -> None:
            if step % rm.checkpoint_every == 0 or step == steps:
                loss = metrics.get("rm/bt_loss", float("nan"))
                self.log(f"{where}: bt_{mode} step {step}/{steps}, BT loss {loss:.3f}")

        trainer = RMTrainer(Recipe(name=f"leaderboard_bt_{where}", seed=self.cfg.seed, rm=rm), on_step=progress,
                            log=self.log)
        arms = {}
        for mode in bt.input_modes:
            name, timing = f"bt_{mode}", out / mode / "train_s.json"
            if not is_complete(out / mode / "model"):
                start = time.perf_counter()
                trainer.train(mode)
                atomic_write_text(timing, json.dumps({"train_s": time.perf_counter() - start}))
            model = str(out / mode / "model")
            shown = with_profiles(items, rm.shards) if mode == "profile" else items
            saved = self._score_row(folder, name, shown, few if mode == "history" else {}, seed,
                                    lambda _, m=mode, d=model: leaderboard_bt_reward(self.cfg, m, d))
            arms[name] = self._with_failures(name, saved, items)
            trained = json.loads(timing.read_text())["train_s"] if timing.is_file() else float("nan")
            costs[name] = {"train_s": trained, "score_s": saved["score_s"]}
        return arms

    def _score_row(self, folder: Path, name: str, main: list[Item], few: dict[str, list[Item]], seed: int | None,
                   config: Callable[[dict[str, list[Item]]], Any]) -> dict:
        """Row ``name`` scored, unless it was, on ``main`` and on each few-shot set it has no record of, through one
        pool hosting ``config(sets)``; returns its saved result on ``main``."""
        path, few_path = folder / "arms" / f"{name}.json", folder / "few_shot.json"
        records = json.loads(few_path.read_text()) if few_path.is_file() else []
        have = {(r["method"], r["k"]) for r in records}
        sets = {} if path.is_file() else {"main": main}
        sets.update({key: its for key, its in few.items() if (name, int(key[1:])) not in have})
        if sets:
            scored = self.score_sets(config(sets), sets)
            if "main" in scored:
                atomic_write_text(path, json.dumps(scored.pop("main")))
            records += [self._few_shot_record(seed, name, int(key[1:]), sets[key], result)
                        for key, result in scored.items()]
            if scored:
                atomic_write_text(few_path, json.dumps(records))
            self.log(f"{folder.name}: scored {name}")
        return json.loads(path.read_text())

    def _with_failures(self, row: str, saved: dict, items: list[Item]) -> dict[str, float]:
        """A row's outcomes on every pair, a pair it failed to score as a coin flip (counted in the log and in the
        row's arms file, ``errors``)."""
        if saved.get("errors"):
            self.log(f"{row}: {saved['errors']} of {len(items)} pairs unscored, counted as coin flips")
        return table.with_coin_flips(saved["outcomes"], [it.pair_id for it in items])

    def _train(self, where: str, folder: Path, methods: list[str], training: Callable[[], list]) -> None:
        import ray

        data = folder / "train.npz"
        if not data.is_file():
            pairs = embed_training(training(), self.embedder)
            chosen, rejected, index = pairs.flat()
            users = np.array([pairs.users[i] for i in index.tolist()])
            folder.mkdir(parents=True, exist_ok=True)
            np.savez(folder / "train_tmp.npz", users=users, chosen=chosen.numpy(), rejected=rejected.numpy())
            (folder / "train_tmp.npz").replace(data)
        settings = self.cfg.train.model_dump() | {"seed": self.cfg.seed}
        training = next(g for g in leaderboard_groups(self.cfg) if g.phase == "leaderboard training")
        task = ray.remote(**training.options())(_train_task)
        refs = {m: task.remote(str(data), m, self.cfg.methods[m], settings, str(folder / "models" / m),
                               self.cfg.embedder) for m in methods}
        for method, ref in refs.items():
            self.log(f"{where}: trained {method} in {ray.get(ref)['train_s']:.1f} s")

    def method_config(self, method: str, model: Path, sets: dict[str, list[Item]]) -> Any:
        """The reward kind of a trained embedding method, reading every history pair an item carries."""
        from pr_rlhf.configs.reward import reward_config

        longest = max([len(it.history) for items in sets.values() for it in items] + [0])
        return reward_config(kind=method, model=str(model), embedder=self.cfg.embedder,
                             pool=self.cfg.pool.model_dump(), history_pairs=max(longest, 1))

    def score_sets(self, cfg: Any, sets: dict[str, list[Item]]) -> dict[str, dict[str, Any]]:
        """Each set's ``pair id -> 1 / 0.5 / 0`` (the chosen response's reward above, equal to, below the rejected
        one's), the pairs whose scoring failed (left out) and the seconds it took, through one reward pool hosting
        ``cfg``. Each response is scored apart; a GenRM that compares a response with a reference scores the pair in
        both orders (each response against the other) and compares the two responses' own scores."""
        from pr_rlhf.scorers import RewardRequest
        from workers.reward import RewardPool

        both_orders = getattr(cfg, "compares_with_reference", False)
        out = {}
        with RewardPool(cfg) as pool:
            for key, items in sets.items():
                requests = [RewardRequest(f"{it.pair_id}|{side}", it.user_id, it.question, text,
                                          {"history": it.history, "retrieved": it.profile,
                                           **({"reference": other} if both_orders else {})})
                            for it in items for side, text, other in (("c", it.chosen, it.rejected),
                                                                      ("r", it.rejected, it.chosen))]
                start = time.perf_counter()
                results = {r.request_id: r for r in pool.score(requests)}
                seconds = time.perf_counter() - start
                outcome, errors = {}, 0
                for it in items:
                    c, r = results[f"{it.pair_id}|c"], results[f"{it.pair_id}|r"]
                    if c.score is None or r.score is None:
                        errors += 1
                        continue
                    outcome[it.pair_id] = 1.0 if c.score > r.score else 0.0 if c.score < r.score else 0.5
                out[key] = {"outcomes": outcome, "errors": errors, "score_s": seconds}
        return out

    # -- a real pair set ---------------------------------------------------------------------------------------
    def run_dataset(self, name: str) -> WorldOutcomes:
        from pr_rlhf.leaderboard.data import shard_dataset

        spec = self.cfg.datasets[name]
        folder = self.out / "datasets" / name
        training, items, units = shard_dataset(spec.shards, spec.history_pairs, spec.cluster)
        outcomes = WorldOutcomes(0, [it.pair_id for it in items], [it.user_id for it in items],
                                 [it.group for it in items], [False] * len(items),
                                 clusters=units if spec.cluster != "user" else None)
        arms, costs = self._methods(f"dataset {name}", folder, items, lambda: training, {}, None)
        arms.update(self._models(folder, items, costs, {}, None))
        arms.update(self._bt_rms(f"dataset_{name}", folder, items, costs, {}, None, shards=spec.shards))
        users = {it.pair_id: it.user_id for it in items}
        for method, per_pair in arms.items():
            outcomes.add_arm(method, per_pair, users)
        outcomes.meta = {"costs": costs, "dataset": name, "shards": spec.shards, "licence": spec.licence,
                         "cluster": spec.cluster, "history_pairs": spec.history_pairs}
        outcomes.save(folder / "outcomes.json")
        self.dataset_table(name, outcomes)
        self.log(f"dataset {name}: {len(items)} evaluation pairs, {len(training)} training pairs")
        return outcomes

    def dataset_table(self, name: str, outcomes: WorldOutcomes) -> dict[str, Any]:
        """``datasets/<name>.{json,md,png}``: the set's table from its per-pair outcomes (every arm a row, in order;
        ``meta``: its costs and the set's description)."""
        spec = self.cfg.datasets[name]
        rows, costs = list(outcomes.arms), outcomes.meta.get("costs", {})
        result = table.build_board([outcomes], rows, baseline=self.cfg.baseline if self.cfg.baseline in rows
                                   else None, against=None, n_bootstrap=self.cfg.n_bootstrap, seed=self.cfg.seed,
                                   costs=costs)
        result["dataset"] = {k: v for k, v in outcomes.meta.items() if k != "costs"}
        atomic_write_text(self.out / "datasets" / f"{name}.json", json.dumps(result, indent=1) + "\n")
        unit = "queries" if spec.cluster == "query" else "users"
        atomic_write_text(self.out / "datasets" / f"{name}.md", table.markdown(
            result, self.labels, f"{name} (licence: {spec.licence or 'see the source'})", unit=unit,
            scope=f"{len(outcomes.pairs)} evaluation pairs of {len(set(outcomes.users))} users"))
        table.plot(result, self.out / "datasets" / f"{name}.png", self.labels)
        return result

    # -- few-shot ----------------------------------------------------------------------------------------------
    def _few_shot_sets(self, seed: int) -> dict[str, list[Item]]:
        """``k<k> -> items``: the cold-start users' test pairs of the world whose cold users have
        ``cold_start_history`` train pairs, each given its first k (the seen users are the same as the world's:
        the methods trained on it serve)."""
        fs = self.cfg.few_shot
        if fs is None:
            return {}
        world = build_world(self.world_config(seed, cold_start_history=fs.cold_start_history))
        return {f"k{k}": [it for it in evaluation_items(world, cold_history=k) if it.group == "cold"] for k in fs.ks}

    def _few_shot_record(self, seed: int, method: str, k: int, items: list[Item], result: dict) -> dict[str, Any]:
        record = table.few_shot_record(seed, method, k, {it.pair_id: it.user_id for it in items}, result["outcomes"],
                                       n_bootstrap=self.cfg.n_bootstrap, seed=self.cfg.seed)
        failed = f" ({record['unscored']} of {record['pairs']} unscored: coin flips)" if record["unscored"] else ""
        self.log(f"world {seed} few-shot: {method} k={k} {100 * record['accuracy']:.1f}%{failed}")
        return record

    def service_few_shot(self, seed: int) -> list[dict[str, Any]]:
        """The few-shot curve through the running reward service (``few_shot.service`` methods): each cold-start
        user's pairs arrive as ``/feedback`` one k after the other, and after each k the user's test pairs are scored
        through ``/score``, which reads the stored pairs (nothing in the request); each verdict beside the offline
        curve's (the same model and pairs: they must agree)."""
        from concurrent.futures import ThreadPoolExecutor

        from ray import serve

        from pr_rlhf.configs.reward import reward_config
        from pr_rlhf.configs.serve import ServeConfig, UserStoreConfig
        from pr_rlhf.serve.client import ServiceClient
        from pr_rlhf.serve.users import sqlite_url
        from workers.learner.ranks import free_port
        from workers.reward_service import deploy

        fs = self.cfg.few_shot
        folder = self.out / f"w{seed}"
        path = folder / "few_shot_service.json"
        if path.is_file():
            return json.loads(path.read_text())
        sets = self._few_shot_sets(seed)
        items = sets[f"k{max(fs.ks)}"]
        pairs_of = {it.user_id: it.history for it in items}          # each cold user's pairs, in order
        offline = {(r["method"], r["k"]): r["outcomes"] for r in self.few_shot(seed)}
        records, port = [], free_port()
        for method in fs.service:
            for old in folder.glob(f"service_{method}.sqlite*"):
                old.unlink()
            reward = reward_config(kind=method, model=str(folder / "models" / method), embedder=self.cfg.embedder,
                                   history_pairs=max(fs.ks))
            base = deploy(ServeConfig(reward=reward, port=port, name=f"few_shot_{method}",
                                      route_prefix=f"/{method}", num_cpus=LEADERBOARD_SERVICE_CPUS,
                                      users=UserStoreConfig(url=sqlite_url(folder / f"service_{method}.sqlite"),
                                                            history_pairs=max(fs.ks), embedder=None,
                                                            profile_items=0)))
            client = ServiceClient(base, seed=self.cfg.seed)
            sent = 0
            try:
                with ThreadPoolExecutor(fs.clients) as pool:
                    for k in sorted(fs.ks):
                        def send(user: str, start: int = sent, stop: int = k) -> None:
                            for i in range(start, stop):   # one user's pairs in order, as one person sends them
                                h = pairs_of[user][i]
                                client.post("/feedback", {"user_id": user, "query": h["question"],
                                                          "chosen": h["chosen"], "rejected": h["rejected"],
                                                          "idempotency_key": f"{user}-{i}"})

                        list(pool.map(send, sorted(pairs_of)))
                        sent = k

                        def score(it: Item) -> float:
                            body = client.post("/score", {"user_id": it.user_id, "query": it.question,
                                                          "responses": [it.chosen, it.rejected]})
                            first, second = body["scores"]
                            return 1.0 if first > second else 0.0 if first < second else 0.5

                        outcome = dict(zip((it.pair_id for it in items), pool.map(score, items)))
                        expected = offline.get((method, k), {})
                        agree = sum(outcome[p] == v for p, v in expected.items())
                        records.append(self._few_shot_record(seed, method, k, items, {"outcomes": outcome,
                                                                                      "errors": 0}))
                        records[-1].update({"route": "service", "agreement": agree,
                                            "compared": len(expected)})
                        self.log(f"world {seed} service k={k}: {method} agrees with the offline curve on "
                                 f"{agree} of {len(expected)} pairs")
            finally:
                client.close()
                serve.delete(f"few_shot_{method}")
        serve.shutdown()
        atomic_write_text(path, json.dumps(records))
        return records

    def few_shot(self, seed: int) -> list[dict[str, Any]]:
        path = self.out / f"w{seed}" / "few_shot.json"
        return json.loads(path.read_text()) if path.is_file() else []

    # -- everything --------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        for name in self.cfg.datasets:
            self.run_dataset(name)
        reported = [self.run_world(s) for s in self.cfg.worlds]
        development = [self.run_world(s) for s in self.cfg.development_worlds]
        rows = list(dict.fromkeys(r for w in reported + development for r in w.arms))
        out = {}
        for name, worlds in (("leaderboard", reported), ("development", development)):
            if not worlds:
                continue
            costs: dict[str, dict[str, float]] = {}   # seconds per world, averaged over the board's worlds
            for w in worlds:
                for row, c in w.meta.get("costs", {}).items():
                    for key, value in c.items():
                        costs.setdefault(row, {}).setdefault(key, 0.0)
                        costs[row][key] += value / len(worlds)
            result = table.build_board(worlds, rows, baseline=self.cfg.baseline, against=self.cfg.against,
                                       n_bootstrap=self.cfg.n_bootstrap, seed=self.cfg.seed, costs=costs)
            atomic_write_text(self.out / f"{name}.json", json.dumps(result, indent=1) + "\n")
            title = "Leaderboard" if name == "leaderboard" else "Development worlds (settings chosen here)"
            atomic_write_text(self.out / f"{name}.md", table.markdown(result, self.labels, title))
            table.plot(result, self.out / f"{name}.png", self.labels)
            out[name] = result
        if self.cfg.few_shot is not None:
            for name, seeds in (("few_shot", self.cfg.worlds), ("few_shot_development", self.cfg.development_worlds)):
                rows_fs = [r for s in seeds for r in self.few_shot(s)]
                if not rows_fs:
                    continue
                frames = table.few_shot_frames(rows_fs)
                for frame in frames:   # every k's per-pair outcomes with user ids, one file per world
                    frame.save(self.out / f"w{frame.world}" / "few_shot_outcomes.json")
                curve = table.few_shot_board(frames, self.cfg.n_bootstrap, self.cfg.seed)
                atomic_write_text(self.out / f"{name}.json", json.dumps(curve, indent=1) + "\n")
                atomic_write_text(self.out / f"{name}.md", table.few_shot_markdown(curve, self.labels))
                table.few_shot_plot(curve, self.out / f"{name}.png", self.labels)
                out[name] = curve
            service = [r for s in self.cfg.few_shot.service_worlds for r in self.service_few_shot(s)]
            if service:
                summary = [{k: v for k, v in r.items() if k not in ("outcomes", "users_of")} for r in service]
                atomic_write_text(self.out / "few_shot_service.json", json.dumps(summary, indent=1) + "\n")
                out["few_shot_service"] = summary
        return out


def run_leaderboard(recipe: Any, address: str | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    from workers.ray_utils import check_resources, start_driver

    cfg = recipe.leaderboard
    start_driver(address, max(2, cpus_needed(leaderboard_groups(cfg))))
    check_resources(recipe, "leaderboard", log=log)
    return Leaderboard(cfg, log).run()
