"""P-GenRM over several synthetic worlds: every arm's per-pair outcomes in one table per world, and the
pre-registered pooled analysis (docs/results/pgenrm_worlds/PREREGISTRATION.md).

One world is one draw of users, pairs and training noise, so a claim about a mechanism pools several. For an
endpoint ``new - old`` on one group of pairs (seen / cold, all / contested):

- per world: the mean paired difference over the pairs both arms judged, with a 95% bootstrap CI that resamples
  the world's **users** (a user's pairs share one history and move together);
- pooled, **fixed effect** (the primary): the inverse-variance weighted mean of the worlds' differences (each
  world's variance from its own user bootstrap), its CI from the same bootstrap **stratified by world** (users
  resampled within each world, the weights held fixed);
- beside it, **random effects** (DerSimonian-Laird): the between-world variance tau^2, the pooled mean under it
  with a normal CI, Cochran's Q and I^2 (the share of the spread that is heterogeneity rather than noise).

With four worlds tau^2 is poorly determined; the fixed-effect estimate answers "what did these worlds show", the
random-effects one "what would a new world show", and a large I^2 says the two differ.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pr_rlhf.stats import CI_LEVEL, cluster_ids, seeded_rng

OUTCOMES_FILE = "outcomes.json"
Z = 1.959963984540054   # the normal quantile of a two-sided 95% interval


@dataclass
class WorldOutcomes:
    """One world's evaluation pairs (seen and cold-start) and each arm's 1 / 0 per pair (None: not judged)."""

    world: int
    pairs: list[str]
    users: list[str]
    groups: list[str]                 # "seen" | "cold"
    contested: list[bool]             # the types consistent with the pair's evidence disagree
    arms: dict[str, list[float | None]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    # the bootstrap's unit per pair when it is not the user (a set of a few users resamples its queries)
    clusters: list[str] | None = None

    def __post_init__(self) -> None:
        n = len(self.pairs)
        if not (len(self.users) == len(self.groups) == len(self.contested) == n):
            raise ValueError(f"world {self.world}: pairs, users, groups and contested differ in length")
        if self.clusters is not None and len(self.clusters) != n:
            raise ValueError(f"world {self.world}: {len(self.clusters)} clusters for {n} pairs")
        for arm, values in self.arms.items():
            if len(values) != n:
                raise ValueError(f"world {self.world}, arm {arm!r}: {len(values)} outcomes for {n} pairs")

    def add_arm(self, arm: str, outcomes: Mapping[str, float], users: Mapping[str, str]) -> None:
        """An arm's ``pair id -> correct`` (with each pair's user, checked against the world's)."""
        index = {p: i for i, p in enumerate(self.pairs)}
        unknown = [p for p in outcomes if p not in index]
        if unknown:
            raise ValueError(f"world {self.world}, arm {arm!r}: pairs not in the world's evaluation set: "
                             f"{unknown[:3]}")
        clash = [p for p in outcomes if users[p] != self.users[index[p]]]
        if clash:
            raise ValueError(f"world {self.world}, arm {arm!r}: pair {clash[0]!r} has another user")
        values: list[float | None] = [None] * len(self.pairs)
        for p, c in outcomes.items():
            values[index[p]] = float(c)
        self.arms[arm] = values

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"world": self.world, "pairs": self.pairs, "users": self.users, "groups": self.groups,
               "contested": self.contested, "arms": self.arms, "meta": self.meta,
               **({"clusters": self.clusters} if self.clusters is not None else {})}
        path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> WorldOutcomes:
        doc = json.loads(Path(path).read_text())
        return cls(int(doc["world"]), doc["pairs"], doc["users"], doc["groups"], [bool(c) for c in doc["contested"]],
                   doc["arms"], doc.get("meta", {}), doc.get("clusters"))

    def accuracy(self, arm: str, group: str, part: str = "all") -> dict[str, float] | None:
        idx = self.select(group, part, arm)
        if not idx:
            return None
        values = np.array([self.arms[arm][i] for i in idx], dtype=float)
        return {"accuracy": float(values.mean()), "pairs": len(idx), "users": len({self.users[i] for i in idx})}

    def select(self, group: str, part: str, *arms: str) -> list[int]:
        """Indices of ``group``'s pairs (all / contested / rest) that every one of ``arms`` judged."""
        if part not in ("all", "contested", "rest"):
            raise ValueError(f"part {part!r}: all | contested | rest")
        return [i for i in range(len(self.pairs))
                if self.groups[i] == group and all(self.arms[a][i] is not None for a in arms)
                and (part == "all" or self.contested[i] == (part == "contested"))]


