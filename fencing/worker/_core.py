"""The I/O-free core of the queue workers, shared by :class:`Worker` (threads) and
:class:`AsyncWorker` (asyncio): the twins only claim, run handlers and send.

It keeps the jobs in flight and decides, on an injected monotonic clock:

* how many jobs to claim (free slots; none once stopping),
* which jobs to heartbeat now (each on its own ttl/3 schedule from
  :mod:`fencing._renewal`, coalesced into one batch) and when to look again,
* which jobs are lost because their local deadline passed,
* how long to back off after the server was unavailable (bounded, jittered),
* when a graceful stop's grace period is over, and which jobs to give back then.

Each job in flight is settled once: by its handler's outcome (complete or fail) or
by the shutdown (release), whichever claims it first.

Completes are coalesced: a handler that succeeds queues its job (:meth:`WorkerCore.finished`);
one sender at a time takes everything queued (:meth:`WorkerCore.next_completes`) and
sends it with the claim of as many new jobs, in one call, while the jobs that finish
meanwhile queue up for its next call. A queued job keeps its slot until its call is
answered, so the claims never exceed ``concurrency``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fencing._backoff import Backoff
from fencing.client._queue import Job
from fencing.errors import LeaseLost


class FieldsLog(logging.LoggerAdapter[logging.Logger]):
    """The workers' log: a line's ``extra=`` fields (queue, job_id, attempt, token...)
    are also written at the end of its message as ``key=value``, so a program using
    plain :mod:`logging` (no formatter of ours) still sees which job a line is about;
    they stay ``extra=`` fields too, for a JSON formatter (the console formatter of
    the servers does not write them twice)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        fields = kwargs.get("extra") or {}
        if fields:
            # Escaped: the message is %-formatted with its args after this.
            said = " ".join(f"{k}={v}" for k, v in fields.items()).replace("%", "%%")
            msg = f"{msg} {said}"
        return msg, kwargs


#: Backoff (seconds) between attempts to reach an unavailable server.
UNAVAILABLE_BACKOFF = Backoff(base=0.1, cap=5.0, factor=2.0, jitter=0.3)


class Phase(StrEnum):
    RUNNING = "running"
    STOPPING = "stopping"  # no new claims; in-flight jobs get the grace period
    STOPPED = "stopped"


class Retry(Exception):
    """Raise from a handler to fail this attempt and retry after ``after`` seconds
    (instead of the server's backoff)."""

    def __init__(self, reason: str = "retry requested", *, after: float | None = None) -> None:
        super().__init__(reason)
        self.after = after


class Discard(Exception):
    """Raise from a handler to fail the job for good (dead now, no more attempts)."""


@dataclass
class InFlight:
    """One claimed job this worker holds; ``settled`` once someone took charge of ending it."""

    job: Job
    started: bool = False
    settled: bool = False


