"""The online learning curve's analysis (docs/results/online/PREREGISTRATION.md): per-pair outcomes of each arm
at each number of stored pairs -> accuracies with user-resampled CIs, paired differences, and the service's
agreement with the same model offline. Pure numpy: a reader re-runs it on the committed outcomes."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pr_rlhf.stats import mean_ci, paired_difference_ci

SERVICE, OFFLINE, BORROW, REFERENCE = "service", "offline", "service_borrow", "seen_reference"


def _aligned(outcomes: Sequence[dict], arm: str, k: int | None) -> dict[str, dict]:
    return {o["pair_id"]: o for o in outcomes if o["arm"] == arm and (k is None or o["k"] == k)}


def _pct(x: float) -> float:
    return round(100 * x, 1)


def difference(outcomes: Sequence[dict], new: tuple[str, int | None], old: tuple[str, int | None],
               seed: int = 0) -> dict[str, Any]:
    """new - old in accuracy points on the pairs both have, resampling users."""
    a, b = _aligned(outcomes, *new), _aligned(outcomes, *old)
    ids = sorted(set(a) & set(b))
    if not ids:
        return {"n_pairs": 0}
    mean, low, high = paired_difference_ci(np.array([a[i]["correct"] for i in ids], dtype=float),
                                           np.array([b[i]["correct"] for i in ids], dtype=float),
                                           clusters=[a[i]["user_id"] for i in ids], seed=seed)
    return {"new": list(new), "old": list(old), "diff": _pct(mean), "ci_low": _pct(low), "ci_high": _pct(high),
            "n_pairs": len(ids), "n_users": len({a[i]["user_id"] for i in ids})}


def summarize(outcomes: Sequence[dict], points: Sequence[int], borrow_points: Sequence[int] = (),
              seed: int = 0) -> dict[str, Any]:
    """Accuracy per (arm, k), the pre-registered differences and the service/offline agreement."""
    arms: list[dict] = []
    for arm, ks in ((SERVICE, points), (OFFLINE, points), (BORROW, borrow_points), (REFERENCE, [None])):
        for k in ks:
            rows = list(_aligned(outcomes, arm, k).values())
            if not rows:
                continue
            correct = np.array([r["correct"] for r in rows], dtype=float)
            low, high = mean_ci(correct, seed=seed, clusters=[r["user_id"] for r in rows])
            arms.append({"arm": arm, "k": k, "accuracy": _pct(correct.mean()), "ci_low": _pct(low),
                         "ci_high": _pct(high), "n_pairs": len(rows), "n_users": len({r["user_id"] for r in rows}),
                         "failures": sum(r.get("error") is not None for r in rows)})
    agree, compared = 0, 0
    for k in points:
        service, offline = _aligned(outcomes, SERVICE, k), _aligned(outcomes, OFFLINE, k)
        for pid in set(service) & set(offline):
            compared += 1
            agree += service[pid]["predicted"] == offline[pid]["predicted"]
    diffs = {f"service k={k} - k=0": difference(outcomes, (SERVICE, k), (SERVICE, 0), seed)
             for k in points if k != 0 and 0 in points}
    last = max(points)
    diffs[f"service k={last} - seen reference"] = difference(outcomes, (SERVICE, last), (REFERENCE, None), seed)
    if len(points) > 1:
        before = sorted(points)[-2]
        diffs[f"service k={last} - k={before}"] = difference(outcomes, (SERVICE, last), (SERVICE, before), seed)
    for k in borrow_points:
        diffs[f"borrow - own, k={k}"] = difference(outcomes, (BORROW, k), (SERVICE, k), seed)
    service_curve = [a["accuracy"] for a in arms if a["arm"] == SERVICE]
    return {"arms": arms, "differences": diffs,
            "agreement": {"compared": compared, "agree": agree, "rate": agree / compared if compared else None},
            "monotone": all(x <= y for x, y in zip(service_curve, service_curve[1:])),
            "goal_within_3": (diffs[f"service k={last} - seen reference"].get("ci_low", -np.inf) > -3)}


def markdown(summary: dict[str, Any]) -> str:
    lines = ["| arm | stored pairs | accuracy % [95% CI, users resampled] | pairs | users | failures |",
             "|---|---|---|---|---|---|"]
    for a in summary["arms"]:
        k = "first 3 (protocol)" if a["k"] is None else a["k"]
        lines.append(f"| {a['arm']} | {k} | {a['accuracy']:.1f} [{a['ci_low']:.1f}, {a['ci_high']:.1f}] | "
                     f"{a['n_pairs']} | {a['n_users']} | {a['failures']} |")
    lines += ["", "| difference | points [95% CI, users resampled] | pairs |", "|---|---|---|"]
    for name, d in summary["differences"].items():
        if d.get("n_pairs"):
            lines.append(f"| {name} | {d['diff']:+.1f} [{d['ci_low']:+.1f}, {d['ci_high']:+.1f}] | {d['n_pairs']} |")
    ag = summary["agreement"]
    lines += ["", f"Service vs offline verdicts: {ag['agree']} of {ag['compared']} equal."]
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, style in ((SERVICE, "o-"), (OFFLINE, "x--"), (BORROW, "s:")):
        rows = [a for a in summary["arms"] if a["arm"] == arm]
        if rows:
            ks = [a["k"] for a in rows]
            acc = np.array([a["accuracy"] for a in rows])
            err = np.array([[a["accuracy"] - a["ci_low"] for a in rows], [a["ci_high"] - a["accuracy"] for a in rows]])
            ax.errorbar(ks, acc, yerr=err, fmt=style, capsize=3, label=arm)
    ref = [a for a in summary["arms"] if a["arm"] == REFERENCE]
    if ref:
        ax.axhspan(ref[0]["ci_low"], ref[0]["ci_high"], alpha=0.2, color="grey",
                   label=f"seen users, protocol history ({ref[0]['accuracy']:.1f}%)")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xticks(sorted({a["k"] for a in summary["arms"] if a["k"] is not None}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("feedback pairs stored")
    ax.set_ylabel("accuracy on held-out pairs (%)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
