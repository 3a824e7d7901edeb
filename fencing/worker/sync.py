"""``Worker``: run a handler on jobs of one queue with threads (blocking).

::

    def send_email(job: Job) -> None:
        message = json.loads(job.payload)
        job.check()                                    # courtesy: LeaseLost once lost
        guard.write(job, Put(f"sent/{message['id']}", b"1"),
                    idempotency_key=f"email-{message['id']}")   # safety: fenced by job.token

    Worker(QueueClient("127.0.0.1:50051"), "emails", send_email, concurrency=8).run()

``run()`` claims up to ``concurrency`` jobs at a time and runs each in a handler
thread. A handler that returns completes the job; one that raises fails it (the
server retries it after its backoff, or marks it dead after the last attempt);
:class:`Retry` picks the delay, :class:`Discard` gives up at once. The server judges
every outcome by the job's token: a job taken over meanwhile is refused
(``LeaseLost``), logged, and counted as ``lost``.

While a handler runs, its job is heartbeated every ttl/3 (several jobs in one
call). If a heartbeat is refused or the job's local deadline passes, ``job.lost``
is set: a thread cannot be interrupted, so call ``job.check()`` between steps; the
guard rejects whatever a paused handler sends late.

SIGTERM or SIGINT (or :meth:`stop`) begins a graceful stop: no more claims,
``grace`` seconds for the handlers running, then every job still held is released
(ready again at once, the attempt not counted) and ``job.lost`` is set for its
handler. Jobs a claim returned after the signal are released without starting.
When the server is unreachable, claims back off exponentially (0.1 s to 5 s, jittered).

``fence=[guard, ...]`` is the promise for jobs: before a handler starts, the worker
calls ``guard.fence(job)`` on each named guard (one ``Fence`` per job and guard, in the
handler's thread), so those guards reject every older claim's token of the job's
resource from then on, even before this handler writes: a paused former worker's late
write is refused at once, in any fence mode. A job whose fence fails (a newer token
already fenced it, or the guard cannot be reached) is released without running and
counted as ``unfenced``.

Logs (logger ``fencing.worker``) name queue, job id, attempt and token; never payloads.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue as queue_module
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

from fencing.client import _core
from fencing.client._queue import Job, error_text, lost_because
from fencing.client.lease import Fencer
from fencing.client.queue import QueueClient
from fencing.errors import FencingError, InvalidArgumentError, LeaseLost
from fencing.worker._core import Discard, FieldsLog, Phase, Retry, WorkerCore

log = FieldsLog(logging.getLogger("fencing.worker"))

Handler = Callable[[Job], object]


def _fields(job: Job) -> dict[str, object]:
    """What a log line about ``job`` is about, as ``extra=`` fields (JSON keys)."""
    return {"queue": job.queue, "job_id": job.id, "attempt": job.attempt, "token": job.token}


class Worker:
    """Runs ``handler`` on jobs of ``queue`` with ``concurrency`` threads until stopped.

    ``client`` is a :class:`QueueClient` or the lease server's address. ``ttl`` is each
    claim's lease in seconds, ``poll`` how long one claim waits for work, ``grace``
    how long a stop waits for running handlers. ``handle_signals`` installs SIGTERM
    and SIGINT handlers while :meth:`run` runs (main thread only). ``fence``: guards
    (:class:`~fencing.client.guard.GuardClient`) fenced to each job's token before its
    handler starts (see the module docstring).
    """

    def __init__(
        self,
        client: QueueClient | str,
        queue: str,
        handler: Handler,
        *,
        concurrency: int = 1,
        ttl: float = 30.0,
        poll: float = 1.0,
        grace: float = 30.0,
        handle_signals: bool = True,
        fence: Sequence[Fencer] = (),
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if concurrency < 1:
            raise InvalidArgumentError("concurrency must be at least 1", field="concurrency")
        self.fence = tuple(fence)
        self._owns_client = isinstance(client, str)
        self.client = QueueClient(client, clock=clock) if isinstance(client, str) else client
        self.queue = queue
        self.handler = handler
        self.ttl = ttl
        self.poll = poll
        self.grace = grace
        self.handle_signals = handle_signals
        self.core = WorkerCore(concurrency, clock, rand)
        self._clock = clock
        self._stop_requested = threading.Event()
        self._stop_grace: float | None = None
        self._wake = threading.Event()  # something changed: re-check slots and phase
        self._hb_wake = threading.Event()
        self._hb_stop = threading.Event()
        self._work: queue_module.SimpleQueue[Job | None] = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []

    @property
    def counts(self) -> dict[str, int]:
        """What happened so far: claimed, started, completed, failed, dead, lost, released..."""
        return dict(self.core.counts)

    def stop(self, grace: float | None = None) -> None:
        """Begin a graceful stop (safe from a signal handler or any thread)."""
        self._stop_grace = grace
        self._stop_requested.set()
        self._wake.set()

    # -- the main loop -------------------------------------------------------------------

    def run(self) -> None:
        """Claim and run jobs until :meth:`stop` or SIGTERM/SIGINT, then stop gracefully."""
        with self._signals():
            self._start_threads()
            try:
                self._loop()
            finally:
                self._shutdown_threads()
                self.core.stopped()
                if self._owns_client:
                    self.client.close()
        log.info("worker stopped", extra={"queue": self.queue, "counts": self.core.counts})

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("worker got %s: stopping gracefully", signal.Signals(signum).name)
            self.stop()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _loop(self) -> None:
        core = self.core
        while True:
            if self._stop_requested.is_set() and core.phase is Phase.RUNNING:
                grace = self.grace if self._stop_grace is None else self._stop_grace
                core.stop(grace)
                log.info("worker stopping", extra={"queue": self.queue, "grace_s": grace})
            if core.phase is Phase.STOPPING:
                if core.drained():
                    return
                if core.grace_over():
                    self._release(core.give_back(), "grace period over")
                    return
                self._wake.wait(core.next_wakeup(0.1))
                self._wake.clear()
                continue
            slots = core.free_slots()
            if slots == 0:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                jobs = self.client.claim(self.queue, batch=slots, ttl=self.ttl, wait=self.poll)
            except FencingError as exc:
                if not _core.is_transient(exc):
                    raise
                delay = core.unavailable()
                core.count("unavailable")
                log.warning(
                    "claim failed, retrying in %.2fs: %s", delay, exc, extra={"queue": self.queue}
                )
                self._stop_requested.wait(delay)
                continue
            core.reachable()
            if not jobs:
                continue
            core.count("claimed", len(jobs))
            if self._stop_requested.is_set() and core.phase is Phase.RUNNING:
                core.stop(self.grace if self._stop_grace is None else self._stop_grace)
            back = core.claimed(jobs)
            if back:
                self._release(back, "claimed after the stop began", started=False)
                continue
            for job in jobs:
                log.debug("job claimed", extra=_fields(job))
                self._work.put(job)
            self._hb_wake.set()

    # -- threads ---------------------------------------------------------------------------

    def _start_threads(self) -> None:
        for i in range(self.core.concurrency):
            t = threading.Thread(
                target=self._handler_loop, name=f"fencing-worker-{self.queue}-{i}", daemon=True
            )
            t.start()
            self._threads.append(t)
        hb = threading.Thread(
            target=self._heartbeat_loop, name=f"fencing-heartbeat-{self.queue}", daemon=True
        )
        hb.start()
        self._heartbeat_thread = hb

    def _shutdown_threads(self) -> None:
        for _ in self._threads:
            self._work.put(None)
        self._hb_stop.set()
        self._hb_wake.set()
        self._heartbeat_thread.join(10)
        # Handler threads still running a released job are abandoned (daemon threads):
        # their job is marked lost. The guard refuses what they write late once the job's
        # next claim is fenced there (that worker's fence=[guard], or a watch or strict
        # guard); a monotonic guard without it, only after the next holder's first write.
        deadline = time.monotonic() + 1.0
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _handler_loop(self) -> None:
        while True:
            job = self._work.get()
            if job is None:
                return
            try:
                self._run_one(job)
            except Exception:  # the thread must never die silently
                log.exception("worker crashed on a job", extra=_fields(job))
            finally:
                self._wake.set()

    def _run_one(self, job: Job) -> None:
        core = self.core
        if not core.start(job):
            if core.settle(job):
                self._release([job], "stopping before it started", started=False)
            return
        if self.fence and not self._promise(job):
            return
        core.count("started")
        log.info("job started", extra=_fields(job))
        started = self._clock()
        retry_in: float | None = None
        final = False
        error: BaseException | None = None
        try:
            self.handler(job)
        except Retry as exc:
            error, retry_in = exc, exc.after
        except Discard as exc:
            error, final = exc, True
        except Exception as exc:
            error = exc
            log.warning("job handler raised: %s", error_text(exc), extra=_fields(job))
            log.debug("handler traceback", exc_info=True)
        took = self._clock() - started
        if not core.settle(job):
            log.warning("job abandoned: released at shutdown before it ended", extra=_fields(job))
            return
        if error is None:
            log.info("job finished", extra={**_fields(job), "took_s": round(took, 3)})
            # Its slot is freed once its complete is answered (by whoever sends it).
            if core.finished(job):
                self._send_completes()
            return
        try:
            outcome = self._send(
                job,
                lambda: self.client.fail(job, error, retry_in=retry_in, final=final),
                "fail",
            )
            if outcome is not None:
                log.info(
                    "job failed",
                    extra={**_fields(job), "state": outcome.state, "retry_in_s": outcome.retry_in},
                )
                core.count("dead" if outcome.state == "dead" else "failed")
        finally:
            core.done(job)

    def _send_completes(self) -> None:
        """Send every queued complete, with the claim of as many new jobs, one call at a
        time, until none is left (the jobs that finish meanwhile ride on the next call);
        the jobs claimed go to the handler threads."""
        core = self.core
        while jobs := core.next_completes():
            claimed: list[Job] = []
            try:
                claimed = self._complete_batch(jobs)
            except Exception:  # the sender must go on, or later completes would wait forever
                log.exception("sending %d completes failed", len(jobs))
            finally:
                self._take(claimed)  # in the finished jobs' slots, before they leave
                for job in jobs:
                    core.done(job)
                self._wake.set()

    def _take(self, jobs: list[Job]) -> None:
        """Hand newly claimed jobs to the handler threads (released if stopping)."""
        if not jobs:
            return
        core = self.core
        core.count("claimed", len(jobs))
        if self._stop_requested.is_set() and core.phase is Phase.RUNNING:
            core.stop(self.grace if self._stop_grace is None else self._stop_grace)
        back = core.claimed(jobs)
        if back:
            self._release(back, "claimed after the stop began", started=False)
            return
        for job in jobs:
            log.debug("job claimed", extra=_fields(job))
            self._work.put(job)
        self._hb_wake.set()

    def _complete_batch(self, jobs: list[Job]) -> list[Job]:
        """Complete ``jobs`` and, while running, claim as many new jobs in the same call
        (one round trip instead of two per job); return those. The server judges each
        complete by its job's token alone: a refusal is that job's verdict, and the
        others and the claim proceed. If the call fails, each complete is sent again on
        its own (a repeat is a no-op), retried until that job's deadline."""
        core = self.core
        if core.phase is not Phase.RUNNING or self._stop_requested.is_set():
            self._complete_each(jobs)
            return []
        was_lost = [job.lost.is_set() for job in jobs]
        wait = self.poll if core.may_wait(len(jobs)) else 0.0
        try:
            claimed, verdicts = self.client.complete_and_claim(
                jobs, self.queue, batch=len(jobs), ttl=self.ttl, wait=wait
            )
        except FencingError as exc:
            log.info("complete and claim of %d jobs failed, completing alone: %s", len(jobs), exc)
            self._complete_each(jobs)
            return []
        for job, verdict in core.tally_completes(jobs, verdicts, was_lost):
            if verdict is None:
                log.info("job completed", extra=_fields(job))
            else:
                log.warning(
                    "job lost: complete refused: the job %s: %s",
                    lost_because(verdict),
                    verdict,
                    extra=_fields(job),
                )
        return claimed

    def _complete_each(self, jobs: list[Job]) -> None:
        for job in jobs:
            self._send(job, functools.partial(self.client.complete, job), "complete")
            log.info("job completed", extra=_fields(job))

    def _promise(self, job: Job) -> bool:
        """Fence every named guard to the job's token; on a failure release the job
        (it never runs here) and return False."""
        for guard in self.fence:
            try:
                guard.fence(job)
            except Exception as exc:
                self.core.count("unfenced")
                log.warning(
                    "job not started: fencing guard %s failed: %s",
                    guard.target,
                    error_text(exc),
                    extra=_fields(job),
                )
                if self.core.settle(job):
                    self._release([job], f"guard {guard.target} not fenced", started=False)
                else:
                    self.core.done(job)
                return False
        return True

    def _send(self, job: Job, action: Callable[[], Any], what: str) -> Any:
        """Send a job's outcome; keep trying transient failures until its deadline passes."""
        while True:
            try:
                result = action()
            except LeaseLost as exc:
                if job.mark_lost(f"{what} refused"):
                    self.core.count("lost")
                self.core.count("refused")
                log.warning(
                    "job lost: %s refused: the job %s: %s",
                    what,
                    lost_because(exc),
                    exc,
                    extra=_fields(job),
                )
                return None
            except FencingError as exc:
                if not _core.is_transient(exc) or job.expired():
                    self.core.count("lost")
                    log.error("job %s not sent: %s", what, exc, extra=_fields(job))
                    return None
                delay = min(self.core.backoff.delay(1, self.core.rand()), job.remaining())
                time.sleep(delay)
                continue
            if what == "complete":
                self.core.count("completed")
            return result

    def _release(self, jobs: list[Job], why: str, *, started: bool = True) -> None:
        if not jobs:
            return
        for job in jobs:
            job.mark_lost(f"released: {why}")
        try:
            self.client.release(jobs)
            self.core.count("released", len(jobs))
            for job in jobs:
                log.info("job released (%s)", why, extra=_fields(job))
        except FencingError as exc:
            # Each claim expires by itself and is rescued; the guard fences late writers.
            log.warning("release of %d jobs failed (%s): %s", len(jobs), why, exc)
        finally:
            for job in jobs:
                self.core.done(job)

    def _heartbeat_loop(self) -> None:
        core = self.core
        while not self._hb_stop.is_set():
            for job in core.expire():
                core.count("lost")
                log.warning("job lost: local deadline passed", extra=_fields(job))
            due = core.due()
            if due:
                try:
                    lost = self.client.heartbeat(due, self.ttl)
                except FencingError as exc:
                    now = self._clock()
                    for job in due:
                        job.renew_failed(now)
                    log.info("heartbeat of %d jobs failed, retrying: %s", len(due), exc)
                else:
                    for job in lost:
                        core.count("lost")
                        log.warning("job lost: %s", job.lost_reason, extra=_fields(job))
            self._hb_wake.wait(core.next_wakeup(1.0))
            self._hb_wake.clear()


__all__ = ["Discard", "Handler", "Retry", "Worker"]
