"""The reward service's user store (pr_rlhf.serve.users) on SQLite and on a real local PostgreSQL server: idempotent
writes under 32 concurrent writers with retries (nothing lost, nothing duplicated), a process killed in the middle
of a write (no partial record), a reopened store keeps every user, the schema migrated from version 1 and a newer
one refused, tenants kept apart, JSONL export and import."""
from __future__ import annotations

import concurrent.futures
import itertools
import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from pr_rlhf.serve.users import (
    MIGRATIONS,
    SCHEMA_VERSION,
    FeedbackRecord,
    IdempotencyConflict,
    NewerSchema,
    UserStore,
    feedback_table,
    meta_table,
    sqlite_url,
)
from tests.optional import need
from tests.postgres_server import postgres_server

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()


@pytest.fixture(scope="module")
def postgres():
    need("pg8000")
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def url(request, tmp_path):
    """A fresh, empty database of each kind."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "users.sqlite")
    server = request.getfixturevalue("postgres")
    name = f"t{next(_names)}"
    engine = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    engine.dispose()
    return server.rsplit("/", 1)[0] + "/" + name


def record(user: str, key: str, chosen: str = "a", stated: str = "") -> FeedbackRecord:
    return FeedbackRecord(user, f"question of {key}", chosen, "b", stated, key)


def test_idempotency_conflict_and_delete(url):
    store = UserStore(url)
    first = store.add_feedback("t", record("u1", "k1", stated="short answers"))
    assert (first.seq, first.size, first.duplicate) == (1, 1, False)
    again = store.add_feedback("t", record("u1", "k1", stated="short answers"))
    assert (again.seq, again.size, again.duplicate) == (1, 1, True)
    with pytest.raises(IdempotencyConflict, match="k1"):
        store.add_feedback("t", record("u1", "k1", chosen="other"))
    store.add_feedback("t", record("u1", "k2"))
    state = store.get_user("t", "u1", history=None)
    assert state.size == 2 and [h["seq"] for h in state.history] == [1, 2]
    assert state.stated_preferences == "short answers"      # an empty one does not erase the last given
    assert store.get_user("other-tenant", "u1") is None       # tenants never see each other's users
    assert store.delete_user("other-tenant", "u1") == 0
    assert store.delete_user("t", "u1") == 2
    assert store.get_user("t", "u1") is None and store.count() == (0, 0)


def test_32_concurrent_writers_with_retries_lose_and_duplicate_nothing(url):
    """32 writers, 12 users, each feedback sent 1-3 times (a client retrying): every key stored exactly once,
    each user's sequence numbers 1..n without a gap, sizes equal to the rows."""
    store = UserStore(url)
    keys = [(f"u{i % 12}", f"key-{i}") for i in range(320)]

    def client(part: int) -> list[bool]:
        rng = random.Random(part)
        seen = []
        for user, key in keys[part::32]:
            for _ in range(rng.randint(1, 3)):
                seen.append(store.add_feedback("t", record(user, key, chosen=key)).duplicate)
        return seen

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        duplicates = [d for part in pool.map(client, range(32)) for d in part]
    assert duplicates.count(False) == len(keys)                  # each key stored once, the rest duplicates
    assert store.count("t") == (12, len(keys))
    rows = list(store.export_jsonl("t"))
    assert sorted(r["idempotency_key"] for r in rows) == sorted(k for _, k in keys)
    for user in {u for u, _ in keys}:
        state = store.get_user("t", user, history=None)
        assert [h["seq"] for h in state.history] == list(range(1, state.size + 1))
        assert {h["chosen"] for h in state.history} == {k for u, k in keys if u == user}


