"""The leaderboard's table: every row's accuracy on the same pairs, seen and cold-start users apart, per world and
pooled over worlds, and each row's paired difference against the baseline (the global Bradley-Terry floor) and
against a second row (P-GenRM).

Everything is a paired difference of per-pair outcomes (:mod:`pr_rlhf.eval.worlds`): a row's accuracy is its
difference from a row of zeros, so that accuracies and gains get the same treatment -- per world a 95% bootstrap CI
that resamples **users** (a user's pairs share their history and move together), pooled over worlds the
fixed-effect (inverse-variance) estimate with the bootstrap stratified by world, beside it the random-effects one
and I^2.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pr_rlhf.eval.groups import EVAL_GROUPS
from pr_rlhf.eval.worlds import Endpoint, WorldOutcomes, analyse

GROUPS = tuple(EVAL_GROUPS)   # the held-out groups, in report order
ZERO = "_zero"   # a row of zeros: a row's accuracy is its difference from it


def _with_zero(worlds: Sequence[WorldOutcomes]) -> list[WorldOutcomes]:
    out = []
    for w in worlds:
        arms = {**w.arms, ZERO: [0.0] * len(w.pairs)}
        out.append(WorldOutcomes(w.world, w.pairs, w.users, w.groups, w.contested, arms, w.meta, w.clusters))
    return out


def _endpoints(rows: Sequence[str], baseline: str | None, against: str | None) -> list[tuple[str, str, Endpoint]]:
    """(row, measure, endpoint): each row's accuracy and its differences, per group."""
    out = []
    for row in rows:
        for group in GROUPS:
            out.append((row, f"accuracy_{group}", Endpoint(f"{row} accuracy ({group})", row, ZERO, group)))
            for measure, other in (("vs_baseline", baseline), ("vs_against", against)):
                if other is not None and other != row:
                    out.append((row, f"{measure}_{group}", Endpoint(f"{row} - {other} ({group})", row, other, group)))
    return out


def build_board(worlds: Sequence[WorldOutcomes], rows: Sequence[str], *, baseline: str | None,
                against: str | None, n_bootstrap: int = 2000, seed: int = 0,
                costs: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Any]:
    """JSON-ready: for each row and measure (``accuracy_seen``, ``vs_baseline_cold``, ...) each world's estimate and
    the pooled ones; ``costs`` (row -> train / scoring seconds) ride along."""
    padded = _with_zero(worlds)
    plan = _endpoints(rows, baseline, against)
    analysis = analyse(padded, [ep for _, _, ep in plan], n_bootstrap=n_bootstrap, seed=seed)
    table: dict[str, dict[str, Any]] = {row: {} for row in rows}
    for row, measure, ep in plan:
        table[row][measure] = analysis[ep.name]
    return {"worlds": [w.world for w in worlds], "rows": list(rows), "baseline": baseline, "against": against,
            "table": table, "costs": {k: dict(v) for k, v in (costs or {}).items()}}


def _cell(entry: Mapping[str, Any] | None, signed: bool = False) -> str:
    if not entry or not entry.get("pooled", {}).get("worlds"):
        return "-"
    fixed = entry["pooled"]["fixed"]
    fmt = "{:+.1f}" if signed else "{:.1f}"
    return f"{fmt.format(100 * fixed['gain'])} [{fmt.format(100 * fixed['ci_low'])}, " \
           f"{fmt.format(100 * fixed['ci_high'])}]"


def _world_cell(entry: Mapping[str, Any] | None, world: int, signed: bool = False) -> str:
    for w in (entry or {}).get("worlds", []):
        if w["world"] == world:
            fmt = "{:+.1f}" if signed else "{:.1f}"
            return f"{fmt.format(100 * w['gain'])} [{fmt.format(100 * w['ci_low'])}, {fmt.format(100 * w['ci_high'])}]"
    return "-"


