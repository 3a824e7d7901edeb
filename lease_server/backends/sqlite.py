"""SQLite lease backend: the embedded default, durable on one host.

One row per resource, never deleted: ``counter`` is the last token issued, so a
restart (SIGTERM or SIGKILL) never hands out a token twice (G1). Each call is one
``BEGIN IMMEDIATE`` transaction that reads the row, applies the pure rule from
:mod:`lease_server.leases`, writes the row back and appends the change's events to
the ``events`` table, numbered from the single ``event_log`` row (whose update,
under SQLite's one write lock, serializes appenders: revisions commit in order).
Expiry uses this host's clock.

Lease calls that arrive together (:mod:`lease_server.grouped`) share one such
transaction (:meth:`SQLiteBackend.lease_steps`): one commit, one fsync.

Several lease-server processes may share one file: the write lock serializes
them, and each sees the others' events by polling (SQLite cannot notify).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from fencing.errors import LeaseLost
from fencing.types import LeaseState
from lease_server import leases
from lease_server.clock import Clock, SystemClock
from lease_server.leases import (
    EventPage,
    Grant,
    Held,
    LeaseRecord,
    LeaseStep,
    LoggedEvent,
    ReleaseItem,
    RenewItem,
    Scope,
    StepOutcome,
    Transition,
    TransitionKind,
)
from serving.sqlite_db import SQLiteDatabase

MIGRATIONS = [
    # 1: one row per resource; counter never decreases and the row is never deleted.
    """
    CREATE TABLE leases (
        resource      TEXT PRIMARY KEY,
        counter       INTEGER NOT NULL CHECK (counter >= 0),
        holder        TEXT NOT NULL DEFAULT '',
        token         INTEGER NOT NULL DEFAULT 0,
        expires_at_ms INTEGER NOT NULL DEFAULT 0,
        request_id    TEXT NOT NULL DEFAULT ''
    ) WITHOUT ROWID
    """,
    # 2: the event log. One row of counters; events keyed by revision, pruned from the
    # oldest; a partial index lets the sweeper find due leases without a scan.
    """
    CREATE TABLE event_log (
        id                INTEGER PRIMARY KEY CHECK (id = 1),
        head              INTEGER NOT NULL CHECK (head >= 0),
        compacted_through INTEGER NOT NULL CHECK (compacted_through >= 0)
    );
    INSERT INTO event_log (id, head, compacted_through) VALUES (1, 0, 0);
    CREATE TABLE events (
        revision INTEGER PRIMARY KEY,
        kind     TEXT NOT NULL,
        resource TEXT NOT NULL,
        token    INTEGER NOT NULL,
        holder   TEXT NOT NULL,
        ttl_ms   INTEGER NOT NULL
    );
    CREATE INDEX leases_due ON leases (expires_at_ms) WHERE token != 0
    """,
    # 3: the log's identity, drawn once with the log: a watcher's resume cursor is a
    # revision of this log, and means nothing in another file (or a recreated one).
    """
    CREATE TABLE event_log_identity (
        id     INTEGER PRIMARY KEY CHECK (id = 1),
        log_id TEXT NOT NULL
    );
    INSERT INTO event_log_identity (id, log_id) VALUES (1, lower(hex(randomblob(16))))
    """,
    # 4: events of job claims, appended by the SQLite queue backend in its own transaction
    # (lease_server/queue/backends/sqlite.py attaches this file): the job's id and queue.
    """
    ALTER TABLE events ADD COLUMN job_id INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE events ADD COLUMN queue TEXT NOT NULL DEFAULT ''
    """,
    # 5: the lease's own ttl, which a renewal naming none extends it by (0: not known,
    # a lease granted before this column; leases.renew_ttl says what it renews with).
    """
    ALTER TABLE leases ADD COLUMN ttl_ms INTEGER NOT NULL DEFAULT 0
    """,
]

_SELECT = (
    "SELECT counter, holder, token, expires_at_ms, request_id, ttl_ms FROM leases"
    " WHERE resource = ?"
)
_UPSERT = """
INSERT INTO leases (resource, counter, holder, token, expires_at_ms, request_id, ttl_ms)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (resource) DO UPDATE SET
    counter = excluded.counter, holder = excluded.holder, token = excluded.token,
    expires_at_ms = excluded.expires_at_ms, request_id = excluded.request_id,
    ttl_ms = excluded.ttl_ms
