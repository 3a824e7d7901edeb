"""SQLite group commit: transactions queued together share a commit, and fail alone."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from fencing.errors import BackendUnavailableError, LeaseLost
from serving.sqlite_db import SQLiteDatabase

MIGRATIONS = ["CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)"]


async def test_queued_transactions_commit_together_and_fail_alone(tmp_path: Path) -> None:
    db = SQLiteDatabase(tmp_path / "t.db", MIGRATIONS)
    await db.open()
    try:
        gate = asyncio.Event()
        loop = asyncio.get_running_loop()

        def slow(conn: sqlite3.Connection) -> str:
            # Holds the database thread while the others queue up behind it.
            asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(5)
            conn.execute("INSERT INTO t VALUES ('first', 1)")
            return "first"

        def insert(key: str) -> object:
            def tx(conn: sqlite3.Connection) -> str:
                conn.execute("INSERT INTO t VALUES (?, 1)", (key,))
                return key

            return tx

        def refused(conn: sqlite3.Connection) -> str:
            conn.execute("INSERT INTO t VALUES ('undone', 1)")
            raise LeaseLost(resource="r", token=1)

        def broken(conn: sqlite3.Connection) -> str:
            conn.execute("INSERT INTO t VALUES ('dup', 1)")
            conn.execute("INSERT INTO t VALUES ('dup', 2)")  # primary key violation
            return "never"

        first = asyncio.create_task(db.transaction(slow))
        await asyncio.sleep(0.05)
        rest = [
            asyncio.create_task(db.transaction(insert("a"))),  # type: ignore[arg-type]
            asyncio.create_task(db.transaction(refused)),
            asyncio.create_task(db.transaction(broken)),
            asyncio.create_task(db.transaction(insert("b"))),  # type: ignore[arg-type]
        ]
        gate.set()
        assert await first == "first"
        outcomes = await asyncio.gather(*rest, return_exceptions=True)
        assert outcomes[0] == "a" and outcomes[3] == "b"
        assert isinstance(outcomes[1], LeaseLost)
        assert isinstance(outcomes[2], BackendUnavailableError)
        rows = await db.query(lambda c: sorted(r[0] for r in c.execute("SELECT k FROM t")))
        assert rows == ["a", "b", "first"]
    finally:
        await db.close()
    with pytest.raises(BackendUnavailableError):
        await db.transaction(lambda c: None)