@dataclass(frozen=True)
class Endpoint:
    """``new - old`` on ``group`` (seen / cold) pairs, all of them or the contested / other ones."""

    name: str
    new: str
    old: str
    group: str = "seen"
    part: str = "all"


def world_difference(w: WorldOutcomes, ep: Endpoint, n_bootstrap: int, seed: int) -> dict[str, Any] | None:
    """One world's paired difference with its user-clustered bootstrap (the replicates kept for pooling)."""
    if ep.new not in w.arms or ep.old not in w.arms:
        return None
    idx = w.select(ep.group, ep.part, ep.new, ep.old)
    if not idx:
        return None
    diff = np.array([w.arms[ep.new][i] - w.arms[ep.old][i] for i in idx], dtype=float)
    users = cluster_ids([(w.clusters or w.users)[i] for i in idx])
    sums = np.bincount(users, weights=diff)
    counts = np.bincount(users).astype(float)
    rng = seeded_rng(seed, ep.name, str(w.world))
    draws = rng.integers(len(sums), size=(n_bootstrap, len(sums)))
    replicates = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    alpha = (1 - CI_LEVEL) / 2
    low, high = np.quantile(replicates, [alpha, 1 - alpha])
    return {"world": w.world, "gain": float(diff.mean()), "ci_low": float(low), "ci_high": float(high),
            "se": float(replicates.std(ddof=1)), "pairs": len(idx), "users": len(sums),
            "changed": int(np.count_nonzero(diff)), "_replicates": replicates}


def world_variances(rows: Sequence[dict[str, Any]]) -> np.ndarray:
    """Each world's variance, se^2, its se floored at one pair's share of its pairs: a world whose user bootstrap
    never moves (two rows that differ on a few pairs, each user's differences cancelling) is as uncertain as one
    discordant pair, not certain (an infinite weight would make the pool that world's difference)."""
    return np.array([max(r["se"], 1.0 / max(r["pairs"], 1)) ** 2 for r in rows])


def pool(per_world: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Fixed-effect (primary, stratified bootstrap CI) and DerSimonian-Laird random-effects estimates, Q, I^2."""
    worlds = [r for r in per_world if r is not None]
    if not worlds:
        return {"worlds": 0}
    gains = np.array([r["gain"] for r in worlds])
    var = world_variances(worlds)
    w = 1.0 / var
    fixed = float((w * gains).sum() / w.sum())
    replicates = np.vstack([r["_replicates"] for r in worlds])            # (worlds, B), users within each world
    pooled = (w[:, None] * replicates).sum(axis=0) / w.sum()
    alpha = (1 - CI_LEVEL) / 2
    low, high = np.quantile(pooled, [alpha, 1 - alpha])
    k = len(worlds)
    q = float((w * (gains - fixed) ** 2).sum())
    c = float(w.sum() - (w ** 2).sum() / w.sum())
    tau2 = max(0.0, (q - (k - 1)) / c) if k > 1 and c > 0 else 0.0
    w_re = 1.0 / (var + tau2)
    random = float((w_re * gains).sum() / w_re.sum())
    se_re = math.sqrt(1.0 / w_re.sum())
    return {"worlds": k, "fixed": {"gain": fixed, "ci_low": float(low), "ci_high": float(high),
                                   "weights": (w / w.sum()).tolist()},
            "random": {"gain": random, "ci_low": random - Z * se_re, "ci_high": random + Z * se_re, "tau2": tau2},
            "q": q, "q_df": k - 1, "i2": max(0.0, (q - (k - 1)) / q) if k > 1 and q > 0 else 0.0,
            "pairs": int(sum(r["pairs"] for r in worlds)), "users": int(sum(r["users"] for r in worlds))}


def analyse(worlds: Sequence[WorldOutcomes], endpoints: Sequence[Endpoint], n_bootstrap: int = 2000,
            seed: int = 0) -> dict[str, Any]:
    """Every endpoint: each world's difference and the pooled estimates (JSON-ready)."""
    out = {}
    for ep in endpoints:
        rows = [world_difference(w, ep, n_bootstrap, seed) for w in worlds]
        pooled = pool(rows)
        out[ep.name] = {"endpoint": {"new": ep.new, "old": ep.old, "group": ep.group, "part": ep.part},
                        "worlds": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows if r],
                        "pooled": pooled}
    return out


