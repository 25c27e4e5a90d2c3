"""The P-GenRM ablation report (the paper's table: full; without curriculum; without curriculum and PR; without
curriculum and OR; without RL; base) from a pipeline run directory, as markdown, JSON and PNG.

Each row is a stage's `pr-rlhf eval` result on held-out pairs of seen users and of cold-start users, with 95%
bootstrap CIs, the accuracy on hard-negative pairs, parse failures, and the gain over the row it builds on
*paired over the same pairs* (both evaluations judge each pair in the same seeded slot order), with a 95%
bootstrap CI: a gain whose CI lies above 0 is a real improvement, not noise between two independent CIs. The
world's reference accuracies (oracle, per-user logistic regression, no history, true weights) on the same pairs
come from the run's ``references.json``, and the oracle-normalized score (accuracy - 50) / (oracle - 50) is
reported for each row.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pr_rlhf.eval.groups import EVAL_GROUPS
from pr_rlhf.eval.report import correct_by_pair, fmt_paired_gain, paired_gain
from pr_rlhf.files import is_complete
from pr_rlhf.pgenrm.headroom import TYPE_CHOICES, type_choice_table
from pr_rlhf.report_files import new_figure, write_report_files

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

# (stage, paper's row name, the stage it builds on)
ROWS: tuple[tuple[str, str, str | None], ...] = (
    ("curriculum", "full (PSI + CRE + curriculum)", "cre"),
    ("control", "compute-matched control (CRE + the same steps at the natural mix)", "cre"),
    ("cre", "w/o curriculum", "psi"),
    ("cre_no_pr", "w/o curriculum, PR", "psi"),
    ("cre_no_or", "w/o curriculum, OR", "psi"),
    ("psi", "w/o curriculum, RL (PSI only)", "base"),
    ("base", "base (untrained)", None),
)
GROUPS = tuple(EVAL_GROUPS)
REFERENCES_FILE = "references.json"
CONTESTED_FILE = "contested.json"   # pair id -> whether the types consistent with the evidence disagree
HEADROOM_FILE = "headroom.json"
# (stage, baseline): paired comparisons reported beside the rows
COMPARISONS: tuple[tuple[str, str], ...] = (("cre", "psi"), ("curriculum", "control"), ("curriculum", "cre"))


@dataclass
class AblationReport:
    rows: list[dict]
    references: dict[str, dict]
    markdown: Path
    figure: Path
    json: Path


def stage_predictions(run_dir: Path, stage: str, group: str, recorded: str) -> str:
    """The predictions file of a stage's evaluation: the one inside the run directory (a run directory that was
    moved or copied, or a report made from another working directory), else the path the evaluation recorded."""
    local = run_dir / stage / f"eval_{group}" / Path(recorded).name
    return str(local) if local.is_file() else recorded


def world_references(world, history_size: int = 3) -> dict[str, dict]:
    """{group: {reference: accuracy estimate}} of the world's reference predictors on exactly the pairs the
    stages are evaluated on (seen = val + test pairs of seen users; cold = test pairs of cold-start users)."""
    from pr_rlhf.world.reference import reference_accuracies

    return {group.name: {k: v.as_dict() for k, v in reference_accuracies(world, history_size, users=group.users,
                                                                          splits=group.splits).items()}
            for group in EVAL_GROUPS.values()}


def _normalized(acc: float, oracle: float | None) -> float | None:
    return None if oracle is None or oracle <= 0.5 else (acc - 0.5) / (oracle - 0.5)


def complete_results(run_dir: Path) -> dict[str, dict]:
    results = {}
    for stage, _, _ in ROWS:
        path = run_dir / stage / "result.json"
        if is_complete(run_dir / stage) and path.is_file():
            results[stage] = json.loads(path.read_text())
    return results


def contested_split(source: Path) -> dict[str, set[str]]:
    """{"contested": pair ids, "rest": pair ids} from a ``contested.json`` file or the one in a run directory ({}
    when absent)."""
    path = source / CONTESTED_FILE if source.is_dir() else source
    if not path.is_file():
        return {}
    flags = json.loads(path.read_text())
    return {"contested": {p for p, f in flags.items() if f}, "rest": {p for p, f in flags.items() if not f}}


def compare_stage_dirs(new_dir: str | Path, old_dir: str | Path, split: dict[str, set[str]] | None = None,
                       seed: int = 0, with_type_choice: bool = False) -> dict:
    """Paired comparison of two finished stage directories (``<out>/<stage>``, from one run or two): per group,
    the gain on all pairs and on each part of ``split`` (e.g. contested / other pairs), and with
    ``with_type_choice`` how each stage's vote chains chose ``Type`` on the contested pairs."""
    new_dir, old_dir = Path(new_dir), Path(old_dir)
    results = {}
    for folder in (new_dir, old_dir):
        path = folder / "result.json"
        if not (is_complete(folder) and path.is_file()):
            raise FileNotFoundError(f"{folder}: not a finished P-GenRM stage (no COMPLETE marker or result.json)")
        results[folder] = json.loads(path.read_text())
    row: dict = {"stage": new_dir.name, "baseline": old_dir.name}
    for group in GROUPS:
        files = [stage_predictions(f.parent, f.name, group, results[f][group]["predictions"])
                 for f in (new_dir, old_dir)]
        a, b = map(correct_by_pair, files)
        row[group] = {"all": paired_gain(a, b, seed),
                      **{name: paired_gain(a, b, seed, only=ids) for name, ids in (split or {}).items()}}
        if with_type_choice:
            only = (split or {}).get("contested")
            row[group]["type_choice"] = {part: type_choice_table(_verdict_rows(path), only)
                                         for part, path in zip(("new", "old"), files)}
    return row