def markdown(board: Mapping[str, Any], labels: Mapping[str, str] | None = None, title: str = "Leaderboard",
             unit: str = "users", scope: str | None = None) -> str:
    """The pooled table (accuracy %, 95% CI resampling ``unit``, fixed effect over the worlds), then one table per
    world (none for a single set: ``scope`` names it instead of the worlds)."""
    labels = labels or {}
    base, other = board["baseline"], board["against"]
    head = ["row", "seen users", "cold-start users"]
    if base:
        head += [f"seen: - {labels.get(base, base)}", f"cold: - {labels.get(base, base)}"]
    if other:
        head += [f"seen: - {labels.get(other, other)}", f"cold: - {labels.get(other, other)}"]
    head += ["train s", "score s"]
    where = scope or f"Worlds {', '.join(map(str, board['worlds']))}"
    pooled = "" if scope else ", pooled over the worlds by inverse variance (fixed effect)"
    lines = [f"## {title}", "", f"{where}; accuracy % (and differences in points) with 95% CIs resampling {unit}"
             f"{pooled}.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in board["rows"]:
        t = board["table"][row]
        cells = [labels.get(row, row), _cell(t.get("accuracy_seen")), _cell(t.get("accuracy_cold"))]
        if base:
            cells += [_cell(t.get("vs_baseline_seen"), True), _cell(t.get("vs_baseline_cold"), True)]
        if other:
            cells += [_cell(t.get("vs_against_seen"), True), _cell(t.get("vs_against_cold"), True)]
        cost = board["costs"].get(row, {})
        cells += [f"{cost['train_s']:.0f}" if "train_s" in cost else "-",
                  f"{cost['score_s']:.0f}" if "score_s" in cost else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    for world in ([] if scope else board["worlds"]):
        lines += ["", f"### World {world}", "", "| row | seen users | cold-start users |" +
                  (f" seen: - {labels.get(base, base)} |" if base else ""), "|---|---|---|" + ("---|" if base else "")]
        for row in board["rows"]:
            t = board["table"][row]
            cells = [labels.get(row, row), _world_cell(t.get("accuracy_seen"), world),
                     _world_cell(t.get("accuracy_cold"), world)]
            if base:
                cells.append(_world_cell(t.get("vs_baseline_seen"), world, True))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pyplot() -> Any:
    """matplotlib's pyplot on the file backend, or None where matplotlib is missing (no plot then)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _save(plt: Any, fig: Any, path: str | Path) -> Path:
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot(board: Mapping[str, Any], path: str | Path, labels: Mapping[str, str] | None = None) -> Path | None:
    """Pooled accuracy with its CI per row, seen and cold-start users side by side."""
    plt = _pyplot()
    if plt is None:
        return None
    labels = labels or {}
    rows = list(board["rows"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(rows) + 1.6), sharey=True)
    for ax, group in zip(axes, GROUPS):
        for y, row in enumerate(rows):
            entry = board["table"][row].get(f"accuracy_{group}") or {}
            fixed = entry.get("pooled", {}).get("fixed")
            if not fixed:
                continue
            ax.errorbar(100 * fixed["gain"], y, xerr=[[100 * (fixed["gain"] - fixed["ci_low"])],
                                                      [100 * (fixed["ci_high"] - fixed["gain"])]],
                        fmt="o", color="tab:blue" if row in board["table"] else "gray", capsize=3)
        ax.axvline(50, color="gray", lw=0.8, ls=":")
        ax.set_title({"seen": "seen users", "cold": "cold-start users"}[group])
        ax.set_xlabel("accuracy % (95% CI, users resampled, pooled over worlds)")
    axes[0].set_yticks(range(len(rows)), [labels.get(r, r) for r in rows])
    axes[0].invert_yaxis()
    return _save(plt, fig, path)


COIN_FLIP = 0.5   # a pair the model could not score: neither response preferred


def with_coin_flips(scored: Mapping[str, float], pairs: Iterable[str]) -> dict[str, float]:
    """Every pair of ``pairs``: its outcome where the model scored it, else a coin flip."""
    return {p: float(scored.get(p, COIN_FLIP)) for p in pairs}


def few_shot_record(world: int, method: str, k: int, users_of: Mapping[str, str], scored: Mapping[str, float], *,
                    n_bootstrap: int, seed: int) -> dict[str, Any]:
    """One (method, k) cell of one world: every pair of the set (``users_of``: pair -> user), a pair missing from
    ``scored`` (the model failed on it) as a coin flip, counted in ``unscored``; accuracy with a 95% CI resampling
    users."""
    from pr_rlhf.stats import mean_ci

    stray = sorted(set(scored) - set(users_of))
    if stray:
        raise ValueError(f"world {world}, {method} k={k}: scored pairs not in the set: {stray[:3]}")
    outcomes = with_coin_flips(scored, users_of)
    values = np.array(list(outcomes.values()))
    low, high = mean_ci(values, n_bootstrap=n_bootstrap, seed=seed, clusters=list(users_of.values()))
    return {"world": world, "method": method, "k": k, "accuracy": float(values.mean()), "ci_low": low,
            "ci_high": high, "pairs": len(values), "users": len(set(users_of.values())),
            "unscored": len(users_of) - len(scored), "outcomes": outcomes, "users_of": dict(users_of)}


def few_shot_frames(rows: Sequence[Mapping[str, Any]]) -> list[WorldOutcomes]:
    """The few-shot records (:func:`few_shot_record`) as one frame per world: each (method, k) an arm
    ``<method>@<k>`` of the cold-start group; each arm's count of unscored pairs in the frame's ``meta``."""
    worlds: dict[int, dict[str, dict[str, float]]] = {}
    users: dict[int, dict[str, str]] = {}
    unscored: dict[int, dict[str, int]] = {}
    for r in rows:
        worlds.setdefault(r["world"], {})[f"{r['method']}@{r['k']}"] = r["outcomes"]
        users.setdefault(r["world"], {}).update(r["users_of"])
        unscored.setdefault(r["world"], {})[f"{r['method']}@{r['k']}"] = int(r.get("unscored", 0))
    frames = []
    for world, arms in sorted(worlds.items()):
        pairs = sorted(users[world])
        frame = WorldOutcomes(world, pairs, [users[world][p] for p in pairs], ["cold"] * len(pairs),
                              [False] * len(pairs), meta={"unscored": unscored[world]})
        for arm, outcome in arms.items():
            frame.add_arm(arm, outcome, users[world])
        frames.append(frame)
    return frames


def few_shot_board(frames: Sequence[WorldOutcomes], n_bootstrap: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The few-shot curve pooled over worlds (:func:`few_shot_frames`): each (method, k) is a row of a board on the
    cold-start group, so its accuracy is pooled as every other row's; with its unscored pairs over all worlds."""
    names = list(dict.fromkeys(arm for f in frames for arm in f.arms))
    board = build_board(frames, names, baseline=None, against=None, n_bootstrap=n_bootstrap, seed=seed)
    curve = []
    for name in names:
        method, k = name.rsplit("@", 1)
        fixed = board["table"][name]["accuracy_cold"]["pooled"]["fixed"]
        measured = [f for f in frames if name in f.arms]
        curve.append({"method": method, "k": int(k), "accuracy": fixed["gain"], "ci_low": fixed["ci_low"],
                      "ci_high": fixed["ci_high"],
                      "worlds": [w["world"] for w in board["table"][name]["accuracy_cold"]["worlds"]],
                      "pairs": sum(v is not None for f in measured for v in f.arms[name]),
                      "unscored": sum(f.meta.get("unscored", {}).get(name, 0) for f in measured)})
    return {"worlds": board["worlds"], "curve": curve}


def few_shot_markdown(curve: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> str:
    labels = labels or {}
    ks = sorted({c["k"] for c in curve["curve"]})
    methods = list(dict.fromkeys(c["method"] for c in curve["curve"]))
    cell = {(c["method"], c["k"]): c for c in curve["curve"]}
    lines = ["## Few-shot cold-start users", "",
             f"Worlds {', '.join(map(str, curve['worlds']))}: each cold-start user given k of their pairs; accuracy % "
             "on their test pairs, 95% CI resampling users, pooled over the worlds (fixed effect); `pairs`: the test "
             "pairs a row scored at each k (fewer for a row on a sample of users). A pair a model could not score "
             "counts as a coin flip (\\* below).", "",
             "| method | pairs | " + " | ".join(f"k = {k}" for k in ks) + " |", "|---|---|" + "---|" * len(ks)]
    for m in methods:
        cells = [f"{100 * cell[m, k]['accuracy']:.1f} [{100 * cell[m, k]['ci_low']:.1f}, "
                 f"{100 * cell[m, k]['ci_high']:.1f}]{' *' if cell[m, k].get('unscored') else ''}"
                 if (m, k) in cell else "-" for k in ks]
        pairs = max(cell[m, k]["pairs"] for k in ks if (m, k) in cell)
        lines.append(f"| {labels.get(m, m)} | {pairs:,} | " + " | ".join(cells) + " |")
    failed = [c for c in curve["curve"] if c.get("unscored")]
    if failed:
        lines += [""] + [f"\\* {labels.get(c['method'], c['method'])}, k = {c['k']}: {c['unscored']} of {c['pairs']} "
                         "pairs unscored (counted as coin flips)." for c in failed]
    return "\n".join(lines) + "\n"


def few_shot_plot(curve: Mapping[str, Any], path: str | Path, labels: Mapping[str, str] | None = None) -> Path | None:
    plt = _pyplot()
    if plt is None:
        return None
    labels = labels or {}
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for method in dict.fromkeys(c["method"] for c in curve["curve"]):
        points = sorted((c for c in curve["curve"] if c["method"] == method), key=lambda c: c["k"])
        ks = [c["k"] for c in points]
        ax.plot(ks, [100 * c["accuracy"] for c in points], marker="o", label=labels.get(method, method))
        ax.fill_between(ks, [100 * c["ci_low"] for c in points], [100 * c["ci_high"] for c in points], alpha=0.15)
    ax.axhline(50, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("pairs given to each cold-start user (k)")
    ax.set_ylabel("accuracy % (95% CI, users resampled)")
    ax.legend(fontsize=8)
    return _save(plt, fig, path)