KILLER = textwrap.dedent("""
    import os, signal, sys
    import sqlalchemy as sa
    from pr_rlhf.serve.users import FeedbackRecord, UserStore

    store = UserStore(sys.argv[1])

    @sa.event.listens_for(store.engine, "after_cursor_execute")
    def die(conn, cursor, statement, *args):   # the feedback row written, the user's row not yet: killed
        if statement.lstrip().upper().startswith("INSERT INTO FEEDBACK"):
            os.kill(os.getpid(), signal.SIGKILL)

    store.add_feedback("t", FeedbackRecord("u1", "q", "killed", "b", "", "k-killed"))
""")


def test_a_process_killed_mid_write_leaves_no_partial_record_and_a_reopened_store_keeps_every_user(url, tmp_path):
    store = UserStore(url)
    for i in range(2):
        store.add_feedback("t", record("u1", f"k{i}"))
    store.add_feedback("t", record("u2", "k9"))
    store.close()
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    done = subprocess.run([sys.executable, str(script), url], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr[-2000:]           # SIGKILL, inside the transaction
    reopened = UserStore(url)
    assert reopened.count("t") == (2, 3)
    assert reopened.get_user("t", "u1").size == 2
    retry = reopened.add_feedback("t", FeedbackRecord("u1", "q", "killed", "b", "", "k-killed"))
    assert (retry.seq, retry.duplicate) == (3, False)            # the key was never stored: the retry stores it
    assert reopened.get_user("t", "u2", history=None).history[0]["chosen"] == "a"


def test_prototype_assignment_is_incremental(url):
    """The user's mean vector is re-placed at every feedback (the assign callback sees the running mean)."""
    store = UserStore(url)
    seen = []

    def assign(mean):
        seen.append(mean.copy())
        return int(mean[0] > 0)

    store.add_feedback("t", record("u1", "k1"), vector=np.array([1.0, 0.0]), assign=assign)
    store.add_feedback("t", record("u1", "k2"), vector=np.array([-3.0, 1.0]), assign=assign)
    np.testing.assert_allclose(seen[1], [-1.0, 0.5])
    state = store.get_user("t", "u1")
    assert state.prototype == 0
    np.testing.assert_allclose(state.vector, [-1.0, 0.5])


def test_schema_1_is_migrated_and_a_newer_schema_refused(url):
    engine = sa.create_engine(url)
    with engine.begin() as conn:   # a database as schema 1 wrote it: feedback only, no users table
        MIGRATIONS[1](conn)
        conn.execute(meta_table.insert().values(key="schema_version", value="1"))
        for seq, stated in ((1, "terse"), (2, "")):
            conn.execute(feedback_table.insert().values(
                tenant="t", user_id="old", seq=seq, idempotency_key=f"k{seq}", digest="x", query="q", chosen="c",
                rejected="r", stated_preferences=stated, created=1000.0 + seq))
    store = UserStore(url)
    assert store.schema_version == SCHEMA_VERSION
    state = store.get_user("t", "old", history=None)
    assert (state.size, state.stated_preferences, state.prototype) == (2, "terse", None)
    assert store.add_feedback("t", record("old", "k3")).seq == 3
    with engine.begin() as conn:
        conn.execute(meta_table.update().values(value=str(SCHEMA_VERSION + 1)))
    engine.dispose()
    with pytest.raises(NewerSchema, match="upgrade"):
        UserStore(url)


def test_export_import_round_trip(url, tmp_path):
    from pr_rlhf.serve.users import import_jsonl

    store = UserStore(url)
    for i in range(5):
        store.add_feedback("a" if i % 2 else "b", record(f"u{i % 3}", f"k{i}", stated=f"s{i}"))
    path = tmp_path / "users.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in store.export_jsonl()))
    target = UserStore(sqlite_url(tmp_path / "copy.sqlite"))
    assert import_jsonl(target, path) == (5, 0)
    assert import_jsonl(target, path) == (0, 5)                    # a second import: every key a duplicate
    for tenant in ("a", "b"):
        assert [(r["user_id"], r["seq"], r["chosen"]) for r in target.export_jsonl(tenant)] == \
            [(r["user_id"], r["seq"], r["chosen"]) for r in store.export_jsonl(tenant)]