def moderator(worlds: Sequence[WorldOutcomes], gain: Endpoint, unlearned: Mapping[int, float]) -> dict[str, Any]:
    """The per-world ``gain`` against a per-world moderator value (e.g. what CRE left unlearned on contested
    pairs): the inverse-variance weighted least-squares slope and Spearman's rho, with the points."""
    from scipy.stats import spearmanr

    rows = [r for r in (world_difference(w, gain, 2000, 0) for w in worlds) if r and r["world"] in unlearned]
    if len(rows) < 3:
        return {"worlds": len(rows), "points": []}
    x = np.array([unlearned[r["world"]] for r in rows])
    y = np.array([r["gain"] for r in rows])
    wt = 1.0 / world_variances(rows)
    xm, ym = (wt * x).sum() / wt.sum(), (wt * y).sum() / wt.sum()
    slope = float((wt * (x - xm) * (y - ym)).sum() / max((wt * (x - xm) ** 2).sum(), 1e-12))
    rho = spearmanr(x, y).statistic
    return {"worlds": len(rows), "slope": slope, "spearman": float(rho),
            "points": [{"world": r["world"], "moderator": float(unlearned[r["world"]]), "gain": r["gain"],
                        "ci_low": r["ci_low"], "ci_high": r["ci_high"]} for r in rows]}


def fmt_gain(g: Mapping[str, float] | None) -> str:
    if not g:
        return "-"
    return f"{100 * g['gain']:+.1f} [{100 * g['ci_low']:+.1f}, {100 * g['ci_high']:+.1f}]"


def markdown(analysis: Mapping[str, Any], world_order: Sequence[int], title: str) -> str:
    """One row per endpoint: each world's difference, the fixed-effect and random-effects pools, I^2."""
    head = "| endpoint | " + " | ".join(f"world {w}" for w in world_order) + \
        " | pooled, fixed effect | random effects | I^2 |"
    lines = [f"## {title}", "", "Points [95% CI]; per world the CI resamples users; pooled: stratified by world.", "",
             head, "|---|" + "---|" * (len(world_order) + 3)]
    for name, row in analysis.items():
        by_world = {r["world"]: r for r in row["worlds"]}
        p = row["pooled"]
        cells = [fmt_gain(by_world.get(w)) for w in world_order]
        i2 = "-" if "i2" not in p else f"{100 * p['i2']:.0f}%"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {fmt_gain(p.get('fixed'))} | "
                     f"{fmt_gain(p.get('random'))} | {i2} |")
    return "\n".join(lines) + "\n"


def forest_plot(analysis: Mapping[str, Any], world_order: Sequence[int], path: str | Path) -> Path | None:
    """A forest plot of every measured endpoint: each world's difference with its CI, then the fixed-effect pool
    (filled diamond) and the random-effects pool (open diamond), in points; None when nothing is measured."""
    from pr_rlhf.report_files import new_figure, save_figure

    measured = [(name, row) for name, row in analysis.items() if row["worlds"]]
    if not measured:
        return None

    def points_err(g: Mapping[str, float]) -> list[list[float]]:
        return [[100 * (g["gain"] - g["ci_low"])], [100 * (g["ci_high"] - g["gain"])]]

    figure = new_figure(figsize=(7.5, 0.95 * len(measured) + 1.2))
    ax = figure.subplots()
    colours = {w: f"C{i}" for i, w in enumerate(world_order)}
    labels, y, legend = [], 0.0, set()

    def once(label: str) -> str | None:   # each legend entry once
        if label in legend:
            return None
        legend.add(label)
        return label

    for name, row in measured:
        for r in row["worlds"]:
            ax.errorbar(100 * r["gain"], y, xerr=points_err(r), fmt="o", ms=3, lw=1,
                        color=colours.get(r["world"], "grey"), label=once(f"world {r['world']}"))
            y += 0.16
        for kind, marker, label in (("fixed", "D", "pooled, fixed effect"), ("random", "d", "random effects")):
            g = row["pooled"].get(kind)
            if g:
                ax.errorbar(100 * g["gain"], y, xerr=points_err(g), fmt=marker, ms=6, lw=2, color="black",
                            mfc="black" if kind == "fixed" else "white", label=once(label))
                y += 0.16
        labels.append((y - 0.16 * (len(row["worlds"]) + 2) / 2, name))
        y += 0.45
    ax.axvline(0.0, color="grey", lw=0.8)
    ax.set_yticks([p for p, _ in labels], [n for _, n in labels], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("paired difference, points (95% CI resampling users)")
    ax.legend(fontsize=7, loc="lower left")
    figure.tight_layout()
    return save_figure(path, figure)
