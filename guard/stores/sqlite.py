"""SQLite fenced store: the embedded default, durable on one host.

Three tables in one file: ``fences`` (resource -> highest token applied or
promised), ``data`` (resource, key -> value and the token that wrote it) and
``idempotency`` (resource, key -> the write's outcome and when it was recorded).
Each write is one ``BEGIN IMMEDIATE`` transaction (the database-wide write lock
stands in for ``SELECT ... FOR UPDATE`` on the fence row), so check, apply and
advance commit together or not at all.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from fencing._sqlite import SQLiteDatabase
from fencing.errors import StaleTokenError
from fencing.types import Op, Put, Record
from guard import fence as fence_rule
from guard.fence import FenceMode
from guard.stores.base import BatchedWrite, ManyResult, ResourceWrite, Verdict, WriteResult

MIGRATIONS = [
    """
    CREATE TABLE fences (
        resource TEXT PRIMARY KEY,
        fence    INTEGER NOT NULL CHECK (fence >= 0)
    ) WITHOUT ROWID;
    CREATE TABLE data (
        resource TEXT NOT NULL,
        key      TEXT NOT NULL,
        value    BLOB NOT NULL,
        token    INTEGER NOT NULL,
        PRIMARY KEY (resource, key)
    ) WITHOUT ROWID;
    CREATE TABLE idempotency (
        resource       TEXT NOT NULL,
        key            TEXT NOT NULL,
        fence          INTEGER NOT NULL,
        recorded_at_ms INTEGER NOT NULL,
        PRIMARY KEY (resource, key)
    ) WITHOUT ROWID;
    CREATE INDEX idempotency_recorded_at ON idempotency (recorded_at_ms)
    """,
]


def _fence_of(conn: sqlite3.Connection, resource: str) -> int:
    row = conn.execute("SELECT fence FROM fences WHERE resource = ?", (resource,)).fetchone()
    return int(row[0]) if row else 0


def _set_fence(conn: sqlite3.Connection, resource: str, fence: int) -> None:
    conn.execute(
        "INSERT INTO fences (resource, fence) VALUES (?, ?) "
        "ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence",
        (resource, fence),
    )


def _recorded(conn: sqlite3.Connection, resource: str, key: str) -> int | None:
    row = conn.execute(
        "SELECT fence FROM idempotency WHERE resource = ? AND key = ?", (resource, key)
    ).fetchone()
    return int(row[0]) if row else None


def _record(conn: sqlite3.Connection, resource: str, key: str, fence: int) -> None:
    conn.execute(
        "INSERT INTO idempotency (resource, key, fence, recorded_at_ms) VALUES (?, ?, ?, ?)",
        (resource, key, fence, time.time_ns() // 1_000_000),
    )


def _apply(
    conn: sqlite3.Connection, resource: str, token: int, ops: Sequence[Op], new_fence: int
) -> None:
    for op in ops:
        if isinstance(op, Put):
            conn.execute(
                "INSERT INTO data (resource, key, value, token) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (resource, key) DO UPDATE SET "
                "value = excluded.value, token = excluded.token",
                (resource, op.key, op.value, token),
            )
        else:
            conn.execute("DELETE FROM data WHERE resource = ? AND key = ?", (resource, op.key))
    _set_fence(conn, resource, new_fence)


def _write(
    conn: sqlite3.Connection,
    resource: str,
    token: int,
    ops: Sequence[Op],
    idempotency_key: str,
    mode: FenceMode,
) -> WriteResult:
    """One write inside the caller's transaction: judged before anything changes."""
    if idempotency_key:
        recorded = _recorded(conn, resource, idempotency_key)
        if recorded is not None:
            return WriteResult(recorded, replayed=True)
    new_fence = fence_rule.admit(resource, token, _fence_of(conn, resource), mode)
    _apply(conn, resource, token, ops, new_fence)
    if idempotency_key:
        _record(conn, resource, idempotency_key, new_fence)
    return WriteResult(new_fence)


class SQLiteStore:
    """Fences and data in one SQLite file (``sqlite:///path/to/guard.db``)."""

    name = "sqlite"
    supports_strict = False
    commit_concurrency = 1

    def __init__(self, path: str | Path) -> None:
        self._db = SQLiteDatabase(path, MIGRATIONS)

    async def open(self) -> None:
        await self._db.open()

    async def close(self) -> None:
        await self._db.close()

    async def healthy(self) -> bool:
        """A read on the database thread answers (see ``HealthProbe``)."""
        return await self._db.healthy()

    async def write(
        self,
        resource: str,
        token: int,
        ops: Sequence[Op],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> WriteResult:
        return await self._db.transaction(
            lambda conn: _write(conn, resource, token, ops, idempotency_key, mode)
        )

    async def write_many(
        self,
        writes: Sequence[ResourceWrite],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> ManyResult:
        def tx(conn: sqlite3.Connection) -> ManyResult:
            if idempotency_key and _recorded(conn, writes[0].resource, idempotency_key):
                return ManyResult(
                    tuple(
                        _recorded(conn, w.resource, idempotency_key) or _fence_of(conn, w.resource)
                        for w in writes
                    ),
                    replayed=True,
                )
            fences = fence_rule.admit_all(
                [(w.resource, w.token, _fence_of(conn, w.resource)) for w in writes], mode
            )
            for w, new_fence in zip(writes, fences, strict=True):
                _apply(conn, w.resource, w.token, w.ops, new_fence)
                if idempotency_key:
                    _record(conn, w.resource, idempotency_key, new_fence)
            return ManyResult(tuple(fences))

        return await self._db.transaction(tx)

    async def write_batch(
        self, writes: Sequence[BatchedWrite], mode: FenceMode = FenceMode.MONOTONIC
    ) -> list[Verdict]:
        def tx(conn: sqlite3.Connection) -> list[Verdict]:
            verdicts: list[Verdict] = []
            for w in writes:
                try:
                    verdicts.append(
                        _write(conn, w.resource, w.token, w.ops, w.idempotency_key, mode)
                    )
                except StaleTokenError as exc:  # refused before it changed anything
                    verdicts.append(exc)
            return verdicts

        # One commit, so one fsync, for the whole batch.
        return await self._db.transaction(tx)

    async def read(self, resource: str, key: str) -> Record | None:
        def q(conn: sqlite3.Connection) -> Record | None:
            row = conn.execute(
                "SELECT value, token FROM data WHERE resource = ? AND key = ?", (resource, key)
            ).fetchone()
            return Record(bytes(row[0]), int(row[1])) if row else None

        return await self._db.query(q)

    async def fence(self, resource: str, token: int) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            new = fence_rule.advance(resource, token, _fence_of(conn, resource))
            _set_fence(conn, resource, new)
            return new

        return await self._db.transaction(tx)

    async def describe_fence(self, resource: str) -> int:
        return await self._db.query(lambda conn: _fence_of(conn, resource))

    async def prune_idempotency(self, older_than_ms: int) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            cur = conn.execute("DELETE FROM idempotency WHERE recorded_at_ms < ?", (older_than_ms,))
            return int(cur.rowcount)

        return await self._db.transaction(tx)