"""


def _load(conn: sqlite3.Connection, resource: str) -> LeaseRecord:
    row = conn.execute(_SELECT, (resource,)).fetchone()
    return LeaseRecord(resource, *row) if row else LeaseRecord(resource)


#: Resources per ``IN (...)`` of :func:`_load_many`: under SQLite's smallest limit on the
#: parameters of one statement (999 before 3.32).
_LOAD_CHUNK = 500


def _load_many(conn: sqlite3.Connection, resources: Sequence[str]) -> dict[str, LeaseRecord]:
    """The records of ``resources`` (a missing one as new), a statement per 500: many
    calls' records read in one go instead of a statement each."""
    records = {resource: LeaseRecord(resource) for resource in resources}
    names = list(records)
    for start in range(0, len(names), _LOAD_CHUNK):
        chunk = names[start : start + _LOAD_CHUNK]
        marks = ",".join("?" * len(chunk))
        for row in conn.execute(
            "SELECT resource, counter, holder, token, expires_at_ms, request_id, ttl_ms"
            f" FROM leases WHERE resource IN ({marks})",
            chunk,
        ):
            records[row[0]] = LeaseRecord(*row)
    return records


def _row(record: LeaseRecord) -> tuple[str, int, str, int, int, str, int]:
    return (
        record.resource,
        record.counter,
        record.holder,
        record.token,
        record.expires_at_ms,
        record.request_id,
        record.ttl_ms,
    )


def _store(conn: sqlite3.Connection, record: LeaseRecord) -> None:
    conn.execute(_UPSERT, _row(record))


# Byte-wise (BINARY collation: UTF-8 bytes, so code point order); the primary key
# serves the range from the prefix on.
_LIST_HELD = (
    "SELECT resource, counter, holder, token, expires_at_ms, request_id, ttl_ms FROM leases "
    "WHERE resource >= ? AND resource > ? AND substr(resource, 1, length(?)) = ? "
    "AND token != 0 AND expires_at_ms > ? ORDER BY resource LIMIT ?"
)

_DUE = (
    "SELECT resource, counter, holder, token, expires_at_ms, request_id, ttl_ms FROM leases "
    "WHERE token != 0 AND expires_at_ms <= ? ORDER BY expires_at_ms, resource LIMIT ?"
)
_EVENT_COLUMNS = "revision, kind, resource, token, holder, ttl_ms, job_id, queue"


def _head(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT head FROM event_log WHERE id = 1").fetchone()[0])


def _append(conn: sqlite3.Connection, changes: Sequence[Transition]) -> list[LoggedEvent]:
    """Number ``changes`` and insert them, inside the caller's write transaction."""
    if not changes:
        return []
    head = _head(conn)
    events = [change.numbered(head + i) for i, change in enumerate(changes, start=1)]
    conn.executemany(
        f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (e.revision, e.kind.value, e.resource, e.token, e.holder, e.ttl_ms, e.job_id, e.queue)
            for e in events
        ],
    )
    conn.execute("UPDATE event_log SET head = ? WHERE id = 1", (events[-1].revision,))
    return events


def _change(
    conn: sqlite3.Connection, old: LeaseRecord, new: LeaseRecord, now_ms: int
) -> list[LoggedEvent]:
    """Store ``new`` in place of ``old`` and append what changed."""
    if new == old:
        return []
    _store(conn, new)
    return _append(conn, leases.transitions(old, new, now_ms))


def _change_all(
    conn: sqlite3.Connection,
    old: Sequence[LeaseRecord],
    new: Sequence[LeaseRecord],
    now_ms: int,
) -> list[LoggedEvent]:
    """Store every changed record and append all their transitions with one append.

    (Records of one batch are distinct resources, so their order does not matter.)
    """
    changes: list[Transition] = []
    rows = []
    for before, after in zip(old, new, strict=True):
        if after != before:
            rows.append(_row(after))
            changes += leases.transitions(before, after, now_ms)
    if rows:
        conn.executemany(_UPSERT, rows)
    return _append(conn, changes)


def _event(row: tuple[int, str, str, int, str, int, int, str]) -> LoggedEvent:
    revision, kind, resource, token, holder, ttl_ms, job_id, queue = row
    return LoggedEvent(
        revision, TransitionKind(kind), resource, token, holder, ttl_ms, job_id, queue
    )


