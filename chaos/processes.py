"""Child processes the chaos harness starts, each in its own session.

Its own session makes a child's process group its pid, so a signal reaches its
children too. :class:`Proc` sends its output to a log file, waits for a ready line,
and can be paused (SIGSTOP/SIGCONT), killed (SIGKILL, with every descendant),
terminated (SIGTERM, then SIGKILL after a grace period) and restarted: the
operations :mod:`chaos.faults` is made of. The servers and databases a run needs are
in :mod:`chaos.servers`, the topology of a run in :mod:`chaos.cluster`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Final

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
"""The checkout the harness runs from; child processes import the same code."""

READY_TIMEOUT_S: Final = 30.0
"""How long a process may take to say it is ready."""

STOP_GRACE_S: Final = 5.0
"""How long :meth:`Proc.terminate` waits after SIGTERM before SIGKILL."""


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


__all__ = [
    "READY_TIMEOUT_S",
    "REPO_ROOT",
    "STOP_GRACE_S",
    "Proc",
    "ProcessError",
    "child_env",
    "descendants",
    "port_open",
]
