"""Faults on real processes and links, and the cluster they are injected into.

Everything here acts on processes the harness started itself, each in its own
session (so its process group is its pid and a signal reaches its children too):

- :class:`Proc`: a child process whose output goes to a log file, with
  ``pause``/``resume`` (SIGSTOP/SIGCONT), ``kill`` (SIGKILL), ``terminate``
  (SIGTERM, then SIGKILL after a grace period) and ``restart``.
- :class:`ServerProc`: a gRPC server process (lease server, guard) started on port
  0 the first time and restarted on the port it got, so clients and proxies keep
  their targets.
- :class:`Postgres`, :class:`Redis`: throwaway database servers on free loopback
  ports in a temporary directory (PostgreSQL runs as ``postgres`` through
  ``runuser`` when the harness is root, since ``initdb`` refuses root).
- :class:`Cluster`: the topology of one run. It starts the backend, the lease
  server and the guard, starts clients (each optionally behind its own fault
  proxies to the lease server and to the guard), and stops everything in
  :meth:`Cluster.stop`, which ``with Cluster(...)`` calls in ``finally``.

Faults are context managers: the fault holds inside the ``with`` block and is
undone on exit, even when the block raises. Each records its window in a
:class:`FaultLog` (one JSONL line, on the harness's monotonic clock, the same
clock as the histories) for the report:

- :func:`paused`: SIGSTOP a process group, SIGCONT on exit (a GC pause, a VM
  migration: the process does not know it happened).
- :func:`crashed`: SIGKILL, restart on exit (crash-restart of a client, the lease
  server, the guard or a database).
- :func:`partitioned`, :func:`delayed`, :func:`half_open`: a fault on a
  :class:`~chaos.proxy.ThreadedFaultProxy` (blackhole, latency, one direction
  only), healed on exit; :func:`reset_link` resets its connections at once.
- :func:`clock_skewed`: a client's monotonic clock (the one its SDK schedules
  renewals and local deadlines on) runs at another rate and jumps by an offset;
  signalled with SIGUSR1 (skew on) and SIGUSR2 (skew off), see
  :class:`chaos.workload.SkewedClock`. Safety must not depend on client clocks.

Only loopback addresses are used. No network namespaces are needed.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from chaos.proxy import Direction, ThreadedFaultProxy
from serving.ports import free_port

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
"""The checkout the harness runs from; child processes import the same code."""

READY_TIMEOUT_S: Final = 30.0
"""How long a process may take to say it is ready."""

STOP_GRACE_S: Final = 5.0
"""How long :meth:`Proc.terminate` waits after SIGTERM before SIGKILL."""

LISTENING: Final = re.compile(r"listening on (\S+):(\d+)")
"""The ready line of ``python -m lease_server`` and ``python -m guard``."""


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child Python process: this checkout first on its path.

    ``FENCING_*`` variables of the harness are dropped: servers read their settings
    from them, and a run must depend on its own flags only.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCING_")}
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{path}" if path else str(REPO_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid`` (children, grandchildren...), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: split after the last ")".
        fields = stat.rsplit(")", 1)[1].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _exists(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has released everything but its PID)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# -- fault log ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """One fault as it happened: ``kind`` on ``target`` from ``start_ns`` to ``end_ns``.

    Times are ``time.monotonic_ns()`` of the harness, comparable with history events.
    ``end_ns == start_ns`` for instant faults (a reset). ``detail`` is for people.
    """

    kind: str
    target: str
    start_ns: int
    end_ns: int
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target": self.target,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FaultWindow:
        return cls(
            str(raw["kind"]),
            str(raw["target"]),
            int(raw["start_ns"]),
            int(raw["end_ns"]),
            str(raw.get("detail", "")),
        )


class FaultLog:
    """Where faults record their windows; appended to ``path`` (JSONL) if given.

    :attr:`active` names the faults in force now (for a progress line).
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.windows: list[FaultWindow] = []
        self._lock = threading.Lock()
        self._active: dict[int, str] = {}
        self._ids = iter(range(1, 1 << 62))

    @contextlib.contextmanager
    def window(self, kind: str, target: str, detail: str = "") -> Iterator[None]:
        """Record the time spent inside the block as one fault window."""
        start = time.monotonic_ns()
        with self._lock:
            key = next(self._ids)
            self._active[key] = f"{kind} {target}"
        try:
            yield
        finally:
            with self._lock:
                del self._active[key]
            self.add(FaultWindow(kind, target, start, time.monotonic_ns(), detail))

    def instant(self, kind: str, target: str, detail: str = "") -> None:
        now = time.monotonic_ns()
        self.add(FaultWindow(kind, target, now, now, detail))

    def add(self, window: FaultWindow) -> None:
        with self._lock:
            self.windows.append(window)
            if self.path is not None:
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(window.to_dict()) + "\n")

    @property
    def active(self) -> list[str]:
        with self._lock:
            return list(self._active.values())