@dataclass
class WorkerCore:
    """Book-keeping of one worker process (thread-safe; every method is short)."""

    concurrency: int
    clock: Callable[[], float]
    rand: Callable[[], float]
    backoff: Backoff = UNAVAILABLE_BACKOFF
    #: Heartbeat jobs due within this many seconds together, to send one batch.
    coalesce: float = 0.05
    phase: Phase = Phase.RUNNING
    drain_deadline: float = 0.0
    failures: int = 0
    #: What happened to jobs so far: claimed, started, completed, failed, dead,
    #: lost (jobs whose claim this worker lost, once each), refused (outcomes the server
    #: refused for a stale token), released, unavailable (claims that found no server).
    counts: dict[str, int] = field(default_factory=dict)
    _jobs: dict[int, InFlight] = field(default_factory=dict)
    _finished: list[Job] = field(default_factory=list)
    _sending: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] = self.counts.get(what, 0) + n

    # -- claiming -------------------------------------------------------------------------

    def free_slots(self) -> int:
        with self._lock:
            if self.phase is not Phase.RUNNING:
                return 0
            return max(0, self.concurrency - len(self._jobs))

    def claimed(self, jobs: list[Job]) -> list[Job]:
        """Take newly claimed jobs in; return those to give back at once (stopping)."""
        with self._lock:
            if self.phase is not Phase.RUNNING:
                return list(jobs)
            for job in jobs:
                self._jobs[job.id] = InFlight(job)
            return []

    def start(self, job: Job) -> bool:
        """A handler is about to run ``job``: False if it must not (stopping, lost, settled)."""
        with self._lock:
            entry = self._jobs.get(job.id)
            if entry is None or entry.settled or self.phase is not Phase.RUNNING:
                return False
            if job.lost.is_set():
                return False
            entry.started = True
            return True

    def settle(self, job: Job) -> bool:
        """Take charge of ending ``job`` (complete/fail/release/abandon); False if taken."""
        with self._lock:
            entry = self._jobs.get(job.id)
            if entry is None or entry.settled:
                return False
            entry.settled = True
            return True

    # -- completes ------------------------------------------------------------------------

    def finished(self, job: Job) -> bool:
        """``job``'s handler succeeded (and settled it): queue its complete. True if the
        caller must become the sender (nobody is sending), False if the sender takes it."""
        with self._lock:
            self._finished.append(job)
            if self._sending:
                return False
            self._sending = True
            return True

    def next_completes(self) -> list[Job]:
        """For the sender: every queued complete, to send in one call; [] ends its turn."""
        with self._lock:
            out, self._finished = self._finished, []
            if not out:
                self._sending = False
            return out

    def may_wait(self, sending: int) -> bool:
        """Whether a call completing ``sending`` jobs may also wait for work: only when
        they hold every slot (nothing else runs, and nothing else claims), so no other
        job's complete waits behind it."""
        with self._lock:
            return self.phase is Phase.RUNNING and sending >= self.concurrency

    def tally_completes(
        self, jobs: Sequence[Job], verdicts: Sequence[LeaseLost | None], lost_before: Sequence[bool]
    ) -> list[tuple[Job, LeaseLost | None]]:
        """Count the verdicts of a call's completes: ``completed``, or ``refused`` (and
        ``lost``, unless the job was known lost before the call); returns them paired."""
        out = list(zip(jobs, verdicts, strict=True))
        for (_, verdict), was_lost in zip(out, lost_before, strict=True):
            if verdict is None:
                self.count("completed")
                continue
            if not was_lost:
                self.count("lost")
            self.count("refused")
        return out

    def done(self, job: Job) -> None:
        """``job`` left this worker (settled and sent, or abandoned)."""
        with self._lock:
            self._jobs.pop(job.id, None)

    def in_flight(self) -> list[Job]:
        with self._lock:
            return [e.job for e in self._jobs.values()]

    # -- backoff while the server is unavailable -----------------------------------------

    def unavailable(self) -> float:
        """The server could not be reached: seconds to wait before asking again."""
        self.failures += 1
        return self.backoff.delay(self.failures, self.rand())

    def reachable(self) -> None:
        self.failures = 0

    # -- heartbeats -----------------------------------------------------------------------

    def due(self) -> list[Job]:
        """Live jobs whose next heartbeat is due (within ``coalesce``), unsettled."""
        now = self.clock()
        with self._lock:
            return [
                e.job
                for e in self._jobs.values()
                if not e.settled
                and not e.job.lost.is_set()
                and e.job.next_renewal() <= now + self.coalesce
            ]

    def next_wakeup(self, cap: float) -> float:
        """Seconds until the next heartbeat or deadline is due (at most ``cap``)."""
        now = self.clock()
        with self._lock:
            times = [e.job.next_renewal() for e in self._jobs.values() if not e.job.lost.is_set()]
            if self.phase is Phase.STOPPING:
                times.append(self.drain_deadline)
        return max(0.0, min([cap, *(t - now for t in times)]))

    def expire(self) -> list[Job]:
        """Mark lost every live job whose local deadline passed; return them. A settled
        job is left alone: its handler is done, and its outcome is on its way (a complete
        may ride on a call that waits for work well past the deadline: the server judged
        it on arrival)."""
        with self._lock:
            unsettled = [e.job for e in self._jobs.values() if not e.settled]
        expired = []
        for job in unsettled:
            if (
                not job.lost.is_set()
                and job.expired()
                and job.mark_lost("local deadline passed before a heartbeat succeeded")
            ):
                expired.append(job)
        return expired

    # -- stopping -------------------------------------------------------------------------

    def stop(self, grace: float) -> bool:
        """Begin a graceful stop (no new claims, ``grace`` seconds for in-flight jobs).
        False if already stopping."""
        with self._lock:
            if self.phase is not Phase.RUNNING:
                return False
            self.phase = Phase.STOPPING
            self.drain_deadline = self.clock() + max(0.0, grace)
            return True

    def grace_over(self) -> bool:
        return self.phase is Phase.STOPPING and self.clock() >= self.drain_deadline

    def drained(self) -> bool:
        with self._lock:
            return not self._jobs

    def give_back(self) -> list[Job]:
        """The grace period is over: settle every unsettled job for release."""
        with self._lock:
            out = []
            for entry in self._jobs.values():
                if not entry.settled:
                    entry.settled = True
                    out.append(entry.job)
            return out

    def stopped(self) -> None:
        with self._lock:
            self.phase = Phase.STOPPED