class SQLiteBackend:
    """Lease state in one SQLite file (``sqlite:///path/to/leases.db``)."""

    name = "sqlite"

    def __init__(self, path: str | Path, clock: Clock | None = None) -> None:
        self._db = SQLiteDatabase(path, MIGRATIONS)
        self._clock = clock or SystemClock()
        self._listeners: list[Callable[[int], None]] = []

    async def open(self) -> None:
        await self._db.open()

    async def close(self) -> None:
        await self._db.close()

    async def healthy(self) -> bool:
        """A read on the database thread answers (see ``HealthProbe``)."""
        return await self._db.healthy()

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, request_id: str
    ) -> Grant | Held:
        def tx(conn: sqlite3.Connection) -> tuple[Grant | Held, list[LoggedEvent]]:
            now = self._clock.now_ms()
            old = _load(conn, resource)
            new, outcome = leases.acquire(old, holder, ttl_ms, request_id, now)
            return outcome, _change(conn, old, new, now)

        outcome, events = await self._db.transaction(tx)
        self._notify(events)
        return outcome

    async def renew(self, resource: str, token: int, holder: str, ttl_ms: int) -> Grant:
        def tx(conn: sqlite3.Connection) -> tuple[Grant, list[LoggedEvent]]:
            now = self._clock.now_ms()
            old = _load(conn, resource)
            new, grant = leases.renew(old, token, holder, ttl_ms, now)
            return grant, _change(conn, old, new, now)

        grant, events = await self._db.transaction(tx)
        self._notify(events)
        return grant

    async def release(self, resource: str, token: int, holder: str) -> None:
        def tx(conn: sqlite3.Connection) -> list[LoggedEvent]:
            now = self._clock.now_ms()
            old = _load(conn, resource)
            return _change(conn, old, leases.release(old, token, holder, now), now)

        self._notify(await self._db.transaction(tx))

    async def describe(self, resource: str) -> LeaseState:
        def q(conn: sqlite3.Connection) -> LeaseState:
            return leases.describe(_load(conn, resource), self._clock.now_ms())

        return await self._db.query(q)

    async def list_held(self, prefix: str, after: str, limit: int) -> list[LeaseState]:
        def q(conn: sqlite3.Connection) -> list[LeaseState]:
            now = self._clock.now_ms()
            rows = conn.execute(_LIST_HELD, (prefix, after, prefix, prefix, now, limit))
            return [leases.describe(LeaseRecord(*row), now) for row in rows]

        return await self._db.query(q)

    # -- many at once: one transaction, one commit, the events appended together -------------

    async def acquire_many(
        self, resources: Sequence[str], holder: str, ttl_ms: int, request_id: str
    ) -> list[Grant] | Held:
        def tx(conn: sqlite3.Connection) -> tuple[list[Grant] | Held, list[LoggedEvent]]:
            now = self._clock.now_ms()
            loaded = _load_many(conn, resources)
            old = [loaded[r] for r in resources]
            new, outcome = leases.acquire_all(old, holder, ttl_ms, request_id, now)
            return outcome, _change_all(conn, old, new, now)

        outcome, events = await self._db.transaction(tx)
        self._notify(events)
        return outcome

    async def renew_many(self, items: Sequence[RenewItem]) -> list[Grant | LeaseLost]:
        def tx(conn: sqlite3.Connection) -> tuple[list[Grant | LeaseLost], list[LoggedEvent]]:
            now = self._clock.now_ms()
            outcomes: list[Grant | LeaseLost] = []
            old: list[LeaseRecord] = []
            new: list[LeaseRecord] = []
            loaded = _load_many(conn, [item.resource for item in items])
            for item in items:
                record = loaded[item.resource]
                try:
                    renewed, grant = leases.renew(record, item.token, item.holder, item.ttl_ms, now)
                except LeaseLost as exc:
                    outcomes.append(exc)
                    continue
                old.append(record)
                new.append(renewed)
                outcomes.append(grant)
            return outcomes, _change_all(conn, old, new, now)

        outcomes, events = await self._db.transaction(tx)
        self._notify(events)
        return outcomes

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[LeaseLost | None]:
        def tx(conn: sqlite3.Connection) -> tuple[list[LeaseLost | None], list[LoggedEvent]]:
            now = self._clock.now_ms()
            outcomes: list[LeaseLost | None] = []
            old: list[LeaseRecord] = []
            new: list[LeaseRecord] = []
            loaded = _load_many(conn, [item.resource for item in items])
            for item in items:
                record = loaded[item.resource]
                try:
                    released = leases.release(record, item.token, item.holder, now)
                except LeaseLost as exc:
                    outcomes.append(exc)
                    continue
                old.append(record)
                new.append(released)
                outcomes.append(None)
            return outcomes, _change_all(conn, old, new, now)

        outcomes, events = await self._db.transaction(tx)
        self._notify(events)
        return outcomes

    #: One writer: SQLite's write lock serializes transactions anyway.
    step_concurrency = 1

    async def lease_steps(self, steps: Sequence[LeaseStep]) -> list[StepOutcome]:
        """Each step as its single call, in one transaction (one commit, one fsync),
        the events appended together; a step's refusal changes nothing of its own."""

        def tx(conn: sqlite3.Connection) -> tuple[list[StepOutcome], list[LoggedEvent]]:
            now = self._clock.now_ms()
            outcomes: list[StepOutcome] = []
            # The record as the steps so far left it (a resource may come twice).
            current = _load_many(conn, [op.resource for op in steps])
            changed: dict[str, LeaseRecord] = {}
            changes: list[Transition] = []
            for op in steps:
                old = current[op.resource]
                new, outcome = leases.step(old, op, now)
                current[op.resource] = new
                if new != old:
                    changed[op.resource] = new
                    changes += leases.transitions(old, new, now)
                outcomes.append(outcome)
            if changed:
                conn.executemany(_UPSERT, [_row(record) for record in changed.values()])
            return outcomes, _append(conn, changes)

        outcomes, events = await self._db.transaction(tx)
        self._notify(events)
        return outcomes

    def on_release(self, callback: Callable[[str], None]) -> None:
        # Only this process changes this state: the service already wakes its own waiters.
        return None

    # -- the event log -----------------------------------------------------------------------

    def _notify(self, events: list[LoggedEvent]) -> None:
        if events:
            self.appended(events[-1].revision)

    @property
    def path(self) -> str:
        """The database file (the SQLite queue backend attaches it to log job events)."""
        return self._db.path

    def appended(self, head: int) -> None:
        """Tell this process's listeners that events up to ``head`` were committed: by
        this backend, or by the queue backend appending job events to this file."""
        for listener in self._listeners:
            listener(head)

    async def head_revision(self) -> int:
        return await self._db.query(_head)

    async def log_id(self) -> str:
        def q(conn: sqlite3.Connection) -> str:
            row = conn.execute("SELECT log_id FROM event_log_identity WHERE id = 1").fetchone()
            return str(row[0])

        return await self._db.query(q)

    async def events_after(self, revision: int, scope: Scope, limit: int) -> EventPage:
        if scope.resource:
            where, args = "resource = ?", [scope.resource]
        elif scope.prefix:
            where, args = "substr(resource, 1, length(?)) = ?", [scope.prefix, scope.prefix]
        else:
            where, args = "1", []

        def q(conn: sqlite3.Connection) -> EventPage:
            # Head first: every revision up to it is committed (appends are serialized).
            head = _head(conn)
            rows = conn.execute(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE revision > ? AND revision <= ? "
                f"AND {where} ORDER BY revision LIMIT ?",
                [revision, head, *args, max(1, limit)],
            ).fetchall()
            # Compaction last, so a prune racing this read is reported rather than hidden.
            (compacted,) = conn.execute(
                "SELECT compacted_through FROM event_log WHERE id = 1"
            ).fetchone()
            return EventPage(tuple(_event(row) for row in rows), head, int(compacted))

        return await self._db.query(q)

    async def expire_due(self, limit: int) -> list[LoggedEvent]:
        # A read first, so the common case (nothing due) never takes the write lock.
        now = self._clock.now_ms()
        if not await self._db.query(lambda conn: conn.execute(_DUE, (now, 1)).fetchone()):
            return []

        def tx(conn: sqlite3.Connection) -> list[LoggedEvent]:
            now = self._clock.now_ms()
            appended: list[LoggedEvent] = []
            # Re-read inside the write lock: another server may have swept them already.
            for row in conn.execute(_DUE, (now, limit)).fetchall():
                old = LeaseRecord(*row)
                appended += _change(conn, old, leases.expire(old, now), now)
            return appended

        events = await self._db.transaction(tx)
        self._notify(events)
        return events

    async def prune_events(self, keep: int) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            cutoff = _head(conn) - max(0, keep)
            cur = conn.execute("DELETE FROM events WHERE revision <= ?", (cutoff,))
            if cur.rowcount:
                conn.execute(
                    "UPDATE event_log SET compacted_through = max(compacted_through, ?) "
                    "WHERE id = 1",
                    (cutoff,),
                )
            return int(cur.rowcount)

        return await self._db.transaction(tx)

    def on_events(self, callback: Callable[[int], None]) -> None:
        self._listeners.append(callback)