def read_faults(path: Path) -> list[FaultWindow]:
    """The windows a :class:`FaultLog` wrote to ``path`` (empty if there is none)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [FaultWindow.from_dict(json.loads(line)) for line in lines if line.strip()]


# -- processes --------------------------------------------------------------------------


class ProcessError(RuntimeError):
    """A process the harness started did not become ready, or died unexpectedly."""


class Proc:
    """A child process in its own session; its stdout and stderr appended to ``log_path``.

    ``ready`` is a regular expression: :meth:`start` waits (at most ``timeout``) for
    an output line matching it and returns the match, raising :class:`ProcessError`
    (with the log's tail) if the process exits or stays silent. Without ``ready``,
    :meth:`start` returns ``None`` at once. Signals go to the whole process group.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        ready: re.Pattern[str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else child_env()
        self.cwd = cwd or REPO_ROOT
        self.ready = ready
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._log: IO[bytes] | None = None
        self._matched: re.Match[str] | None = None
        self._ready_event = threading.Event()
        self._pump: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"<Proc {self.name} pid={self.pid} alive={self.alive}>"

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def start(self, timeout: float = READY_TIMEOUT_S) -> re.Match[str] | None:
        """Start the process; wait until it prints its ready line (if any)."""
        if self.alive:
            raise ProcessError(f"{self.name} is already running")
        self._close_log()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"--- start {self.starts} argv={self.argv}\n".encode())
        self._log.flush()
        self._matched = None
        self._ready_event.clear()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )
        self.starts += 1
        assert self.popen.stdout is not None
        self._pump = threading.Thread(
            target=self._read_output,
            args=(self.popen.stdout, self._log),
            name=f"output-{self.name}",
            daemon=True,
        )
        self._pump.start()
        if self.ready is None:
            return None
        self._ready_event.wait(timeout)
        matched = self.ready_match()
        if matched is None:
            tail = self.log_tail()
            self.kill()
            raise ProcessError(f"{self.name} did not become ready in {timeout:g} s:\n{tail}")
        return matched

    def ready_match(self) -> re.Match[str] | None:
        """The ready line's match of the current start (None until it was printed)."""
        return self._matched

    def _read_output(self, stream: IO[bytes], log: IO[bytes]) -> None:
        try:
            for raw in stream:
                with contextlib.suppress(ValueError, OSError):
                    log.write(raw)
                    log.flush()
                if self.ready is not None and not self._ready_event.is_set():
                    match = self.ready.search(raw.decode(errors="replace"))
                    if match is not None:
                        self._matched = match
                        self._ready_event.set()
        finally:
            stream.close()
            self._ready_event.set()  # an exit ends the wait for readiness too

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-chars:].decode(errors="replace")
        except OSError:
            return ""

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process group; nothing if it has exited."""
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def pause(self) -> None:
        """SIGSTOP the process group: it stops mid-instruction, unaware."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the process group."""
        self.signal(signal.SIGCONT)

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` for the process to exit; its return code or None."""
        if self.popen is None:
            return None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the process group and every descendant, reap the process, and wait
        (bounded) until all of them are gone.

        Descendants matter: PostgreSQL's backends each call ``setsid()``, so killing
        the postmaster's group leaves them running, holding its shared memory, and a
        restart would fail.
        """
        if self.popen is None:
            return
        doomed = descendants(self.popen.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.wait(STOP_GRACE_S)
        end = time.monotonic() + STOP_GRACE_S
        while any(_exists(pid) for pid in doomed) and time.monotonic() < end:
            time.sleep(0.01)
        self._join_pump()

    def terminate(self, grace: float = STOP_GRACE_S) -> None:
        """SIGCONT + SIGTERM the group, SIGKILL whatever is left after ``grace`` seconds."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            if self.wait(grace) is None:
                self.kill()
                return
        self.kill()  # reaps stragglers in the group (no-op when there are none)

    def restart(self, timeout: float = READY_TIMEOUT_S) -> re.Match[str] | None:
        """Start again after an exit or a :meth:`kill`."""
        if self.alive:
            self.kill()
        return self.start(timeout)

    def _join_pump(self) -> None:
        if self._pump is not None:
            self._pump.join(2.0)
            self._pump = None

    def _close_log(self) -> None:
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    def close(self) -> None:
        """Kill if running and close the log file."""
        self.kill()
        self._close_log()


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


def lease_server(backend_url: str, workdir: Path, name: str = "lease-server") -> ServerProc:
    """A lease server process on ``backend_url`` (not started)."""
    argv = [sys.executable, "-m", "lease_server", "--backend", backend_url, "--listen", "{listen}"]
    argv += ["--log-level", "WARNING"]
    return ServerProc(name, argv, log_path=workdir / "logs" / f"{name}.log")


def guard_server(
    store_url: str,
    fence_mode: str,
    workdir: Path,
    *,
    name: str = "guard",
    extra_args: Sequence[str] = (),
) -> ServerProc:
    """A guard process on ``store_url`` in ``fence_mode`` (not started)."""
    argv = [sys.executable, "-m", "guard", "--store", store_url, "--listen", "{listen}"]
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


# -- faults -------------------------------------------------------------------------------


@contextlib.contextmanager
def paused(proc: Proc, log: FaultLog, *, label: str | None = None) -> Iterator[None]:
    """SIGSTOP ``proc``'s process group for the block; SIGCONT on exit."""
    with log.window("pause", label or proc.name, "SIGSTOP ... SIGCONT"):
        proc.pause()
        try:
            yield
        finally:
            proc.resume()


@contextlib.contextmanager
def crashed(
    proc: Proc,
    log: FaultLog,
    *,
    restart: bool | Callable[[], object] = True,
    label: str | None = None,
) -> Iterator[None]:
    """SIGKILL ``proc``'s process group for the block; restart it on exit.

    ``restart`` is True (``proc.restart()``), False (stay down) or a callable that
    brings it back (a client's new incarnation). The window ends when the restarted
    process is ready again.
    """
    with log.window("crash", label or proc.name, "SIGKILL ... restart"):
        proc.kill()
        try:
            yield
        finally:
            if callable(restart):
                restart()
            elif restart:
                proc.restart()


@contextlib.contextmanager
def crashed_together(procs: Sequence[Proc], log: FaultLog, *, label: str) -> Iterator[None]:
    """SIGKILL several processes at once for the block; restart them all concurrently."""
    with log.window("crash", label, "SIGKILL ... restart, together"):
        for proc in procs:
            proc.kill()
        try:
            yield
        finally:
            failures: list[BaseException] = []

            def restart(proc: Proc) -> None:
                try:
                    proc.restart()
                except BaseException as exc:
                    failures.append(exc)

            threads = [threading.Thread(target=restart, args=(p,)) for p in procs]
            for t in threads:
                t.start()
            for t in threads:
                t.join(READY_TIMEOUT_S + 5)
            if failures:
                raise failures[0]


@contextlib.contextmanager
def partitioned(proxy: ThreadedFaultProxy, log: FaultLog, target: str) -> Iterator[None]:
    """Blackhole the link through ``proxy``: nothing passes either way, sockets stay open."""
    with log.window("partition", target, "blackhole both directions"):
        proxy.blackhole()
        try:
            yield
        finally:
            proxy.heal()


@contextlib.contextmanager
def delayed(
    proxy: ThreadedFaultProxy, log: FaultLog, target: str, ms: float, jitter_ms: float = 0
) -> Iterator[None]:
    """Delay every chunk through ``proxy`` by ``ms`` (+/- ``jitter_ms``), both ways."""
    with log.window("latency", target, f"{ms:g} ms +/- {jitter_ms:g} ms"):
        proxy.latency(ms, jitter_ms)
        try:
            yield
        finally:
            proxy.heal()


@contextlib.contextmanager
def half_open(
    proxy: ThreadedFaultProxy, log: FaultLog, target: str, direction: Direction
) -> Iterator[None]:
    """Let only ``direction`` through ``proxy`` (``upstream`` or ``downstream``)."""
    with log.window("half-open", target, f"only {direction} passes"):
        proxy.half_open(direction)
        try:
            yield
        finally:
            proxy.heal()


def reset_link(proxy: ThreadedFaultProxy, log: FaultLog, target: str) -> None:
    """Reset (RST) every connection through ``proxy`` now."""
    log.instant("reset", target, "RST every connection")
    proxy.reset()


@contextlib.contextmanager
def clock_skewed(proc: Proc, log: FaultLog, *, detail: str = "") -> Iterator[None]:
    """Skew a workload client's SDK clock (SIGUSR1) for the block; unskew (SIGUSR2) on exit.

    The rate and offset were given to the client at start (``--skew-rate``,
    ``--skew-offset``); see :class:`chaos.workload.SkewedClock`.
    """
    with log.window("clock-skew", proc.name, detail):
        proc.signal(signal.SIGUSR1)
        try:
            yield
        finally:
            proc.signal(signal.SIGUSR2)


# -- the cluster -----------------------------------------------------------------------------

BACKENDS: Final = ("sqlite", "postgres", "redis")


@dataclass(frozen=True, slots=True)
class Topology:
    """What one run needs: the backend, the guard's mode, where proxies sit.

    ``backend`` is ``sqlite`` (embedded in the lease server and the guard, one file
    each), ``postgres`` or ``redis`` (a throwaway server shared by both, so the
    guard's store and the leases are in one database, as ``strict`` needs).
    ``proxy_lease``/``proxy_guard`` put a fault proxy of its own between every client
    and the lease server / the guard. ``watch``: the guard follows the lease
    server's events (``--lease-server``, directly, not through a proxy).
    ``redis_persistence``: see :data:`REDIS_PERSISTENCE`. ``guard_args``: extra
    guard flags.
    """

    backend: str = "sqlite"
    fence_mode: str = "monotonic"
    proxy_lease: bool = False
    proxy_guard: bool = False
    watch: bool = False
    redis_persistence: str = "aof-always"
    guard_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r} (expected one of {BACKENDS})")


@dataclass
class ClientNode:
    """One workload client: its name, its current process, and its proxies (if any)."""

    name: str
    proc: Proc
    lease_target: str
    guard_target: str
    lease_proxy: ThreadedFaultProxy | None = None
    guard_proxy: ThreadedFaultProxy | None = None
    argv: list[str] = field(default_factory=list)

    @property
    def incarnation(self) -> int:
        """How many times this client's process was started, minus one."""
        return max(0, self.proc.starts - 1)


class Cluster:
    """The processes and proxies of one run, started by :meth:`start`, all stopped by :meth:`stop`.

    ``workdir`` receives ``logs/`` and the embedded databases. Clients are added
    with :meth:`add_client` once the servers run. ``with Cluster(...) as c`` starts
    and always stops (clients first, then proxies, servers, databases).
    """

    def __init__(self, topology: Topology, workdir: Path, *, seed: int = 0) -> None:
        self.topology = topology
        self.workdir = workdir
        self.seed = seed
        self.database: Postgres | Redis | None = None
        self.lease: ServerProc | None = None
        self.guard: ServerProc | None = None
        self.clients: dict[str, ClientNode] = {}
        self._proxies: list[ThreadedFaultProxy] = []

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def lease_target(self) -> str:
        assert self.lease is not None
        return self.lease.target

    @property
    def guard_target(self) -> str:
        assert self.guard is not None
        return self.guard.target

    def backend_urls(self) -> tuple[str, str]:
        """(lease backend URL, guard store URL) for this topology."""
        if self.topology.backend == "sqlite":
            data = self.workdir / "data"
            data.mkdir(parents=True, exist_ok=True)
            return f"sqlite:///{data / 'leases.db'}", f"sqlite:///{data / 'guard.db'}"
        assert self.database is not None
        return self.database.url, self.database.url

    def start(self) -> None:
        """Start the database (if any), the lease server and the guard."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.topology.backend == "postgres":
            self.database = Postgres(self.workdir)
            self.database.start()
        elif self.topology.backend == "redis":
            self.database = Redis(self.workdir, self.topology.redis_persistence)
            self.database.start()
        lease_url, store_url = self.backend_urls()
        self.lease = lease_server(lease_url, self.workdir)
        self.lease.start()
        guard_args = list(self.topology.guard_args)
        if self.topology.watch:
            guard_args += ["--lease-server", self.lease.target]
        self.guard = guard_server(
            store_url, self.topology.fence_mode, self.workdir, extra_args=guard_args
        )
        self.guard.start()

    def _proxy(self, upstream: str, seed: int) -> ThreadedFaultProxy:
        host, port = upstream.rsplit(":", 1)
        proxy = ThreadedFaultProxy(host, int(port), seed=seed)
        proxy.start()
        self._proxies.append(proxy)
        return proxy

    def add_client(self, name: str, argv: Sequence[str]) -> ClientNode:
        """Start a workload client; ``argv`` may contain ``{lease}`` and ``{guard}``.

        Those are replaced by the lease server's and the guard's addresses, or by
        the client's own proxies' addresses when the topology puts proxies in front.
        """
        index = len(self.clients)
        lease_proxy = guard_proxy = None
        lease_target, guard_target = self.lease_target, self.guard_target
        if self.topology.proxy_lease:
            lease_proxy = self._proxy(self.lease_target, self.seed * 1000 + index * 2)
            lease_target = lease_proxy.target
        if self.topology.proxy_guard:
            guard_proxy = self._proxy(self.guard_target, self.seed * 1000 + index * 2 + 1)
            guard_target = guard_proxy.target
        full = [a.replace("{lease}", lease_target).replace("{guard}", guard_target) for a in argv]
        proc = Proc(name, full, log_path=self.workdir / "logs" / f"{name}.log")
        node = ClientNode(name, proc, lease_target, guard_target, lease_proxy, guard_proxy, full)
        self.clients[name] = node
        proc.start()
        return node

    def restart_client(self, name: str, extra_args: Sequence[str] = ()) -> ClientNode:
        """Start a client's process again (a new incarnation) with the same arguments.

        ``extra_args`` are appended (later flags override earlier ones, e.g. a
        shorter ``--duration`` so the new incarnation stops with the others).
        """
        node = self.clients[name]
        node.proc.kill()
        node.proc.argv = [*node.argv, "--incarnation", str(node.proc.starts), *extra_args]
        node.proc.start()
        return node

    def wait_clients(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` s for every client to exit; names of those still running."""
        end = time.monotonic() + timeout
        for node in self.clients.values():
            node.proc.wait(max(0.0, end - time.monotonic()))
        return [n.name for n in self.clients.values() if n.proc.alive]

    def stop_proxies(self) -> None:
        """Stop every proxy (resetting what they still hold)."""
        for proxy in self._proxies:
            with contextlib.suppress(Exception):
                proxy.stop()
        self._proxies.clear()

    def stop(self) -> None:
        """Stop everything: clients, proxies, guard, lease server, database. Idempotent."""
        for node in self.clients.values():
            node.proc.resume()  # a paused client cannot act on SIGTERM
            node.proc.kill()
            node.proc.close()
        self.stop_proxies()
        for server in (self.guard, self.lease):
            if server is not None:
                server.resume()
                server.terminate()
                server.close()
        if self.database is not None:
            self.database.resume()
            self.database.terminate()
            self.database.close()


__all__ = [
    "BACKENDS",
    "LISTENING",
    "REDIS_PERSISTENCE",
    "REPO_ROOT",
    "ClientNode",
    "Cluster",
    "FaultLog",
    "FaultWindow",
    "Postgres",
    "Proc",
    "ProcessError",
    "Redis",
    "ServerProc",
    "Topology",
    "child_env",
    "clock_skewed",
    "crashed",
    "crashed_together",
    "delayed",
    "descendants",
    "free_port",
    "guard_server",
    "half_open",
    "lease_server",
    "partitioned",
    "paused",
    "port_open",
    "read_faults",
    "reset_link",
]
