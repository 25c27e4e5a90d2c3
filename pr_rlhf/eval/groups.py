"""The held-out evaluation groups every study reports (P-GenRM's stages, the scaling grid, the headroom check, the
leaderboard): the pairs of seen users never trained on, and the pairs of cold-start users.

A seen user's val and test pairs are held out (their train pairs are history and training data); a cold-start
user's train pairs are only the few shown as history, so their test pairs are the group's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class EvalGroup:
    name: str
    users: Literal["seen", "cold_start"]   # as EvalConfig.users and the profiles table's cold_start flag say
    splits: tuple[str, ...]

    @property
    def split(self) -> str:
        """The splits as EvalConfig.split names them ('val+test')."""
        return "+".join(self.splits)

    @property
    def cold_start(self) -> bool:
        return self.users == "cold_start"


EVAL_GROUPS: dict[str, EvalGroup] = {g.name: g for g in (EvalGroup("seen", "seen", ("val", "test")),
                                                         EvalGroup("cold", "cold_start", ("test",)))}


def group_of(cold_start: bool) -> EvalGroup:
    """The group of a user's held-out pairs."""
    return EVAL_GROUPS["cold" if cold_start else "seen"]
