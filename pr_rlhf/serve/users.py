"""The reward service's user-state store: each user's feedback pairs (their history, growing with every
interaction), their latest stated preferences and their online placement among the user prototypes.

One SQL database through SQLAlchemy Core: SQLite by default (one file beside the run, WAL, so readers never wait
for the writer and a process killed mid-write leaves the last committed state), any SQLAlchemy URL (PostgreSQL)
for replicas on several nodes. Every write is one transaction: a feedback row and its user's updated row commit
together or not at all. Rows are keyed by (tenant, user id): a tenant never sees another tenant's users.

Idempotency: each feedback carries a key, unique per tenant. Re-sending the same feedback with the same key
(a client retry after a timeout) stores nothing and answers the first receipt; the same key with different
content is a conflict (:class:`IdempotencyConflict`), never an overwrite.

The schema is versioned (``meta.schema_version``) and migrated forward when opened (:data:`MIGRATIONS`); a
database written by a newer release is refused rather than guessed at.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError

SCHEMA_VERSION = 2
DEFAULT_TENANT = "default"

metadata = sa.MetaData()
meta_table = sa.Table("meta", metadata, sa.Column("key", sa.String(64), primary_key=True),
                      sa.Column("value", sa.Text, nullable=False))
feedback_table = sa.Table(
    "feedback", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("user_id", sa.String(256), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),              # 1, 2, ... per user: arrival order
    sa.Column("idempotency_key", sa.String(256), nullable=False),
    sa.Column("digest", sa.String(64), nullable=False),        # of the content: a reused key must match it
    sa.Column("query", sa.Text, nullable=False),
    sa.Column("chosen", sa.Text, nullable=False),
    sa.Column("rejected", sa.Text, nullable=False),
    sa.Column("stated_preferences", sa.Text, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
    sa.UniqueConstraint("tenant", "idempotency_key", name="uq_feedback_key"),
    sa.UniqueConstraint("tenant", "user_id", "seq", name="uq_feedback_seq"),
)
users_table = sa.Table(   # schema 2: one row per user, updated in the feedback's transaction
    "users", metadata,
    sa.Column("tenant", sa.String(128), primary_key=True),
    sa.Column("user_id", sa.String(256), primary_key=True),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("updated", sa.Float, nullable=False),
    sa.Column("stated_preferences", sa.Text, nullable=False),
    sa.Column("vector_sum", sa.LargeBinary, nullable=True),    # float32 running sum of the feedback vectors
    sa.Column("vector_count", sa.Integer, nullable=False),
    sa.Column("prototype", sa.Integer, nullable=True),
)


class IdempotencyConflict(ValueError):
    """The key was already used for different content."""


class NewerSchema(RuntimeError):
    """The database was written by a newer schema than this release knows."""


@dataclass(frozen=True)
class FeedbackRecord:
    user_id: str
    query: str
    chosen: str
    rejected: str
    stated_preferences: str = ""
    idempotency_key: str = ""

    def digest(self) -> str:
        body = json.dumps([self.user_id, self.query, self.chosen, self.rejected, self.stated_preferences])
        return hashlib.sha256(body.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Receipt:
    user_id: str
    seq: int            # the feedback's position in the user's history (1 = first)
    size: int           # the user's history size after it
    duplicate: bool     # the key had been seen with this content: nothing was stored


@dataclass
class UserState:
    user_id: str
    size: int
    updated: float
    stated_preferences: str
    prototype: int | None
    vector: np.ndarray | None = None                       # mean feedback vector (None without an embedder)
    history: list[dict] = field(default_factory=list)      # [{question, chosen, rejected, seq}], oldest first

    def summary(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "size": self.size,
                "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.updated)),
                "prototype": self.prototype}


# ------------------------------------------------------------------------------------------------ schema versions

def _create_v1(conn: sa.Connection) -> None:
    meta_table.create(conn, checkfirst=True)
    feedback_table.create(conn, checkfirst=True)


def _v1_to_v2(conn: sa.Connection) -> None:
    """Schema 2 adds the per-user row (size, latest stated preferences, prototype state), backfilled from the
    feedback (no vectors: the prototype is assigned again at the user's next feedback)."""
    users_table.create(conn, checkfirst=True)
    rows = conn.execute(sa.select(feedback_table.c.tenant, feedback_table.c.user_id,
                                  sa.func.count().label("n"), sa.func.max(feedback_table.c.created).label("t"))
                        .group_by(feedback_table.c.tenant, feedback_table.c.user_id)).all()
    for tenant, user, n, t in rows:
        stated = conn.execute(sa.select(feedback_table.c.stated_preferences)
                              .where(feedback_table.c.tenant == tenant, feedback_table.c.user_id == user,
                                     feedback_table.c.stated_preferences != "")
                              .order_by(feedback_table.c.seq.desc()).limit(1)).scalar()
        conn.execute(users_table.insert().values(tenant=tenant, user_id=user, size=n, updated=t,
                                                 stated_preferences=stated or "", vector_sum=None,
                                                 vector_count=0, prototype=None))


# version reached -> the step that reaches it from the one before
MIGRATIONS: dict[int, Callable[[sa.Connection], None]] = {1: _create_v1, 2: _v1_to_v2}


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def absolute_url(url: str) -> str:
    """A relative SQLite path made absolute here (the driver's directory): replicas run elsewhere."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
        return sqlite_url(url.removeprefix("sqlite:///"))
    return url


class UserStore:
    """The store over one SQLAlchemy engine. Thread-safe (one connection per call from the engine's pool);
    several processes may share one SQLite file (WAL, writers take the lock up front and wait for each other)."""

    def __init__(self, url: str, *, busy_timeout_s: float = 30.0, max_retries: int = 8):
        self.url = url
        self.max_retries = max_retries
        self.sqlite = url.startswith("sqlite")
        if self.sqlite:
            path = url.split(":///", 1)[1] if ":///" in url else ""
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.engine = sa.create_engine(url, connect_args={"timeout": busy_timeout_s, "check_same_thread": False})
            sa.event.listen(self.engine, "connect", self._sqlite_connect)
            sa.event.listen(self.engine, "begin", self._sqlite_begin)
        else:
            self.engine = sa.create_engine(url, pool_pre_ping=True, isolation_level="READ COMMITTED")
        self.schema_version = self._migrate()

    @staticmethod
    def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None   # the driver's own implicit BEGIN off: _sqlite_begin emits it
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")   # WAL + NORMAL: a killed process loses nothing committed
        cur.close()

    @staticmethod
    def _sqlite_begin(conn: sa.Connection) -> None:
        # a write takes the lock up front (two writers never deadlock upgrading a read lock); reads stay deferred,
        # so in WAL they never wait for a writer
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("write") else "BEGIN")

    def _transaction(self) -> Any:
        return self.engine.execution_options(write=True).begin()

    def _retrying(self, work: Callable[[sa.Connection], Any]) -> Any:
        """Run ``work`` in a write transaction, again on a lost race (a unique key taken by a concurrent writer,
        a lock or serialization failure): the next attempt sees the winner's row."""
        for attempt in range(self.max_retries):
            try:
                with self._transaction() as conn:
                    return work(conn)
            except (IntegrityError, OperationalError):
                if attempt == self.max_retries - 1:
                    raise
                time.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    def _migrate(self) -> int:
        def work(conn: sa.Connection) -> int:
            meta_table.create(conn, checkfirst=True)
            row = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")).scalar()
            version = int(row) if row is not None else 0
            if version > SCHEMA_VERSION:
                raise NewerSchema(f"{self.display_url}: schema version {version}, this release reads up to "
                                  f"{SCHEMA_VERSION}; upgrade pr_rlhf")
            for step in range(version + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[step](conn)
            if version != SCHEMA_VERSION:
                values = {"key": "schema_version", "value": str(SCHEMA_VERSION)}
                if row is None:
                    conn.execute(meta_table.insert().values(**values))
                else:
                    conn.execute(meta_table.update().where(meta_table.c.key == "schema_version")
                                 .values(value=values["value"]))
            return SCHEMA_VERSION
        return self._retrying(work)

    @property
    def display_url(self) -> str:
        """The URL without its password (what errors and logs may show)."""
        return sa.engine.make_url(self.url).render_as_string(hide_password=True)

    # ------------------------------------------------------------------------------------------------ writes

    def add_feedback(self, tenant: str, record: FeedbackRecord, vector: np.ndarray | None = None,
                     assign: Callable[[np.ndarray], int] | None = None) -> Receipt:
        """Append one feedback pair to the user's history (one transaction). ``vector``: the feedback's
        embedding, added to the user's running sum; ``assign`` then places the user's mean vector (their
        prototype), incrementally: one nearest-prototype lookup, no re-clustering."""
        digest = record.digest()
        blob = None if vector is None else np.asarray(vector, dtype=np.float32).reshape(-1)

        def work(conn: sa.Connection) -> Receipt:
            seen = conn.execute(sa.select(feedback_table.c.user_id, feedback_table.c.seq, feedback_table.c.digest)
                                .where(feedback_table.c.tenant == tenant,
                                       feedback_table.c.idempotency_key == record.idempotency_key)).first()
            if seen is not None:
                if seen.digest != digest or seen.user_id != record.user_id:
                    raise IdempotencyConflict(f"idempotency_key {record.idempotency_key!r} was used for other "
                                              "feedback; a new feedback needs a new key")
                size = conn.execute(sa.select(users_table.c.size).where(
                    users_table.c.tenant == tenant, users_table.c.user_id == record.user_id)).scalar()
                return Receipt(record.user_id, seen.seq, int(size or seen.seq), True)
            user = conn.execute(self._user_select(tenant, record.user_id, lock=True)).first()
            now = time.time()
            size = (user.size if user is not None else 0) + 1
            total, count = _running_sum(user, blob)
            prototype = user.prototype if user is not None else None
            if total is not None and count and assign is not None:
                prototype = int(assign(total / count))
            stated = record.stated_preferences or (user.stated_preferences if user is not None else "")
            conn.execute(feedback_table.insert().values(
                tenant=tenant, user_id=record.user_id, seq=size, idempotency_key=record.idempotency_key,
                digest=digest, query=record.query, chosen=record.chosen, rejected=record.rejected,
                stated_preferences=record.stated_preferences, created=now))
            values = {"size": size, "updated": now, "stated_preferences": stated, "prototype": prototype,
                      "vector_sum": None if total is None else total.astype(np.float32).tobytes(),
                      "vector_count": count}
            if user is None:
                conn.execute(users_table.insert().values(tenant=tenant, user_id=record.user_id, **values))
            else:
                conn.execute(users_table.update().where(users_table.c.tenant == tenant,
                                                        users_table.c.user_id == record.user_id).values(**values))
            return Receipt(record.user_id, size, size, False)
        return self._retrying(work)

    def delete_user(self, tenant: str, user_id: str) -> int:
        """Forget a user: their feedback and their row, in one transaction; the number of feedback rows removed
        (0 and nothing done for a user the store does not hold)."""
        def work(conn: sa.Connection) -> int:
            gone = conn.execute(feedback_table.delete().where(feedback_table.c.tenant == tenant,
                                                              feedback_table.c.user_id == user_id)).rowcount
            conn.execute(users_table.delete().where(users_table.c.tenant == tenant, users_table.c.user_id == user_id))
            return int(gone)
        return self._retrying(work)

    # ------------------------------------------------------------------------------------------------ reads

    @staticmethod
    def _user_select(tenant: str, user_id: str, lock: bool = False) -> sa.Select:
        query = sa.select(users_table).where(users_table.c.tenant == tenant, users_table.c.user_id == user_id)
        return query.with_for_update() if lock else query

    def get_user(self, tenant: str, user_id: str, history: int | None = 0) -> UserState | None:
        """The user's state, with their last ``history`` feedback pairs (None: all), or None if unknown."""
        with self.engine.connect() as conn:
            row = conn.execute(self._user_select(tenant, user_id)).first()
            if row is None:
                return None
            pairs = self._history(conn, tenant, user_id, history) if history != 0 else []
        return _state(row, pairs)

    def users(self, tenant: str, user_ids: Iterable[str], history: int | None = 0) -> dict[str, UserState]:
        """Several users at once (one round trip per table): what a scoring batch reads."""
        ids = sorted(set(user_ids))
        if not ids:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(users_table).where(users_table.c.tenant == tenant,
                                                             users_table.c.user_id.in_(ids))).all()
            out = {r.user_id: _state(r, []) for r in rows}
            if history != 0 and out:
                for user, pairs in self._histories(conn, tenant, list(out), history).items():
                    out[user].history = pairs
        return out

    def same_prototype(self, tenant: str, prototype: int, exclude: str, limit: int) -> list[UserState]:
        """Up to ``limit`` other users of the tenant placed in ``prototype``, most feedback first (ties: user id),
        with their vectors: the candidates a cold user borrows history from."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(users_table).where(
                users_table.c.tenant == tenant, users_table.c.prototype == prototype,
                users_table.c.user_id != exclude).order_by(users_table.c.size.desc(), users_table.c.user_id)
                .limit(limit)).all()
        return [_state(r, []) for r in rows]

    def _history(self, conn: sa.Connection, tenant: str, user_id: str, last: int | None) -> list[dict]:
        return self._histories(conn, tenant, [user_id], last).get(user_id, [])

    @staticmethod
    def _histories(conn: sa.Connection, tenant: str, user_ids: list[str], last: int | None) -> dict[str, list]:
        f = feedback_table.c
        rows = conn.execute(sa.select(f.user_id, f.seq, f.query, f.chosen, f.rejected)
                            .where(f.tenant == tenant, f.user_id.in_(user_ids)).order_by(f.user_id, f.seq)).all()
        out: dict[str, list[dict]] = {}
        for r in rows:
            out.setdefault(r.user_id, []).append({"question": r.query, "chosen": r.chosen, "rejected": r.rejected,
                                                  "seq": r.seq})
        return {u: (pairs[-last:] if last else pairs) for u, pairs in out.items()}

    def count(self, tenant: str | None = None) -> tuple[int, int]:
        """(users, feedback rows), of one tenant or of all."""
        with self.engine.connect() as conn:
            users = sa.select(sa.func.count()).select_from(users_table)
            rows = sa.select(sa.func.count()).select_from(feedback_table)
            if tenant is not None:
                users = users.where(users_table.c.tenant == tenant)
                rows = rows.where(feedback_table.c.tenant == tenant)
            return int(conn.execute(users).scalar()), int(conn.execute(rows).scalar())

    # ------------------------------------------------------------------------------------------------ JSONL

    def export_jsonl(self, tenant: str | None = None) -> Iterator[dict]:
        """Every feedback row (of one tenant, or all), in arrival order per user: what `pr-rlhf users export`
        writes and `import` replays."""
        f = feedback_table.c
        query = sa.select(f.tenant, f.user_id, f.seq, f.idempotency_key, f.query, f.chosen, f.rejected,
                          f.stated_preferences, f.created).order_by(f.tenant, f.user_id, f.seq)
        if tenant is not None:
            query = query.where(f.tenant == tenant)
        with self.engine.connect() as conn:
            for r in conn.execute(query):
                yield dict(r._mapping)

    def close(self) -> None:
        self.engine.dispose()


def _running_sum(user: Any, vector: np.ndarray | None) -> tuple[np.ndarray | None, int]:
    total = None if user is None or user.vector_sum is None else np.frombuffer(user.vector_sum, dtype=np.float32)
    count = 0 if user is None else int(user.vector_count)
    if vector is None:
        return total, count
    if total is not None and total.shape != vector.shape:   # another embedder: start the sum again
        total, count = None, 0
    return (vector.copy() if total is None else total + vector), count + 1


def _state(row: Any, history: list[dict]) -> UserState:
    vector = None
    if row.vector_sum is not None and row.vector_count:
        vector = np.frombuffer(row.vector_sum, dtype=np.float32) / row.vector_count
    return UserState(row.user_id, int(row.size), float(row.updated), row.stated_preferences, row.prototype,
                     vector, history)


EXPORT_FIELDS = ("tenant", "user_id", "query", "chosen", "rejected", "stated_preferences", "idempotency_key")


def import_jsonl(store: UserStore, path: str | Path) -> tuple[int, int]:
    """Replay an export (one feedback per line, in each user's order) into ``store``; (stored, duplicates).
    Re-importing is safe: the idempotency keys come along. A bad line is an error naming the file, the line and
    the field, before anything is written."""
    path = Path(path)
    records: list[tuple[str, FeedbackRecord]] = []
    for number, raw in enumerate(path.read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: line {number}: not valid UTF-8 (byte {exc.start} of the line)") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: line {number}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {number}: expected a JSON object")
        for name in EXPORT_FIELDS:
            if not isinstance(row.get(name, "" if name == "stated_preferences" else None), str):
                raise ValueError(f"{path}: line {number}: field {name!r} missing or not a string")
        records.append((row["tenant"], FeedbackRecord(row["user_id"], row["query"], row["chosen"], row["rejected"],
                                                      row.get("stated_preferences", ""), row["idempotency_key"])))
    stored = sum(not store.add_feedback(tenant, rec).duplicate for tenant, rec in records)
    return stored, len(records) - stored
