"""``AsyncWorker``: the asyncio twin of :class:`fencing.worker.Worker`.

::

    async def send_email(job: Job) -> None:
        ...  # awaits; cancelled (CancelledError) if the job's claim is lost

    await AsyncWorker(AsyncQueueClient("127.0.0.1:50051"), "emails", send_email,
                      concurrency=32).run()

Same rules as the threaded worker, on the same I/O-free core
(:mod:`fencing.worker._core`), with one difference a thread cannot offer: when a
job's claim is lost (heartbeat refused, or the local deadline passed) its handler
task is **cancelled**. Nothing is sent for a job lost that way: the server has
already given it to someone else, or will rescue it when its lease expires.
``fence=[guard, ...]`` (``AsyncGuardClient``) fences each job's resource at the named
guards before its handler starts, as for the threaded worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from fencing.client import _core
from fencing.client._queue import Job, error_text, lost_because
from fencing.client.async_lease import AsyncFencer
from fencing.client.async_queue import AsyncQueueClient
from fencing.errors import FencingError, InvalidArgumentError, LeaseLost
from fencing.worker._core import Discard, FieldsLog, Phase, Retry, WorkerCore

log = FieldsLog(logging.getLogger("fencing.worker"))

AsyncHandler = Callable[[Job], Awaitable[object]]


def _fields(job: Job) -> dict[str, object]:
    """What a log line about ``job`` is about, as ``extra=`` fields (JSON keys)."""
    return {"queue": job.queue, "job_id": job.id, "attempt": job.attempt, "token": job.token}


class AsyncWorker:
    """Runs ``handler`` on jobs of ``queue`` as up to ``concurrency`` tasks until stopped.

    Arguments as for :class:`fencing.worker.Worker`; ``client`` is an
    :class:`AsyncQueueClient` or the lease server's address.
    """

    def __init__(
        self,
        client: AsyncQueueClient | str,
        queue: str,
        handler: AsyncHandler,
        *,
        concurrency: int = 1,
        ttl: float = 30.0,
        poll: float = 1.0,
        grace: float = 30.0,
        handle_signals: bool = True,
        fence: Sequence[AsyncFencer] = (),
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if concurrency < 1:
            raise InvalidArgumentError("concurrency must be at least 1", field="concurrency")
        self.fence = tuple(fence)
        # An address: the channel is opened in run(), on the loop that runs the worker.
        self._owns_client = isinstance(client, str)
        self._target = client if isinstance(client, str) else client.target
        self._client: AsyncQueueClient | None = None if isinstance(client, str) else client
        self.queue = queue
        self.handler = handler
        self.ttl = ttl
        self.poll = poll
        self.grace = grace
        self.handle_signals = handle_signals
        self.core = WorkerCore(concurrency, clock, rand)
        self._clock = clock
        self._stop_grace: float | None = None
        self._stop_requested: asyncio.Event | None = None
        self._stop_early = False
        self._wake: asyncio.Event | None = None
        self._hb_wake: asyncio.Event | None = None
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._cancelled_for_loss: set[int] = set()
        self._senders: set[asyncio.Task[None]] = set()

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.core.counts)

    @property
    def client(self) -> AsyncQueueClient:
        """The queue client (opened by :meth:`run` when the worker was given an address)."""
        if self._client is None:
            raise RuntimeError("the worker's client opens when run() starts")
        return self._client

    def stop(self, grace: float | None = None) -> None:
        """Begin a graceful stop (call from the worker's event loop, or before ``run``)."""
        self._stop_grace = grace
        if self._stop_requested is None:
            self._stop_early = True
            return
        self._stop_requested.set()
        assert self._wake is not None
        self._wake.set()

    async def run(self) -> None:
        """Claim and run jobs until :meth:`stop` or SIGTERM/SIGINT, then stop gracefully."""
        if self._client is None:
            self._client = AsyncQueueClient(self._target, clock=self._clock)
        self._stop_requested = asyncio.Event()
        self._wake = asyncio.Event()
        self._hb_wake = asyncio.Event()
        if self._stop_early:
            self._stop_requested.set()
        heartbeats = asyncio.create_task(self._heartbeat_loop())
        try:
            async with self._signals():
                await self._loop()
        finally:
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats
            await self._cancel_all()
            self.core.stopped()
            if self._owns_client:
                await self.client.aclose()
                self._client = None
        log.info("worker stopped", extra={"queue": self.queue, "counts": self.core.counts})

    @contextlib.asynccontextmanager
    async def _signals(self) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        installed = []
        if self.handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self._on_signal, sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    continue  # not the main thread, or no signals here
                installed.append(sig)
        try:
            yield
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("worker got %s: stopping gracefully", sig.name)
        self.stop()

    def _begin_stop(self) -> None:
        grace = self.grace if self._stop_grace is None else self._stop_grace
        if self.core.stop(grace):
            log.info("worker stopping", extra={"queue": self.queue, "grace_s": grace})

    async def _wait_wake(self, seconds: float) -> None:
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        self._wake.clear()

    async def _loop(self) -> None:
        core = self.core
        assert self._stop_requested is not None
        while True:
            if self._stop_requested.is_set():
                self._begin_stop()
            if core.phase is Phase.STOPPING:
                if core.drained():
                    return
                if core.grace_over():
                    await self._release(core.give_back(), "grace period over")
                    return
                await self._wait_wake(core.next_wakeup(0.1))
                continue
            slots = core.free_slots()
            if slots == 0:
                await self._wait_wake(0.5)
                continue
            try:
                jobs = await self.client.claim(
                    self.queue, batch=slots, ttl=self.ttl, wait=self.poll
                )
            except FencingError as exc:
                if not _core.is_transient(exc):
                    raise
                delay = core.unavailable()
                core.count("unavailable")
                log.warning(
                    "claim failed, retrying in %.2fs: %s", delay, exc, extra={"queue": self.queue}
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._stop_requested.wait()
                continue
            core.reachable()
            await self._take(jobs)

    async def _run_one(self, job: Job) -> None:
        core = self.core
        handed_off = False
        try:
            if not core.start(job):
                if core.settle(job):
                    await self._release([job], "stopping before it started")
                return
            if self.fence and not await self._promise(job):
                return
            core.count("started")
            log.info("job started", extra=_fields(job))
            started = self._clock()
            retry_in: float | None = None
            final = False
            error: BaseException | None = None
            try:
                await self.handler(job)
            except asyncio.CancelledError:
                if job.id not in self._cancelled_for_loss:
                    raise
                log.warning("job handler cancelled: %s", job.lost_reason, extra=_fields(job))
                core.settle(job)
                return
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
                log.warning(
                    "job abandoned: released at shutdown before it ended", extra=_fields(job)
                )
                return
            if error is None:
                log.info("job finished", extra={**_fields(job), "took_s": round(took, 3)})
                handed_off = True  # its slot is freed once its complete is answered
                if core.finished(job):
                    self._start_sender()
            else:
                outcome = await self._send(
                    job, self.client.fail(job, error, retry_in=retry_in, final=final), "fail"
                )
                if outcome is not None:
                    log.info(
                        "job failed",
                        extra={
                            **_fields(job),
                            "state": outcome.state,
                            "retry_in_s": outcome.retry_in,
                        },
                    )
                    core.count("dead" if outcome.state == "dead" else "failed")
        finally:
            if not handed_off:
                core.done(job)
            self._tasks.pop(job.id, None)
            self._cancelled_for_loss.discard(job.id)
            if self._wake is not None:
                self._wake.set()

    def _start_sender(self) -> None:
        # A task of its own, not a handler's: cancelling a lost handler must not cancel
        # the completes of other jobs.
        task = asyncio.get_running_loop().create_task(self._send_completes())
        self._senders.add(task)
        task.add_done_callback(self._senders.discard)

    async def _send_completes(self) -> None:
        """Send every queued complete, with the claim of as many new jobs, one call at a
        time, until none is left (the jobs that finish meanwhile ride on the next call)."""
        core = self.core
        while jobs := core.next_completes():
            claimed: list[Job] = []
            try:
                claimed = await self._complete_batch(jobs)
            except Exception:  # the sender must go on, or later completes would wait forever
                log.exception("sending %d completes failed", len(jobs))
            finally:
                await self._take(claimed)  # in the finished jobs' slots, before they leave
                for job in jobs:
                    core.done(job)
                if self._wake is not None:
                    self._wake.set()

    async def _complete_batch(self, jobs: list[Job]) -> list[Job]:
        """Complete ``jobs`` and, while running, claim as many new jobs in the same call
        (one round trip instead of two per job); return those. The server judges each
        complete by its job's token alone: a refusal is that job's verdict, and the
        others and the claim proceed. If the call fails, each complete is sent again on
        its own (a repeat is a no-op; the client retries it)."""
        core = self.core
        if core.phase is not Phase.RUNNING or self._stop_requested_now():
            await self._complete_each(jobs)
            return []
        was_lost = [job.lost.is_set() for job in jobs]
        wait = self.poll if core.may_wait(len(jobs)) else 0.0
        try:
            claimed, verdicts = await self.client.complete_and_claim(
                jobs, self.queue, batch=len(jobs), ttl=self.ttl, wait=wait
            )
        except FencingError as exc:
            log.info("complete and claim of %d jobs failed, completing alone: %s", len(jobs), exc)
            await self._complete_each(jobs)
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

    async def _complete_each(self, jobs: list[Job]) -> None:
        for job in jobs:
            if await self._send(job, self.client.complete(job), "complete") is not None:
                log.info("job completed", extra=_fields(job))

    def _stop_requested_now(self) -> bool:
        return self._stop_requested is not None and self._stop_requested.is_set()

    async def _take(self, jobs: list[Job]) -> None:
        """Hand newly claimed jobs to tasks (a stopping worker releases them instead)."""
        if not jobs:
            return
        core = self.core
        core.count("claimed", len(jobs))
        if self._stop_requested_now():
            self._begin_stop()
        back = core.claimed(jobs)
        if back:
            await self._release(back, "claimed after the stop began")
            return
        for job in jobs:
            log.debug("job claimed", extra=_fields(job))
            self._tasks[job.id] = asyncio.create_task(self._run_one(job))
        if self._hb_wake is not None:
            self._hb_wake.set()

    async def _promise(self, job: Job) -> bool:
        """Fence every named guard to the job's token; on a failure release the job
        (it never runs here) and return False."""
        for guard in self.fence:
            try:
                await guard.fence(job)
            except Exception as exc:
                self.core.count("unfenced")
                log.warning(
                    "job not started: fencing guard %s failed: %s",
                    guard.target,
                    error_text(exc),
                    extra=_fields(job),
                )
                if self.core.settle(job):
                    await self._release([job], f"guard {guard.target} not fenced")
                return False
        return True

    async def _send(self, job: Job, call: Awaitable[Any], what: str) -> Any:
        """Send a job's outcome (the client retries transient failures); None if refused."""
        try:
            result = await call
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
            self.core.count("lost")
            log.error("job %s not sent: %s", what, exc, extra=_fields(job))
            return None
        if what == "complete":
            self.core.count("completed")
        return True if result is None else result

    async def _release(self, jobs: list[Job], why: str) -> None:
        if not jobs:
            return
        for job in jobs:
            job.mark_lost(f"released: {why}")
        try:
            await self.client.release(jobs)
            self.core.count("released", len(jobs))
            for job in jobs:
                log.info("job released (%s)", why, extra=_fields(job))
        except FencingError as exc:
            log.warning("release of %d jobs failed (%s): %s", len(jobs), why, exc)
        finally:
            for job in jobs:
                self.core.done(job)
                task = self._tasks.get(job.id)
                if task is not None and task is not asyncio.current_task():
                    self._cancelled_for_loss.add(job.id)
                    task.cancel()

    def _lost(self, job: Job, why: str) -> None:
        self.core.count("lost")
        log.warning("job lost: %s", why, extra=_fields(job))
        task = self._tasks.get(job.id)
        if task is not None:
            self._cancelled_for_loss.add(job.id)
            task.cancel()

    async def _heartbeat_loop(self) -> None:
        core = self.core
        while True:
            for job in core.expire():
                self._lost(job, "local deadline passed")
            due = core.due()
            if due:
                try:
                    lost = await self.client.heartbeat(due, self.ttl)
                except FencingError as exc:
                    now = self._clock()
                    for job in due:
                        job.renew_failed(now)
                    log.info("heartbeat of %d jobs failed, retrying: %s", len(due), exc)
                else:
                    for job in lost:
                        self._lost(job, job.lost_reason)
            assert self._hb_wake is not None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(core.next_wakeup(1.0)):
                    await self._hb_wake.wait()
            self._hb_wake.clear()

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks.values()) + list(self._senders)
        for task in tasks:
            task.cancel()
        if tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait(tasks, timeout=5)


__all__ = ["AsyncHandler", "AsyncWorker", "Discard", "Retry"]
