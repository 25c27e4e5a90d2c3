"""A Bradley-Terry RM's training pairs: the seen users' pairs of the training split as RM inputs, encoded per
input mode exactly as the scalar RM scores them at evaluation (:class:`~pr_rlhf.reward.scalar.ScalarRMEncoder`),
and which pairs each step trains on.

Cold-start users are never trained on (their pairs are the evaluation's unseen users); the other users'
held-out splits (val, test) are never read here.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pr_rlhf.reward.inputs import InputMode, RMInput, history_rows_by_user, rm_inputs_from_rows
from pr_rlhf.reward.scalar import ScalarRMEncoder
from pr_rlhf.shards import ShardReader


class TrainingDataError(ValueError):
    """No pairs to train on; the message names the shards and the split."""


@dataclass
class TrainingPairs:
    inputs: list[RMInput]
    users: int
    cold_start_users_excluded: int


def training_pairs(shards: str, split: str, history_pairs: int = 0) -> TrainingPairs:
    """The pairs of ``split`` whose users are not cold-start users (the profiles table's flag), each with the
    user's first ``history_pairs`` train pairs other than itself (what an RM in input mode 'history' reads; at
    evaluation a held-out pair gets the first ``history_pairs`` of them)."""
    reader = ShardReader(shards)
    if split not in reader.splits("pairs"):
        raise TrainingDataError(f"{shards}: no pairs in split {split!r} (splits: {reader.splits('pairs')})")
    profiles = {(r["user_id"], r["subset"]): r for r in reader.iter_rows("profiles")}
    cold = reader.cold_start_users()
    rows = [r for r in reader.iter_rows("pairs", split) if (r["user_id"], r["subset"]) not in cold]
    if not rows:
        raise TrainingDataError(f"{shards}: no {split} pairs of seen users to train on")
    histories = history_rows_by_user(reader.iter_rows("histories"), reader.iter_rows("pairs", "train")) \
        if history_pairs > 0 else None
    return TrainingPairs(rm_inputs_from_rows(rows, histories, profiles, history_pairs),
                         len({(r["user_id"], r["subset"]) for r in rows}), len(cold))


def encode_pairs(encoder: ScalarRMEncoder, inputs: Sequence[RMInput], mode: InputMode,
                 top_k: int) -> tuple[list[list[int]], list[list[int]]]:
    """(chosen, rejected) token ids of every pair as the scalar RM reads them in ``mode``."""
    return ([encoder.encode_input(inp, inp.chosen, mode, top_k) for inp in inputs],
            [encoder.encode_input(inp, inp.rejected, mode, top_k) for inp in inputs])


def step_pairs(n: int, batch_size: int, step: int, seed: int) -> np.ndarray:
    """The pair indices of ``step``: consecutive slices of one seeded permutation per epoch, so a resumed run
    trains on exactly the pairs it would have, from the step number alone."""
    positions = np.arange(step * batch_size, (step + 1) * batch_size)
    epochs = positions // n
    out = np.empty(batch_size, dtype=np.int64)
    for epoch in np.unique(epochs):
        at = epochs == epoch
        out[at] = np.random.default_rng([seed, int(epoch)]).permutation(n)[positions[at] % n]
    return out
