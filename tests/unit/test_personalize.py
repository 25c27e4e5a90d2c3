"""What the service's scoring reads from the user store (pr_rlhf.serve.personalize): the recent or relevant pairs
under the history size, a cold user's borrowed pairs from the most similar users of their prototype (placed
incrementally at each feedback), profile posts and stated preferences; the `pr-rlhf users` commands."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from pr_rlhf.configs.serve import UserStoreConfig
from pr_rlhf.serve.personalize import OnlineUsers, build_feedback_prototypes, select_pairs
from pr_rlhf.serve.schema import FeedbackItem, ScoreItem
from pr_rlhf.serve.users import UserStore, sqlite_url

ROOT = Path(__file__).resolve().parents[2]


class AxisEmbedder:
    """Texts starting 'left' point along x, 'right' along y: a chosen-minus-rejected vector says which side."""

    name = "axis"

    def encode(self, texts, batch_size=32):
        return np.array([[1.0, 0.0] if t.startswith("left") else [0.0, 1.0] if t.startswith("right")
                         else [0.5, 0.5] for t in texts], dtype=np.float32)


def fb(user: str, key: str, chosen: str, rejected: str, query: str = "q") -> FeedbackItem:
    return FeedbackItem(user_id=user, query=query, chosen=chosen, rejected=rejected, idempotency_key=key)


def online(tmp_path, **cfg) -> OnlineUsers:
    embedder = AxisEmbedder()
    index = build_feedback_prototypes({"L": [("left a", "right a")], "R": [("right b", "left b")],
                                       "L2": [("left c", "right c")]}, embedder, k=2)
    config = UserStoreConfig(url=sqlite_url(tmp_path / "u.sqlite"), **cfg)
    return OnlineUsers(config, store=UserStore(config.url), embedder=embedder, index=index)


def test_select_pairs_recent_or_relevant_in_arrival_order():
    history = [{"question": q, "seq": i} for i, q in enumerate(["film club", "tax forms", "film night", "garden"])]
    assert [h["seq"] for h in select_pairs(history, "x", 2, "recent")] == [2, 3]
    assert [h["seq"] for h in select_pairs(history, "start a film club", 2, "relevant")] == [0, 2]
    assert select_pairs(history[:1], "x", 3, "recent") == history[:1]


def test_a_cold_user_borrows_from_the_most_similar_users_of_their_prototype(tmp_path):
    users = online(tmp_path, neighbours=2, profile_items=0)
    users.add_feedback("t", [fb("ann", "a1", "left 1", "right 1"), fb("ann", "a2", "left 2", "right 2"),
                             fb("bo", "b1", "left 3", "right 3"), fb("cy", "c1", "right 4", "left 4"),
                             fb("cy", "c2", "right 5", "left 5")])
    new = users.add_feedback("t", [fb("dee", "d1", "left 6", "right 6")])[0]
    assert new.size == 1
    states = users.store.users("t", ["ann", "bo", "cy", "dee"])
    assert states["ann"].prototype == states["bo"].prototype == states["dee"].prototype != states["cy"].prototype
    (item,), (prov,) = users.personalize("t", [ScoreItem(user_id="dee", query="q", response="x")])
    # 1 own pair + 2 borrowed (the same side's users, more feedback first on a tie); the own pair stays the latest
    assert [h.chosen for h in item.history] == ["left 3", "left 2", "left 6"]
    assert prov.own == 1 and prov.borrowed_from == ["ann", "bo"]
    assert prov.pairs == [("bo", 1), ("ann", 2), ("dee", 1)]
    # the other side's users never lend: cy (2 pairs, alone in its prototype) borrows nothing
    (alone,), (prov_cy,) = users.personalize("t", [ScoreItem(user_id="cy", query="q", response="x")])
    assert prov_cy.own == 2 and prov_cy.borrowed_from == [] and [h.chosen for h in alone.history] == [
        "right 4", "right 5"]


def test_profile_posts_and_stated_preferences_fill_only_what_is_missing(tmp_path):
    users = online(tmp_path, neighbours=0, profile_items=2)
    users.add_feedback("t", [FeedbackItem(user_id="eve", query="film club", chosen="left film", rejected="right",
                                          stated_preferences="bullets", idempotency_key="e1"),
                             fb("eve", "e2", "left tax", "right", query="tax forms")])
    (item,), _ = users.personalize("t", [ScoreItem(user_id="eve", query="film club", response="x")])
    assert [p.text for p in item.profile] == ["left film", "left tax"] and item.stated_preferences == "bullets"
    given = ScoreItem(user_id="eve", query="q", response="x", stated_preferences="mine",
                      history=[{"chosen": "h", "rejected": "r"}], profile=[{"text": "post"}])
    (kept,), (prov,) = users.personalize("t", [given])
    assert kept == given and prov is None


def test_users_commands_export_import_and_prototypes(tmp_path):
    store = UserStore(sqlite_url(tmp_path / "a.sqlite"))
    for i in range(6):
        store.add_feedback("default", _record(f"u{i % 3}", f"k{i}"))
    cli = [sys.executable, "-m", "pr_rlhf.cli", "users"]
    out = tmp_path / "users.jsonl"
    run = subprocess.run([*cli, "export", str(out), "--url", store.url], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0 and "exported 6 feedback rows of 3 users" in run.stdout, run.stderr
    copy = sqlite_url(tmp_path / "b.sqlite")
    run = subprocess.run([*cli, "import", str(out), "--url", copy], cwd=ROOT, capture_output=True, text=True)
    assert "imported 6 feedback rows (0 already stored)" in run.stdout, run.stderr
    assert [json.loads(line)["chosen"] for line in out.read_text().splitlines()] == \
        [r["chosen"] for r in UserStore(copy).export_jsonl()]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(out.read_bytes().splitlines()[0] + b"\n" + b'{"tenant": "default", "user_id": 3}\n')
    run = subprocess.run([*cli, "import", str(bad), "--url", copy], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and "line 2" in run.stderr and "'user_id'" in run.stderr, run.stderr
    protos = tmp_path / "protos"
    run = subprocess.run([*cli, "prototypes", str(protos), "--url", copy, "--k", "2"], cwd=ROOT, capture_output=True,
                         text=True)
    assert "2 prototypes over 3 users" in run.stdout, run.stderr
    from pr_rlhf.scaling.index import PrototypeIndex

    index = PrototypeIndex.load(protos)
    assert index.k == 2 and sorted(index.user_ids) == ["u0", "u1", "u2"] and index.created["placement"] == "feedback"


def _record(user, key):
    from pr_rlhf.serve.users import FeedbackRecord

    return FeedbackRecord(user, "q", f"chosen {key}", "rejected", "", key)
