"""The data a P-GenRM run trains and evaluates on, behind one interface the driver (``workers/pgenrm.py``) reads.

Two sources implement it, chosen once from the config's member (``psi.source``):

- the synthetic world (:class:`pr_rlhf.pgenrm.world_source.WorldSource`): its oracle teacher writes PSI's chains,
  the PR is exact (the user's true weights), contested pairs are a kind of hard negative, and the offline headroom
  check says whether RL has anything to find;
- real data (:class:`pr_rlhf.pgenrm.real_source.RealSource`): shards of a real set, a teacher engine's
  rejection-sampled chains, the PR graded by an LLM judge, label-margin hard negatives; no world, so no headroom
  check.

What only one source has is a capability the driver asks for (``headroom`` is None where there is none), never a
check of which source it holds.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar, Literal, Protocol

from pr_rlhf.configs.pgenrm import GRPOStageConfig
from pr_rlhf.pgenrm.cre_reward import CREReward
from pr_rlhf.pgenrm.psi_data import PSIExample

PROMPTS_FILE = "examples.jsonl"   # a stage's training prompts as the GenRM saw them (real data; PSI's with targets)

Log = Callable[[str], None]


def pair_kinds(hardness: dict[str, str], contested: dict[str, bool] | None = None) -> dict[str, set[str]]:
    """pair id -> its kinds: the hardness (standard / hard) and, with ``contested``, contested / uncontested."""
    kinds = {pair_id: {hard} for pair_id, hard in hardness.items()}
    for pair_id, flag in (contested or {}).items():
        kinds.setdefault(pair_id, set()).add("contested" if flag else "uncontested")
    return kinds


class HeadroomCheck(Protocol):
    """The headroom check before RL: the offline report, the gate it puts before the GRPO stages, and whether the
    PSI model is measured too (pgenrm.headroom)."""

    after_psi: bool

    def offline(self) -> dict: ...

    def check_gate(self, stage: str) -> None: ...


class PGenRMSource(ABC):
    """What the P-GenRM stages need of their data. ``out`` is the run directory; ``on_event`` hears what the
    source did (examples built, teacher calls, files written)."""

    # the pairwise prompt the stage evaluations use (EvalConfig.pairwise_format)
    eval_format: ClassVar[Literal["sec", "sec_compact"]]
    # the headroom check before RL; None where the source has no world to measure it on
    headroom: HeadroomCheck | None = None

    def __init__(self, out: Path, seed: int, on_event: Log):
        self.out = out
        self.seed = seed
        self.on_event = on_event

    @abstractmethod
    def prepare(self) -> None:
        """Write the run-level files the reports read (before any GenRM stage)."""

    @abstractmethod
    def psi_examples(self, stage_dir: Path) -> list[PSIExample]:
        """PSI's supervised examples (prompt + teacher chain); ``stage_dir``: where the source records them."""

    @abstractmethod
    def grpo_pool(self, scfg: GRPOStageConfig, stage_dir: Path) -> tuple[list[PSIExample], list[bool]]:
        """A GRPO stage's prompt pool (shaped like the evaluation's: >= ``scfg.min_history`` history pairs) and
        whether each prompt is hard (``scfg.hard_kind``)."""

    @abstractmethod
    def other_order(self, item: PSIExample) -> PSIExample:
        """The same GRPO prompt with the two responses in the other slots."""

    @abstractmethod
    def rewards(self, items: Sequence[PSIExample], texts: Sequence[Sequence[str]], scfg: GRPOStageConfig
                ) -> tuple[list[list[CREReward]], dict[str, float]]:
        """The CRE reward of every sampled chain (``texts[i]``: item i's chains), and the source's own metrics of
        the step."""

    @abstractmethod
    def pair_kinds(self) -> dict[str, set[str]]:
        """pair id -> kinds (:func:`pair_kinds`) of every pair the evaluations may report."""

    def end_stage(self, stage_dir: Path) -> None:
        """A GRPO stage ended (finished, stopped or failed): record and release what its rewards held."""
