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
from fencing.types import Op, Put, Record
from guard import fence as fence_rule
from guard.fence import FenceMode
from guard.stores.base import WriteResult

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


class SQLiteStore:
    """Fences and data in one SQLite file (``sqlite:///path/to/guard.db``)."""

    name = "sqlite"
    supports_strict = False

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
        def tx(conn: sqlite3.Connection) -> WriteResult:
            if idempotency_key:
                row = conn.execute(
                    "SELECT fence FROM idempotency WHERE resource = ? AND key = ?",
                    (resource, idempotency_key),
                ).fetchone()
                if row:
                    return WriteResult(int(row[0]), replayed=True)
            new_fence = fence_rule.admit(resource, token, _fence_of(conn, resource), mode)
            for op in ops:
                if isinstance(op, Put):
                    conn.execute(
                        "INSERT INTO data (resource, key, value, token) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (resource, key) DO UPDATE SET "
                        "value = excluded.value, token = excluded.token",
                        (resource, op.key, op.value, token),
                    )
                else:
                    conn.execute(
                        "DELETE FROM data WHERE resource = ? AND key = ?", (resource, op.key)
                    )
            _set_fence(conn, resource, new_fence)
            if idempotency_key:
                conn.execute(
                    "INSERT INTO idempotency (resource, key, fence, recorded_at_ms) "
                    "VALUES (?, ?, ?, ?)",
                    (resource, idempotency_key, new_fence, time.time_ns() // 1_000_000),
                )
            return WriteResult(new_fence)

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
