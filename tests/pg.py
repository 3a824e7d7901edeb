"""PostgreSQL for the tests: one DSN, a fresh schema per test, and throwaway clusters.

:func:`test_dsn` picks, once per session, the first of

1. ``$FENCING_TEST_POSTGRES_DSN`` (a ``postgresql://`` URL; it must be reachable),
2. ``postgresql://postgres@127.0.0.1:5432/test`` if something answers there,
3. a throwaway :class:`Cluster` (``initdb`` into a temp dir, a free port), if the
   PostgreSQL binaries are installed,

and otherwise skips the test with the reason, or fails it when ``CI=true``: in
CI a missing PostgreSQL is a broken job, not a pass. :func:`fresh_schema` gives
each test its own schema (random name), dropped afterwards, so tests never see
each other's leases or fences and can run against a shared server.

:class:`Cluster` is also the fault-injection handle: stop it fast, crash it
(SIGKILL to the postmaster and all its children, like a host losing power with
the page cache intact), start it again on the same port and data. We run as
root in CI, and ``initdb`` refuses root, so the cluster's processes run as the
``postgres`` OS user through ``runuser`` when we are root.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from serving.ports import free_port

ENV_DSN = "FENCING_TEST_POSTGRES_DSN"
LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/test"
BIN_DIRS = ("/usr/local/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin")
#: A prefix shared by every schema the tests create (see :func:`fresh_schema`).
SCHEMA_PREFIX = "t_"


def _find_binary(name: str) -> str | None:
    for directory in BIN_DIRS:
        candidate = Path(directory) / name
        if candidate.exists():
            return str(candidate)
    return shutil.which(name)


def reachable(dsn: str, timeout: int = 2) -> bool:
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=timeout):
            return True
    except psycopg.Error:
        return False


class Cluster:
    """A private PostgreSQL server in a temp dir, on a free port of 127.0.0.1."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fencing-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        self._as_root = os.geteuid() == 0
        if self._as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    @staticmethod
    def missing() -> str | None:
        """Why a cluster cannot be made here, or None if it can."""
        for name in ("initdb", "pg_ctl"):
            if _find_binary(name) is None:
                return f"PostgreSQL binary {name} not found in {BIN_DIRS} or PATH"
        if os.geteuid() == 0 and shutil.which("runuser") is None:
            return "running as root, and runuser is missing to run PostgreSQL as postgres"
        return None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, binary: str, *args: str, check: bool = True) -> None:
        path = _find_binary(binary)
        assert path is not None, binary
        cmd = [path, *args]
        if self._as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=check, capture_output=True, timeout=60)

    def start(self) -> None:
        # fsync off is fine for process crashes (the OS page cache survives them);
        # synchronous_commit stays on, or a SIGKILL could lose acknowledged commits.
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off -c max_connections=100"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "30",
            "-o", options, "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast|immediate``: fast disconnects clients and checkpoints."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def crash(self) -> None:
        """SIGKILL the postmaster and every child it had: no shutdown, crash recovery on start."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        victims = [pid, *_children(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(v) for v in victims):
            time.sleep(0.02)
        # PostgreSQL treats a lock file whose PID still exists as a running server, and in
        # a container whose init does not reap, the killed postmaster lingers as a zombie.
        # After a real crash that PID is gone: make it so.
        socket_file = self.root / f".s.PGSQL.{self.port}"
        for lock in (self.data / "postmaster.pid", Path(f"{socket_file}.lock"), socket_file):
            lock.unlink(missing_ok=True)

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid ...: comm may hold spaces, so split after ')'
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@contextlib.contextmanager
def cluster() -> Iterator[Cluster]:
    """A started throwaway cluster, destroyed on exit; skips (or fails in CI) if impossible."""
    reason = Cluster.missing()
    if reason is not None:
        unavailable(reason)
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.destroy()


def unavailable(reason: str) -> None:
    """Skip the test for lack of PostgreSQL, or fail it when ``CI=true``."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL is required in CI: {reason}", pytrace=False)
    pytest.skip(f"no PostgreSQL: {reason}")


_resolved: tuple[str | None, str] | None = None


def test_dsn() -> str:
    """The session's PostgreSQL URL (see the module docstring); skips or fails if none."""
    global _resolved
    if _resolved is None:
        _resolved = _resolve()
    dsn, reason = _resolved
    if dsn is None:
        unavailable(reason)
    assert dsn is not None
    return dsn


test_dsn.__test__ = False  # type: ignore[attr-defined]  # not a test, despite its name


def _resolve() -> tuple[str | None, str]:
    env = os.environ.get(ENV_DSN)
    if env:
        if reachable(env):
            return env, ""
        # An explicit DSN that does not answer is a broken setup, skipped or not.
        pytest.fail(f"{ENV_DSN} is set but PostgreSQL does not answer there", pytrace=False)
    if reachable(LOCAL_DSN):
        return LOCAL_DSN, ""
    reason = Cluster.missing()
    if reason is not None:
        return None, f"nothing at {LOCAL_DSN} and {reason}"
    try:
        c = Cluster()
        c.start()
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"nothing at {LOCAL_DSN} and a throwaway cluster failed: {exc}"
    atexit.register(c.destroy)
    return c.dsn, ""


def with_schema(dsn: str, schema: str) -> str:
    """``dsn`` (a URL) with ``?schema=`` set, for servers started from a URL."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("schema", schema)])))


async def drop_schema(dsn: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SET lock_timeout = '10s'")
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


@contextlib.contextmanager
def fresh_schema_url() -> Iterator[str]:
    """A URL with ``?schema=`` a schema no other test uses, for servers started from a
    URL; the schema is dropped (if created) on exit."""
    dsn = test_dsn()
    schema = f"{SCHEMA_PREFIX}{secrets.token_hex(6)}"
    try:
        yield with_schema(dsn, schema)
    finally:
        asyncio.run(drop_schema(dsn, schema))


@asynccontextmanager
async def fresh_schema() -> AsyncIterator[tuple[str, str]]:
    """``(dsn, schema)``: a schema name no other test uses, dropped (if created) on exit."""
    dsn = test_dsn()
    schema = f"{SCHEMA_PREFIX}{secrets.token_hex(6)}"
    try:
        yield dsn, schema
    finally:
        await drop_schema(dsn, schema)
