"""Opening a SQLite file another process is writing waits for it instead of failing.

A guard's workers, or a lease server and a guard, start together on one new file:
the first one creates it and migrates it while the next switches it to WAL. That
switch answers "database is locked" without waiting in SQLite's busy handler, so
opening retries it until the busy timeout.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import threading
from pathlib import Path

import pytest

from fencing.errors import BackendUnavailableError
from serving import sqlite_db
from serving.sqlite_db import SQLiteDatabase

MIGRATIONS = ["CREATE TABLE t (k TEXT PRIMARY KEY); CREATE TABLE u (k TEXT PRIMARY KEY)"]


def _writer_holding(path: Path) -> sqlite3.Connection:
    """A connection in the file's first (rollback-journal) mode, inside a write."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("CREATE TABLE other (x)")
    return conn


async def test_open_waits_for_a_writer_on_the_new_file(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    writer = _writer_holding(path)
    release = threading.Timer(0.3, lambda: writer.execute("COMMIT"))
    release.start()
    db = SQLiteDatabase(path, MIGRATIONS)
    try:
        await db.open()
        tables = await db.query(
            lambda c: {r[0] for r in c.execute("SELECT name FROM sqlite_master")}
        )
        assert {"t", "u", "other"} <= tables
    finally:
        release.join()
        writer.close()
        await db.close()


async def test_open_gives_up_after_the_busy_timeout_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_db, "BUSY_TIMEOUT_MS", 200)
    path = tmp_path / "held.db"
    writer = _writer_holding(path)
    db = SQLiteDatabase(path, MIGRATIONS)
    try:
        with pytest.raises(BackendUnavailableError, match=r"held\.db.*locked"):
            await db.open()
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        await db.close()


def _open(path: str, barrier: threading.Barrier) -> str:
    barrier.wait()
    db = SQLiteDatabase(path, MIGRATIONS)
    try:
        asyncio.run(db.open())
    except BackendUnavailableError as exc:
        return str(exc)
    finally:
        asyncio.run(db.close())
    return ""


def test_processes_opening_one_new_file_together_all_start(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(4) as pool:
        for round_ in range(6):
            barrier = manager.Barrier(4)
            path = str(tmp_path / f"round{round_}.db")
            errors = [e for e in pool.starmap(_open, [(path, barrier)] * 4) if e]
            assert errors == []
