"""The P-GenRM data source a config names (``psi.source``): the synthetic world or real data. Apart from
:mod:`pr_rlhf.pgenrm.sources` (the interface), which both sources import."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pr_rlhf.configs.pgenrm import PGenRMBase
from pr_rlhf.pgenrm.real_source import RealSource
from pr_rlhf.pgenrm.sources import Log, PGenRMSource
from pr_rlhf.pgenrm.world_source import WorldSource

SOURCES: dict[str, Callable[..., PGenRMSource]] = {"world": WorldSource, "teacher": RealSource}


def open_source(cfg: PGenRMBase, seed: int, out: Path, on_event: Log) -> PGenRMSource:
    """The source the config's member names (psi.source)."""
    return SOURCES[cfg.psi.source](cfg, seed, out, on_event)