def _verdict_rows(predictions: str) -> list[dict]:
    import pyarrow.parquet as pq

    names = pq.read_schema(predictions).names
    return pq.read_table(predictions, columns=[c for c in ("pair_id", "raw", "correct") if c in names]).to_pylist()


def type_choice_markdown(row: dict) -> str:
    """How each stage's ``Type`` relates to its own votes (:func:`headroom.type_choice`), on the contested pairs
    (all pairs without a split): pairs and accuracy per kind of choice."""
    lines = ["| stage | group | " + " | ".join(TYPE_CHOICES) + " | unread |", "|---|---|" + "---|" * 5]
    for group in GROUPS:
        for part, name in (("old", row["baseline"]), ("new", row["stage"])):
            table = row[group].get("type_choice", {}).get(part, {})
            lines.append(f"| {name} | {group} | " + " | ".join(
                f"{table[k]['pairs']} ({100 * table[k]['accuracy']:.0f}% right)" if k in table else "0"
                for k in TYPE_CHOICES + ("unread",)) + " |")
    return "\n".join(lines) + "\n"


def comparisons(run_dir: str | Path, seed: int = 0) -> list[dict]:
    """The paired comparisons of :data:`COMPARISONS` whose two stages are complete: per group, all pairs and the
    contested / other pairs."""
    run_dir = Path(run_dir)
    results = complete_results(run_dir)
    split = contested_split(run_dir)
    return [compare_stage_dirs(run_dir / new, run_dir / old, split, seed)
            for new, old in COMPARISONS if new in results and old in results]


def collect(run_dir: str | Path, seed: int = 0) -> list[dict]:
    """One row per complete stage found in ``run_dir`` (in the paper's order)."""
    run_dir = Path(run_dir)
    results = complete_results(run_dir)
    rows = []
    for stage, label, parent in ROWS:
        if stage not in results:
            continue
        res = results[stage]
        row: dict = {"stage": stage, "row": label, "parent": parent if parent in results else None}
        for group in GROUPS:
            s = res[group]["summary"]
            cell = {k: s[k] for k in ("accuracy", "ci_low", "ci_high", "n", "failures", "failure_rate")}
            # what a deployment that flips a coin on an unparsed chain or a tie would score
            cell["coin_flip_accuracy"] = s["accuracy"] + 0.5 * (s["failure_rate"] + s.get("tie_rate", 0.0))
            cell["hard"] = res[group].get("hardness", {}).get("hard")
            cell["contested"] = res[group].get("hardness", {}).get("contested")
            if row["parent"]:
                new = stage_predictions(run_dir, stage, group, res[group]["predictions"])
                old = stage_predictions(run_dir, parent, group, results[parent][group]["predictions"])
                cell["gain"] = paired_gain(correct_by_pair(new), correct_by_pair(old), seed)
            row[group] = cell
        row["train_seconds"] = res.get("train_seconds", 0.0)
        row["stopped"] = res.get("stopped")
        rows.append(row)
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{100 * x:.1f}"


def _cell(c: dict) -> str:
    return f"{_pct(c['accuracy'])} [{_pct(c['ci_low'])}, {_pct(c['ci_high'])}]"


def _gain(c: dict) -> str:
    return fmt_paired_gain(c.get("gain"))


