"""SQLite group commit: transactions queued together share a commit, and fail alone."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


async def test_a_burst_of_transactions_is_one_job_on_the_database_thread(tmp_path: Path) -> None:
    """Transactions queued while the thread is busy join the drain already queued rather
    than each queueing a job of its own (a thread wake-up and a future per call), and
    their outcomes reach the loop together."""
    db = SQLiteDatabase(tmp_path / "t.db", MIGRATIONS)
    await db.open()
    try:
        executor = db._executor
        assert executor is not None
        submitted: list[object] = []
        submit = executor.submit

        def counting(fn: Any, /, *args: Any) -> Any:
            submitted.append(fn)
            return submit(fn, *args)

        executor.submit = counting  # type: ignore[method-assign,assignment]
        gate = threading.Event()
        await db.run(lambda: None)  # warm: the thread exists
        blocker = asyncio.ensure_future(db.run(lambda: gate.wait(5)))
        await asyncio.sleep(0.05)
        before = len(submitted)

        def insert(i: int) -> Callable[[sqlite3.Connection], object]:
            return lambda c: c.execute("INSERT INTO t VALUES (?, ?)", (f"k{i}", i))

        burst = [asyncio.ensure_future(db.transaction(insert(i))) for i in range(50)]
        await asyncio.sleep(0.05)
        gate.set()
        await blocker
        await asyncio.gather(*burst)
        assert len(submitted) - before == 1, submitted[before:]
        rows = await db.query(lambda c: c.execute("SELECT count(*) FROM t").fetchone()[0])
        assert rows == 50
        # A transaction after the drain ended starts a drain of its own.
        before = len(submitted)
        await db.transaction(lambda c: c.execute("INSERT INTO t VALUES ('after', 0)"))
        assert len(submitted) - before == 1
    finally:
        await db.close()
