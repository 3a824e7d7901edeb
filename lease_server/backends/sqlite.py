"""SQLite lease backend: the embedded default, durable on one host.

One row per resource, never deleted: ``counter`` is the last token issued, so a
restart (SIGTERM or SIGKILL) never hands out a token twice (G1). Each call is one
``BEGIN IMMEDIATE`` transaction that reads the row, applies the pure rule from
:mod:`lease_server.leases`, and writes the row back. Expiry uses this host's clock.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from fencing._sqlite import SQLiteDatabase
from lease_server import leases
from lease_server.clock import Clock, SystemClock
from lease_server.leases import Grant, Held, LeaseInfo, LeaseRecord

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
]

_SELECT = "SELECT counter, holder, token, expires_at_ms, request_id FROM leases WHERE resource = ?"
_UPSERT = """
INSERT INTO leases (resource, counter, holder, token, expires_at_ms, request_id)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (resource) DO UPDATE SET
    counter = excluded.counter, holder = excluded.holder, token = excluded.token,
    expires_at_ms = excluded.expires_at_ms, request_id = excluded.request_id
"""


def _load(conn: sqlite3.Connection, resource: str) -> LeaseRecord:
    row = conn.execute(_SELECT, (resource,)).fetchone()
    return LeaseRecord(resource, *row) if row else LeaseRecord(resource)


def _store(conn: sqlite3.Connection, record: LeaseRecord) -> None:
    conn.execute(
        _UPSERT,
        (
            record.resource,
            record.counter,
            record.holder,
            record.token,
            record.expires_at_ms,
            record.request_id,
        ),
    )


class SQLiteBackend:
    """Lease state in one SQLite file (``sqlite:///path/to/leases.db``)."""

    name = "sqlite"

    def __init__(self, path: str | Path, clock: Clock | None = None) -> None:
        self._db = SQLiteDatabase(path, MIGRATIONS)
        self._clock = clock or SystemClock()

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
        def tx(conn: sqlite3.Connection) -> Grant | Held:
            old = _load(conn, resource)
            new, outcome = leases.acquire(old, holder, ttl_ms, request_id, self._clock.now_ms())
            if new is not old:
                _store(conn, new)
            return outcome

        return await self._db.transaction(tx)

    async def renew(self, resource: str, token: int, holder: str, ttl_ms: int) -> Grant:
        def tx(conn: sqlite3.Connection) -> Grant:
            new, grant = leases.renew(
                _load(conn, resource), token, holder, ttl_ms, self._clock.now_ms()
            )
            _store(conn, new)
            return grant

        return await self._db.transaction(tx)

    async def release(self, resource: str, token: int, holder: str) -> None:
        def tx(conn: sqlite3.Connection) -> None:
            _store(conn, leases.release(_load(conn, resource), token, holder, self._clock.now_ms()))

        await self._db.transaction(tx)

    async def describe(self, resource: str) -> LeaseInfo:
        def q(conn: sqlite3.Connection) -> LeaseInfo:
            return leases.describe(_load(conn, resource), self._clock.now_ms())

        return await self._db.query(q)

    def on_release(self, callback: Callable[[str], None]) -> None:
        # Only this process changes this state: the service already wakes its own waiters.
        return None