def markdown(rows: list[dict], refs: dict[str, dict], title: str) -> str:
    lines = [f"## {title}", "",
             "| model | seen users: acc % [95% CI] | gain vs parent (paired) | one-attribute pairs | contested pairs "
             "| cold-start users | gain vs parent (paired) | (acc-50)/(oracle-50) seen | parse failures seen / cold | "
             "unparsed as coin flips: seen / cold | train min |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    oracle_seen = (refs.get("seen", {}).get("oracle") or {}).get("accuracy")
    for r in rows:
        seen, cold = r["seen"], r["cold"]
        hard = seen.get("hard") or {}
        contested = seen.get("contested") or {}
        norm = _normalized(seen["accuracy"], oracle_seen)
        stopped = f" (stopped {r['stopped']})" if r.get("stopped") else ""
        lines.append(f"| {r['row']}{stopped} | {_cell(seen)} | {_gain(seen)} | {_pct(hard.get('accuracy'))} | "
                     f"{_pct(contested.get('accuracy'))} | "
                     f"{_cell(cold)} | {_gain(cold)} | {'-' if norm is None else f'{norm:.2f}'} | "
                     f"{seen['failures']} / {cold['failures']} | {_pct(seen['coin_flip_accuracy'])} / "
                     f"{_pct(cold['coin_flip_accuracy'])} | {r['train_seconds'] / 60:.1f} |")
    for group in GROUPS:
        for name, est in sorted(refs.get(group, {}).items()):
            if isinstance(est, dict) and "accuracy" in est:
                lines.append(f"| world {name} ({group}) | {_cell(est) if 'ci_low' in est else _pct(est['accuracy'])}"
                             f" | | | | | | | | | |")
    lines += ["", "Gains are paired over the same held-out pairs (each pair judged in the same slot order by both "
              "models); a CI above 0 is an improvement beyond noise. Parse failures and ties count as wrong in the "
              "accuracy; the coin-flip column counts them as half right (an untrained model that never writes a "
              "parseable chain scores 50% there)."]
    return "\n".join(lines) + "\n"


def comparisons_markdown(comps: list[dict]) -> str:
    """The paired comparisons as a markdown table (gain in points [95% CI], pairs whose verdict changed)."""
    if not comps:
        return ""
    lines = ["| comparison | group | all pairs | contested pairs | other pairs |", "|---|---|---|---|---|"]
    for c in comps:
        for group in GROUPS:
            cells = [c[group].get(part) for part in ("all", "contested", "rest")]
            lines.append(f"| {c['stage']} - {c['baseline']} | {group} | " + " | ".join(
                "-" if not g or not g["pairs"] else
                f"{_gain({'gain': g})} ({g['changed']} of {g['pairs']} changed)" for g in cells) + " |")
    return "\n".join(lines) + "\n"


def figure(rows: list[dict], refs: dict[str, dict], title: str) -> Figure:
    fig = new_figure(figsize=(11, 0.55 * len(rows) + 2))
    axes = fig.subplots(1, 2, sharey=True)
    labels = [r["row"] for r in rows]
    for ax, group in zip(axes, GROUPS):
        acc = np.array([100 * r[group]["accuracy"] for r in rows])
        err = np.array([[100 * (r[group]["accuracy"] - r[group]["ci_low"]) for r in rows],
                        [100 * (r[group]["ci_high"] - r[group]["accuracy"]) for r in rows]])
        ax.barh(range(len(rows)), acc, xerr=err, color="#4c72b0", capsize=3)
        ax.axvline(50, color="grey", ls=":", label="chance")
        for (name, est), style in zip(sorted(refs.get(group, {}).items()), ("--", "-.", ":", "-")):
            if isinstance(est, dict) and "accuracy" in est:
                ax.axvline(100 * est["accuracy"], color="#c44e52", ls=style, lw=1, label=f"world {name}")
        ax.set_title("seen users (val + test)" if group == "seen" else "cold-start users (test)")
        ax.set_xlim(0, 100)
        ax.set_xlabel("pairwise accuracy %")
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_yticks(range(len(rows)), labels)
    axes[0].invert_yaxis()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def write_ablation_report(run_dir: str | Path, title: str = "P-GenRM ablation", seed: int = 0) -> AblationReport:
    """The report of a pipeline run directory (its stages' results and the ``references.json`` the pipeline
    wrote)."""
    run_dir = Path(run_dir)
    rows = collect(run_dir, seed)
    if not rows:
        raise FileNotFoundError(f"{run_dir}: no complete P-GenRM stage (base, psi, cre, ...) to report")
    ref_path = run_dir / REFERENCES_FILE
    refs = json.loads(ref_path.read_text()) if ref_path.is_file() else {}
    comps = comparisons(run_dir, seed)
    text = markdown(rows, refs, title)
    if comps:
        text += "\n### Paired comparisons (seen and cold-start users; contested = the types consistent with the " \
                "evidence disagree)\n\n" + comparisons_markdown(comps)
    headroom = json.loads((run_dir / HEADROOM_FILE).read_text()) if (run_dir / HEADROOM_FILE).is_file() else None
    psi = complete_results(run_dir).get("psi", {})
    if headroom:
        from pr_rlhf.pgenrm.headroom import headroom_markdown

        text += "\n" + headroom_markdown(headroom, psi.get("headroom"))
    files = write_report_files(run_dir, "ablation", markdown=text,
                               data={"rows": rows, "references": refs, "comparisons": comps, "headroom": headroom,
                                     "psi_headroom": psi.get("headroom")},
                               figure=figure(rows, refs, title))
    return AblationReport(rows, refs, files.markdown, files.figure, files.json)
