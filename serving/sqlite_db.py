"""A SQLite connection owned by one worker thread, shared by the embedded backend and store.

SQLite calls block, so they run off the event loop on a dedicated single thread
that owns the connection (SQLite connections must not hop threads). The database
is opened in WAL mode with ``synchronous=FULL`` (a committed token or fence
survives power loss) and every write transaction starts with ``BEGIN IMMEDIATE``
so concurrent writers (even other processes on the same file) serialise instead of
failing on upgrade. Write transactions that queue up while the thread is busy share
one commit (group commit, see :meth:`SQLiteDatabase.transaction`): with
``synchronous=FULL`` the fsync is most of a commit's cost, and concurrent callers then
pay it once. Driver errors become ``BackendUnavailableError`` here, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from fencing.errors import BackendUnavailableError
from serving import urls

T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000

log = logging.getLogger(__name__)


def sqlite_path(url: str) -> str:
    """The file a ``sqlite:`` URL names: its path, as written.

    ``sqlite:///var/lib/fencing/leases.db`` is absolute; ``sqlite:data/leases.db``
    (or ``sqlite://data/leases.db``) is relative to the working directory;
    ``sqlite://`` alone is a private in-memory database.
    """
    parts = urlsplit(url)
    if parts.netloc:
        return parts.netloc + parts.path
    path = parts.path
    if path.startswith("//"):
        path = path[1:]
    return path or ":memory:"


def new_database(url: str) -> Path | None:
    """The file a ``sqlite:`` URL names, when it does not exist yet: opening it would
    create a new, empty database (and its directories). None for an existing file, an
    in-memory database or any other kind of URL."""
    if urls.kind(url) != urls.SQLITE:
        return None
    path = sqlite_path(url)
    if path == ":memory:" or Path(path).exists():
        return None
    return Path(path).absolute()


def warn_new(what: str, where: Path) -> None:
    """Log the WARNING of a fresh start (``what``: "data directory", "sqlite database"),
    which must be visible: a server whose data was lost (a container replaced without
    its volume) or whose path is mistyped also starts fresh, every counter back at 1."""
    log.warning(
        "%s %s is new: no earlier leases, counters or fences; tokens start at 1. If this "
        "server ran before, its data was lost (a container without a volume? a mistyped "
        "path?) and tokens will repeat",
        what,
        where,
        extra={"path": str(where)},
    )


def _busy(exc: sqlite3.Error) -> bool:
    """Whether another connection holds the lock ``exc`` was refused for."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, object]) -> None:
    if future.done():  # its caller went away; the transaction stands
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        assert isinstance(value, BaseException)
        future.set_exception(value)


class SQLiteDatabase:
    """One SQLite file, migrated on open, used through :meth:`run` and :meth:`transaction`."""

    def __init__(self, path: str | Path, migrations: Sequence[str]) -> None:
        self.path = str(path)
        self._migrations = list(migrations)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._pending: list[
            tuple[
                Callable[[sqlite3.Connection], Any], asyncio.Future[Any], asyncio.AbstractEventLoop
            ]
        ] = []
        self._pending_lock = threading.Lock()

    async def open(self) -> None:
        if self._executor is not None:
            return
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        await self.run(self._connect)

    def _connect(self) -> None:
        # Opening is retried while another process holds the file: switching a new
        # database to WAL (and its recovery) answers SQLITE_BUSY without calling the
        # busy handler, so two servers started together on one new file would
        # otherwise fail at random (a guard's workers do exactly that).
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        delay = 0.005
        while True:
            conn: sqlite3.Connection | None = None
            try:
                conn = sqlite3.connect(
                    self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000
                )
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                self._migrate(conn)
                self._conn = conn
                return
            except sqlite3.Error as exc:
                if conn is not None:
                    conn.close()
                if _busy(exc) and time.monotonic() + delay < deadline:
                    time.sleep(delay)
                    delay = min(delay * 2, 0.2)
                    continue
                raise BackendUnavailableError(
                    f"cannot open sqlite database {self.path}: {exc}"
                ) from exc

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            for number, script in enumerate(self._migrations, start=1):
                if number > version:
                    for statement in script.split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    conn.execute(f"PRAGMA user_version={number}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return

        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(executor, _close)
        executor.shutdown(wait=True)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the database thread."""
        if self._executor is None:
            raise BackendUnavailableError(f"sqlite database {self.path} is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` in a write transaction on the database thread; return its result
        once the transaction is committed (durable).

        Group commit: transactions that queue up while the thread is busy run together in
        one ``BEGIN IMMEDIATE`` ... ``COMMIT`` (one fsync for all), each inside its own
        ``SAVEPOINT``, so each still succeeds or fails alone: an exception in ``fn``
        undoes what ``fn`` wrote and reaches its caller only (our errors as they are,
        SQLite errors as ``BackendUnavailableError`` with the cause chained). If the
        shared COMMIT fails, every transaction of it fails with
        ``BackendUnavailableError``. An idle database commits a lone transaction at once.
        """
        if self._executor is None:
            raise BackendUnavailableError(f"sqlite database {self.path} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._pending_lock:
            self._pending.append((fn, future, loop))
        self._executor.submit(self._commit_pending)
        return await future

    def _commit_pending(self) -> None:
        """On the database thread: commit everything queued so far, together."""
        with self._pending_lock:
            batch, self._pending = self._pending, []
        if not batch:
            return  # an earlier run took this job's transaction along
        conn = self._conn
        outcomes: list[tuple[bool, object]] = []
        try:
            if conn is None:
                raise BackendUnavailableError(f"sqlite database {self.path} is closed")
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Alone, a transaction's failure undoes the whole one: no savepoint needed.
                alone = len(batch) == 1
                for fn, _, _ in batch:
                    if not alone:
                        conn.execute("SAVEPOINT fencing_tx")
                    try:
                        value = fn(conn)
                    except Exception as exc:
                        if not alone:
                            conn.execute("ROLLBACK TO fencing_tx")
                            conn.execute("RELEASE fencing_tx")
                        outcomes.append((False, self._wrapped(exc)))
                    else:
                        if not alone:
                            conn.execute("RELEASE fencing_tx")
                        outcomes.append((True, value))
                conn.execute("ROLLBACK" if alone and not outcomes[0][0] else "COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        except Exception as exc:
            error = self._wrapped(exc)
            outcomes = [(False, error)] * len(batch)
        for (_, future, loop), outcome in zip(batch, outcomes, strict=True):
            loop.call_soon_threadsafe(_settle, future, outcome)

    def _wrapped(self, exc: Exception) -> Exception:
        if isinstance(exc, sqlite3.Error):
            error = BackendUnavailableError(f"sqlite error on {self.path}: {exc}")
            error.__cause__ = exc
            return error
        return exc

    async def healthy(self) -> bool:
        """True if the database is open and answers ``SELECT 1``."""
        try:
            await self.query(lambda conn: conn.execute("SELECT 1").fetchone())
        except BackendUnavailableError:
            return False
        return True

    async def query(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run a read-only ``fn(conn)`` in autocommit mode on the database thread."""

        def _q() -> T:
            conn = self._conn
            if conn is None:
                raise BackendUnavailableError(f"sqlite database {self.path} is closed")
            try:
                return fn(conn)
            except sqlite3.Error as exc:
                raise BackendUnavailableError(f"sqlite error on {self.path}: {exc}") from exc

        return await self.run(_q)
