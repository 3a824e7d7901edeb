"""The server processes of a chaos run: the lease server, the guard, their databases.

- :class:`ServerProc`: a gRPC server process (lease server, guard) started on port
  0 the first time and restarted on the port it got, so clients and proxies keep
  their targets; :func:`lease_server` and :func:`guard_server` build one.
- :class:`Postgres`, :class:`Redis`: throwaway database servers on free loopback
  ports in a temporary directory (PostgreSQL runs as ``postgres`` through
  ``runuser`` when the harness is root, since ``initdb`` refuses root).

Each is a :class:`~chaos.processes.Proc`, so every fault of :mod:`chaos.faults`
applies to it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from chaos.processes import READY_TIMEOUT_S, Proc, ProcessError
from serving.ports import free_port

LISTENING: Final = re.compile(r"listening on (\S+):(\d+)")
"""The ready line of ``python -m lease_server`` and ``python -m guard``."""


class ServerProc(Proc):
    """A gRPC server process that prints ``listening on HOST:PORT`` when ready.

    ``argv`` contains ``{listen}``; the first start binds ``127.0.0.1:0`` and every
    restart binds the port the first start got, retrying a few times if the port is
    not free yet (bounded), so its :attr:`target` never changes.
    """

    BIND_ATTEMPTS: Final = 5

    def __init__(self, name: str, argv: Sequence[str], *, log_path: Path) -> None:
        self._template = list(argv)
        self.port = 0
        super().__init__(name, self._argv(), log_path=log_path, ready=LISTENING)

    def _argv(self) -> list[str]:
        listen = f"127.0.0.1:{self.port}"
        return [a.replace("{listen}", listen) for a in self._template]

    @property
    def target(self) -> str:
        if not self.port:
            raise ProcessError(f"{self.name} has not started")
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = READY_TIMEOUT_S) -> re.Match[str] | None:
        self.argv = self._argv()
        for attempt in range(self.BIND_ATTEMPTS):
            try:
                match = super().start(timeout)
            except ProcessError:
                if not self.port or attempt == self.BIND_ATTEMPTS - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))  # the old socket may linger briefly
                continue
            assert match is not None
            self.port = int(match.group(2))
            return match
        raise AssertionError("unreachable")  # pragma: no cover


def _module(module: str, leak: str) -> list[str]:
    """How to run server ``module``: ``python -m module``, or, for a soak's leak control,
    through :mod:`chaos.leaky` (the same server, keeping one ``leak`` object per call)."""
    if leak:
        return [sys.executable, "-m", "chaos.leaky", leak, module]
    return [sys.executable, "-m", module]


def lease_server(
    backend_url: str,
    workdir: Path,
    name: str = "lease-server",
    *,
    extra_args: Sequence[str] = (),
    leak: str = "",
) -> ServerProc:
    """A lease server process on ``backend_url`` (not started)."""
    argv = [*_module("lease_server", leak), "--backend", backend_url, "--listen", "{listen}"]
    argv += ["--log-level", "WARNING", *extra_args]
    return ServerProc(name, argv, log_path=workdir / "logs" / f"{name}.log")


def guard_server(
    store_url: str,
    fence_mode: str,
    workdir: Path,
    *,
    name: str = "guard",
    extra_args: Sequence[str] = (),
    leak: str = "",
) -> ServerProc:
    """A guard process on ``store_url`` in ``fence_mode`` (not started)."""
    argv = [*_module("guard", leak), "--store", store_url, "--listen", "{listen}"]
    argv += ["--fence-mode", fence_mode, "--log-level", "WARNING", *extra_args]
    return ServerProc(name, argv, log_path=workdir / "logs" / f"{name}.log")


# -- throwaway databases ------------------------------------------------------------------


def _as_postgres(argv: list[str]) -> list[str]:
    """Run ``argv`` as the ``postgres`` user when we are root (initdb refuses root)."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


def _pg_bin(name: str) -> str:
    for candidate in (f"/usr/local/bin/{name}", f"/usr/lib/postgresql/15/bin/{name}"):
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found is None:
        raise ProcessError(f"PostgreSQL binary {name!r} not found")
    return found


_PG_TEMPLATE: Path | None = None
_PG_TEMPLATE_LOCK = threading.Lock()


