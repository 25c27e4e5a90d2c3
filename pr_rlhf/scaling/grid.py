"""The test-time scaling evaluation grid on the synthetic world: held-out pairs of seen users (3 history pairs)
and of cold-start users (1 history pair), accuracy with a bootstrap CI at every (m, n), next to the world's oracle;
markdown + PNG report. The evidence is gathered once per pair for the largest (m, n) (see ``scaling.scorer``)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pr_rlhf.configs.recipe import EvalConfig
from pr_rlhf.configs.scaling import ScalingEvalConfig
from pr_rlhf.eval.groups import EVAL_GROUPS
from pr_rlhf.report_files import new_figure, write_report_files
from pr_rlhf.reward.inputs import RMInput, history_rows_by_user, rm_inputs_from_rows
from pr_rlhf.scaling.scorer import Evidence, decide
from pr_rlhf.shards import ShardReader
from pr_rlhf.stats import mean_ci, paired_difference_ci

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


def group_inputs(cfg: ScalingEvalConfig, group: str, seed: int) -> list[RMInput]:
    """The group's evaluated pairs with the group's history length (the eval's own loader and seeded sample)."""
    from pr_rlhf.eval.runner import load_eval_inputs

    held_out = EVAL_GROUPS[group]
    history = cfg.seen_history_pairs if group == "seen" else cfg.cold_history_pairs
    max_pairs = cfg.seen_pairs if group == "seen" else cfg.cold_pairs
    return load_eval_inputs(EvalConfig(shards=cfg.shards, split=held_out.split, users=held_out.users,
                                       max_pairs=max_pairs, history_pairs=history), seed)


def member_histories(shards: str, history_pairs: int) -> tuple[dict[str, list[dict]], list[RMInput]]:
    """Seen (non-cold-start) users: their first ``history_pairs`` train pairs as history triples, and one input
    per user (their next train pair with that history) whose chain's persona places them among the prototypes."""
    reader = ShardReader(shards)
    cold = {user for user, _subset in reader.cold_start_users()}
    train = list(reader.iter_rows("pairs", "train"))
    by_user = history_rows_by_user(reader.iter_rows("histories"), train)
    histories: dict[str, list[dict]] = {}
    persona_rows: list[dict] = []
    for (user, _subset), rows in sorted(by_user.items()):
        if user in cold or len(rows) <= history_pairs:
            continue
        histories[user] = [{"question": r["question"], "chosen": r["chosen"], "rejected": r["rejected"]}
                           for r in rows[:history_pairs]]
        persona_rows.append(rows[history_pairs])
    return histories, rm_inputs_from_rows(persona_rows, by_user, None, history_pairs)


def profile_posts(shards: str) -> dict[str, list[str]]:
    """Every user's profile post texts (the shards' ``profiles`` table), for profile placement."""
    return {str(r["user_id"]): [str(item.get("text", "")) for item in (r.get("items") or [])]
            for r in ShardReader(shards).iter_rows("profiles")}


@dataclass
class GridRow:
    group: str
    m: int
    n: int
    accuracy: float
    ci_low: float
    ci_high: float
    pairs: int
    no_verdict: int                    # pairs without a valid chain on any side, or a tie
    gain: float | None = None          # minus (0, 0) on the same pairs, with a paired 95% bootstrap CI
    gain_low: float | None = None
    gain_high: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def point_outcomes(evidence: Sequence[Evidence], m: int, n: int, self_weight: float, neighbour_weight: float,
                   certainty_weighting: bool = False) -> tuple[np.ndarray, list]:
    """1 / 0 per pair at the point (m, n), and the decisions."""
    decisions = [decide(ev, m, n, self_weight, neighbour_weight, certainty_weighting) for ev in evidence]
    return np.array([d.correct(ev.chosen_slot) for d, ev in zip(decisions, evidence)], dtype=float), decisions


def pair_records(group: str, evidence: Sequence[Evidence], points: Sequence[tuple[int, int]], self_weight: float,
                 neighbour_weight: float, certainty_weighting: bool = False) -> dict[str, list[dict]]:
    """``"m_n"`` -> one record per pair (pair, user, group, correct): what a reader needs to re-analyse the grid."""
    out = {}
    for m, n in points:
        correct, _ = point_outcomes(evidence, m, n, self_weight, neighbour_weight, certainty_weighting)
        out[f"{m}_{n}"] = [{"pair_id": ev.pair_id, "user_id": ev.user_id, "group": group, "correct": float(c)}
                           for ev, c in zip(evidence, correct)]
    return out


def grid_rows(group: str, evidence: Sequence[Evidence], points: Sequence[tuple[int, int]], self_weight: float,
              neighbour_weight: float, n_bootstrap: int = 1000, seed: int = 0,
              certainty_weighting: bool = False) -> list[GridRow]:
    """Accuracy (ties and pairs without a valid chain count as wrong) with a 95% bootstrap CI per point, both CIs
    resampling users (a user's pairs share their history and their neighbours)."""
    rows = []
    users = [ev.user_id for ev in evidence]

    def correct_at(m: int, n: int) -> tuple[np.ndarray, list]:
        return point_outcomes(evidence, m, n, self_weight, neighbour_weight, certainty_weighting)
    base = correct_at(0, 0)[0] if (0, 0) in [tuple(p) for p in points] and evidence else None
    for m, n in points:
        correct, decisions = correct_at(m, n)
        low, high = mean_ci(correct, n_bootstrap=n_bootstrap, seed=seed, clusters=users)
        gain = (None, None, None)
        if base is not None and (m, n) != (0, 0):
            gain = paired_difference_ci(correct, base, clusters=users, n_bootstrap=n_bootstrap, seed=seed)
        rows.append(GridRow(group, m, n, float(correct.mean()) if correct.size else float("nan"), low, high,
                            len(evidence), sum(d.predicted is None for d in decisions), *gain))
    return rows


def _pct(x: float) -> str:
    return "-" if np.isnan(x) else f"{100 * x:.1f}"


def write_grid_report(out: Path, rows: Sequence[GridRow], references: dict[str, dict], failures: dict[str, dict],
                      extra: dict[str, Any]) -> tuple[Path, Path]:
    """``scaling_grid.md`` (+ ``.json``) and ``scaling_grid.png``: accuracy per (m, n) and group, oracle lines."""
    groups = sorted({r.group for r in rows}, key=list(EVAL_GROUPS).index)
    lines = ["## Test-time user-based scaling", "",
             ("m = chains sampled per pair (scores averaged over valid parses), n = neighbours' histories through "
              "the user prototypes, fused 0.5 / 0.5; (0, 0) = one greedy chain. Accuracy % [95% bootstrap CI]; "
              "ties and pairs without any valid chain count as wrong."), "",
             "| (m, n) | " + " | ".join(f"{g} users" for g in groups) + " |", "|---|" + "---|" * len(groups)]
    for m, n in dict.fromkeys((r.m, r.n) for r in rows):
        cells = []
        for g in groups:
            r = next(x for x in rows if x.group == g and (x.m, x.n) == (m, n))
            gain = "" if r.gain is None else \
                f"; {100 * r.gain:+.1f} [{100 * r.gain_low:+.1f}, {100 * r.gain_high:+.1f}] vs (0, 0)"
            cells.append(f"{_pct(r.accuracy)} [{_pct(r.ci_low)}, {_pct(r.ci_high)}]{gain}"
                         + (f" ({r.no_verdict} no verdict)" if r.no_verdict else ""))
        lines.append(f"| ({m}, {n}) | " + " | ".join(cells) + " |")
    for name in ("oracle", "logistic_regression", "no_history"):
        cells = [_pct(references.get(g, {}).get(name, {}).get("accuracy", float("nan"))) for g in groups]
        lines.append(f"| world {name} | " + " | ".join(cells) + " |")
    kinds = "; ".join(f"{g}: {json.dumps(failures.get(g, {}))}" for g in groups)
    lines += ["", f"Invalid chains by kind (greedy, sampled and neighbour chains): {kinds}"]
    lines += [f"- {k}: {v}" for k, v in extra.items()]
    files = write_report_files(out, "scaling_grid", markdown="\n".join(lines) + "\n",
                               data={"rows": [r.as_dict() for r in rows], "references": references,
                                     "failures": failures, **extra},
                               figure=_figure(rows, groups, references))
    return files.markdown, files.figure


def _figure(rows: Sequence[GridRow], groups: list[str], references: dict[str, dict]) -> Figure:
    points = list(dict.fromkeys((r.m, r.n) for r in rows))
    fig = new_figure(figsize=(1.2 * len(points) + 3, 4))
    ax = fig.subplots()
    width = 0.8 / max(len(groups), 1)
    for gi, g in enumerate(groups):
        rs = [next(x for x in rows if x.group == g and (x.m, x.n) == p) for p in points]
        xs = np.arange(len(points)) + (gi - (len(groups) - 1) / 2) * width
        acc = np.array([100 * r.accuracy for r in rs])
        err = np.array([[100 * (r.accuracy - r.ci_low) for r in rs], [100 * (r.ci_high - r.accuracy) for r in rs]])
        bars = ax.bar(xs, acc, width, yerr=err, capsize=3, label=f"{g} users")
        oracle = references.get(g, {}).get("oracle", {}).get("accuracy")
        if oracle is not None:
            ax.axhline(100 * oracle, ls="--", lw=1, color=bars.patches[0].get_facecolor(),
                       label=f"{g}: world oracle")
    ax.set_xticks(np.arange(len(points)), [f"({m}, {n})" for m, n in points])
    ax.set_xlabel("(m chains, n neighbours)")
    ax.set_ylabel("pairwise accuracy %")
    ax.set_ylim(40, 100)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Test-time user-based scaling")
    fig.tight_layout()
    return fig
