"""SQLite fenced store: the embedded default, durable on one host.

Three tables in one file: ``fences`` (resource -> highest token applied or
promised), ``data`` (resource, key -> value and the token that wrote it) and
``idempotency`` (resource, key -> the fence the write left, the token that applied
it, and when it was recorded).
Each write is one ``BEGIN IMMEDIATE`` transaction (the database-wide write lock
stands in for ``SELECT ... FOR UPDATE`` on the fence row), so check, apply and
advance commit together or not at all.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from fencing.errors import LeaseLost, StaleTokenError
from fencing.types import Op, Put, Record
from guard import fence as fence_rule
from guard.fence import FenceMode, Recorded
from guard.stores.base import (
    BatchedWrite,
    ResourceWrite,
    StoreManyResult,
    StoreWriteResult,
    Verdict,
)
from serving.sqlite_db import SQLiteDatabase

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
    # The token that applied a key, so a replay and a refusal can name it. Keys recorded
    # before have none: every mode but off leaves fence == token, so the fence stands in.
    """
    ALTER TABLE idempotency ADD COLUMN token INTEGER
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


def _recorded(conn: sqlite3.Connection, resource: str, key: str) -> Recorded | None:
    if not key:
        return None
    row = conn.execute(
        "SELECT fence, coalesce(token, fence) FROM idempotency WHERE resource = ? AND key = ?",
        (resource, key),
    ).fetchone()
    return Recorded(int(row[0]), int(row[1])) if row else None


def _record(conn: sqlite3.Connection, resource: str, key: str, fence: int, token: int) -> None:
    conn.execute(
        "INSERT INTO idempotency (resource, key, fence, token, recorded_at_ms)"
        " VALUES (?, ?, ?, ?, ?)",
        (resource, key, fence, token, time.time_ns() // 1_000_000),
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
) -> StoreWriteResult:
    """One write inside the caller's transaction: judged before anything changes."""
    judged = fence_rule.judge(
        resource,
        token,
        _fence_of(conn, resource),
        mode,
        has_key=bool(idempotency_key),
        recorded=_recorded(conn, resource, idempotency_key),
        live=False,  # strict mode: no lease backend here, fail closed
    )
    if judged.replayed:
        return StoreWriteResult(judged.fence, judged.replayed_by_token)
    _apply(conn, resource, token, ops, judged.fence)
    if idempotency_key:
        _record(conn, resource, idempotency_key, judged.fence, token)
    return StoreWriteResult(judged.fence)


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
    ) -> StoreWriteResult:
        return await self._db.transaction(
            lambda conn: _write(conn, resource, token, ops, idempotency_key, mode)
        )

    async def write_many(
        self,
        writes: Sequence[ResourceWrite],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> StoreManyResult:
        def tx(conn: sqlite3.Connection) -> StoreManyResult:
            claims = [(w.resource, w.token, _fence_of(conn, w.resource)) for w in writes]
            replay = fence_rule.judge_all(
                claims,
                mode,
                has_key=bool(idempotency_key),
                recorded=[_recorded(conn, w.resource, idempotency_key) for w in writes],
                live=[False] * len(writes),  # strict mode: no lease backend, fail closed
            )
            if replay is not None:
                return StoreManyResult(tuple(replay[0]), True, tuple(replay[1]))
            fences = fence_rule.admit_all(claims, mode)
            for w, new_fence in zip(writes, fences, strict=True):
                _apply(conn, w.resource, w.token, w.ops, new_fence)
                if idempotency_key:
                    _record(conn, w.resource, idempotency_key, new_fence, w.token)
            return StoreManyResult(tuple(fences))

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
                except (StaleTokenError, LeaseLost) as exc:  # refused before any change
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

    async def list_records(
        self, resource: str, prefix: str, after: str, limit: int
    ) -> list[tuple[str, Record]]:
        # TEXT compares by its UTF-8 bytes (BINARY): the order of code points. The
        # range on key lets the primary key's index do the work.
        def q(conn: sqlite3.Connection) -> list[tuple[str, Record]]:
            rows = conn.execute(
                "SELECT key, value, token FROM data WHERE resource = ? AND key > ? "
                "AND key >= ? AND substr(key, 1, length(?)) = ? ORDER BY key LIMIT ?",
                (resource, after, prefix, prefix, prefix, limit),
            ).fetchall()
            return [(str(k), Record(bytes(v), int(t))) for k, v, t in rows]

        return await self._db.query(q)

    async def fence(self, resource: str, token: int, mode: FenceMode = FenceMode.MONOTONIC) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            new = fence_rule.advance(resource, token, _fence_of(conn, resource))
            fence_rule.may_fence(resource, token, mode, live=False)
            _set_fence(conn, resource, new)
            return new

        return await self._db.transaction(tx)

    async def reset_fence(self, resource: str, to_token: int) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            before = _fence_of(conn, resource)
            _set_fence(conn, resource, fence_rule.reset_to(resource, to_token, before))
            return before

        return await self._db.transaction(tx)

    async def describe_fence(self, resource: str) -> int:
        return await self._db.query(lambda conn: _fence_of(conn, resource))

    async def prune_idempotency(self, older_than_ms: int) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            cur = conn.execute("DELETE FROM idempotency WHERE recorded_at_ms < ?", (older_than_ms,))
            return int(cur.rowcount)

        return await self._db.transaction(tx)