def _pg_template() -> Path:
    """A freshly initdb'ed cluster, made once per process and copied for each server."""
    global _PG_TEMPLATE
    with _PG_TEMPLATE_LOCK:
        if _PG_TEMPLATE is None or not (_PG_TEMPLATE / "data" / "PG_VERSION").exists():
            root = Path(tempfile.mkdtemp(prefix="chaos-pg-template-"))
            if os.geteuid() == 0:
                shutil.chown(root, "postgres", "postgres")
            initdb = [_pg_bin("initdb"), "-D", str(root / "data"), "-A", "trust"]
            subprocess.run(
                _as_postgres([*initdb, "-U", "postgres", "--no-sync"]),
                check=True,
                capture_output=True,
                timeout=120,
            )
            atexit.register(shutil.rmtree, root, True)
            _PG_TEMPLATE = root
        return _PG_TEMPLATE


class Postgres(Proc):
    """A throwaway PostgreSQL cluster in its own temporary directory on a free loopback port.

    The data directory is not under ``workdir`` (only the log is): when the harness
    runs as root, PostgreSQL runs as ``postgres``, which must be able to reach it,
    and test temporary directories are private to root. :meth:`close` removes it.
    ``fsync=off`` keeps it fast: the harness kills processes, not machines, and the
    OS page cache survives a SIGKILL; ``synchronous_commit`` stays on, so a commit
    acknowledged before a crash survives it. :meth:`kill` SIGKILLs the postmaster
    and every backend (one process group); :meth:`restart` runs crash recovery.
    """

    def __init__(self, workdir: Path, name: str = "postgres") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
        self.port = free_port()
        super().__init__(
            name,
            [],
            log_path=workdir / "logs" / f"{name}.log",
            ready=re.compile(r"database system is ready to accept connections"),
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self, timeout: float = READY_TIMEOUT_S) -> re.Match[str] | None:
        data = self.dir / "data"
        if not data.exists():
            if os.geteuid() == 0:
                shutil.chown(self.dir, "postgres", "postgres")
            # A copy of one initdb per harness process: initdb takes seconds, a copy not.
            subprocess.run(
                _as_postgres(["cp", "-a", str(_pg_template() / "data"), str(data)]),
                check=True,
                capture_output=True,
                timeout=120,
            )
        self.argv = _as_postgres(
            [
                _pg_bin("postgres"),
                "-D",
                str(data),
                "-p",
                str(self.port),
                "-k",
                str(self.dir),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "synchronous_commit=on",
                "-c",
                "max_connections=200",
            ]
        )
        return super().start(timeout)

    def kill(self) -> None:
        super().kill()
        # Every process of the cluster is dead, but their zombies may wait a while for
        # init to reap them, and PostgreSQL refuses to start while the PID in a lock
        # file answers kill(pid, 0), which a zombie does. Nobody holds the locks now.
        for lock in (self.dir / "data" / "postmaster.pid", self.dir / f".s.PGSQL.{self.port}.lock"):
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.dir, ignore_errors=True)


REDIS_PERSISTENCE: Final = {
    # appendfsync always: every acknowledged write is in the AOF before the reply.
    "aof-always": ["--appendonly", "yes", "--appendfsync", "always"],
    "aof-everysec": ["--appendonly", "yes", "--appendfsync", "everysec"],
    # Nothing survives a restart: the token counter starts again from zero.
    "none": ["--appendonly", "no"],
}
"""Redis persistence options a scenario can choose."""


class Redis(Proc):
    """A throwaway Redis in ``workdir/redis`` on a free loopback port.

    ``persistence`` is a key of :data:`REDIS_PERSISTENCE`; RDB snapshots are off in
    every case, so only the AOF (if on) carries state across a :meth:`restart`.
    """

    def __init__(self, workdir: Path, persistence: str = "aof-always", name: str = "redis") -> None:
        if persistence not in REDIS_PERSISTENCE:
            raise ValueError(
                f"unknown Redis persistence {persistence!r} "
                f"(expected one of {sorted(REDIS_PERSISTENCE)})"
            )
        self.dir = workdir / "redis"
        self.port = free_port()
        self.persistence = persistence
        self.dir.mkdir(parents=True, exist_ok=True)
        argv = [
            shutil.which("redis-server") or "/usr/bin/redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--daemonize",
            "no",
            *REDIS_PERSISTENCE[persistence],
        ]
        super().__init__(
            name,
            argv,
            log_path=workdir / "logs" / f"{name}.log",
            ready=re.compile(r"Ready to accept connections"),
        )

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


__all__ = [
    "LISTENING",
    "REDIS_PERSISTENCE",
    "Postgres",
    "Redis",
    "ServerProc",
    "guard_server",
    "lease_server",
]
