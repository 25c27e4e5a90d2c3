"""The files of a report: markdown, JSON and a PNG figure, each written atomically (``pr_rlhf.files``).

Every report (evaluation, P-GenRM ablation, scaling grid, best-of-k curves, benchmark validity, a best-of-N
sweep) writes through here, so a crash never leaves a torn report file. Figures are drawn on matplotlib's Agg
canvas outside pyplot (:func:`new_figure`): no report switches the process's matplotlib backend or leaves a
figure open (a Figure is freed with its last reference). matplotlib is imported only when a figure is made.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pr_rlhf.files import atomic_write, atomic_write_text

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

FIGURE_DPI = 120


def new_figure(**kwargs: Any) -> Figure:
    """A matplotlib ``Figure(**kwargs)`` on the Agg canvas; draw with ``fig.subplots(...)`` / ``fig.add_subplot``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(**kwargs)
    FigureCanvasAgg(figure)
    return figure


def save_figure(path: str | os.PathLike, figure: Figure, dpi: float = FIGURE_DPI) -> Path:
    return atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=dpi))


def strict_json(x: Any) -> Any:
    """``x`` with numpy scalars as Python numbers and NaN / infinities as None (strict JSON: null)."""
    if isinstance(x, dict):
        return {str(k): strict_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict_json(v) for v in x]
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return None if math.isnan(x) or math.isinf(x) else x
    return x


def write_json(path: str | os.PathLike, data: Any, *, indent: int = 1, strict: bool = False) -> Path:
    """``data`` as JSON; ``strict``: through :func:`strict_json` (a NaN is written as null, never as ``NaN``)."""
    text = (json.dumps(strict_json(data), indent=indent, allow_nan=False) if strict
            else json.dumps(data, indent=indent))
    return atomic_write_text(path, text + "\n")


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path | None
    json: Path | None
    figure: Path | None


def write_report_files(folder: str | os.PathLike, stem: str, *, markdown: str | None = None, data: Any = None,
                       figure: Figure | None = None, indent: int = 1, strict: bool = False) -> ReportFiles:
    """``<stem>.md``, ``<stem>.json`` and ``<stem>.png`` in ``folder``, each only when given (``data`` None: no
    JSON); ``indent`` / ``strict`` as in :func:`write_json`."""
    folder = Path(folder)
    return ReportFiles(
        markdown=atomic_write_text(folder / f"{stem}.md", markdown) if markdown is not None else None,
        json=write_json(folder / f"{stem}.json", data, indent=indent, strict=strict) if data is not None else None,
        figure=save_figure(folder / f"{stem}.png", figure) if figure is not None else None)
