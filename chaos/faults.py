"""Faults on real processes and links: each holds inside its ``with`` block.

Everything here acts on processes the harness started itself
(:class:`~chaos.processes.Proc`; the servers in :mod:`chaos.servers`, the run's
topology in :mod:`chaos.cluster`) and on its fault proxies. A fault is undone on
exit, even when the block raises. Each records its window in a :class:`FaultLog`
(one JSONL line, on the harness's monotonic clock, the same clock as the histories)
for the report:

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

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.processes import READY_TIMEOUT_S, Proc
from chaos.proxy import Direction, ThreadedFaultProxy

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


__all__ = [
    "FaultLog",
    "FaultWindow",
    "clock_skewed",
    "crashed",
    "crashed_together",
    "delayed",
    "half_open",
    "partitioned",
    "paused",
    "read_faults",
    "reset_link",
]
