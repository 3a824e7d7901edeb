"""``fencing.v1.QueueService`` over a :class:`~lease_server.queue.backends.base.QueueBackend`.

Validates every request at the edge (:mod:`fencing.limits`), decides retry delays
with the server's backoff policy (:class:`QueueOptions`), lets an empty Claim wait
for work (woken by enqueues and give-backs through this process, on PostgreSQL by
the NOTIFY of every committed enqueue, whoever made it, and re-asking at least every
``poll_interval``), and logs each refusal, retry and death with queue,
job id, attempt and token, never payloads.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc.aio
from prometheus_client import CollectorRegistry

from fencing import limits
from fencing._backoff import Backoff
from fencing.errors import (
    BackendUnavailableError,
    FencingError,
    InvalidArgumentError,
    LeaseLost,
    NotFoundError,
    ResourceExhaustedError,
)
from fencing.types import JOB_CANCELLED
from fencing.v1 import queue_pb2, queue_pb2_grpc
from lease_server.queue import jobs, schedules
from lease_server.queue.backends.base import CompleteGroup, QueueBackend
from lease_server.queue.batch import CompleteBatcher
from lease_server.queue.jobs import (
    DEFAULT_RETRY_BACKOFF,
    Administered,
    JobRecord,
    JobRef,
    JobState,
    NewJob,
)
from lease_server.queue.metrics import QueueMetrics
from lease_server.queue.resources import LeaseCalls, ResourceLeases
from lease_server.queue.schedules import Schedule, ScheduleRecord
from serving import config
from serving.admission import current_principal
from serving.server import rpc

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

DAY_S = 24 * 3600


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """How the server runs its queues.

    ``retry`` is in milliseconds. Retention: succeeded jobs are deleted
    ``succeeded_retention_s`` after they finished, dead ones ``dead_retention_s``
    after (None: kept forever); a job's idempotency key is remembered as long as
    its row. The reaper runs every ``reap_interval_s`` and handles at most
    ``reap_batch`` jobs per step. The scheduler of periodic jobs re-reads the schedules
    at least every ``schedule_refresh_s``; ``periodic_unique=False`` leaves the unique
    key (schedule, period) off their jobs, which only the tests' control does (to show
    the duplicates the key prevents).
    """

    retry: Backoff = DEFAULT_RETRY_BACKOFF
    succeeded_retention_s: float | None = 7 * DAY_S
    dead_retention_s: float | None = 30 * DAY_S
    reap_interval_s: float = 1.0
    reap_batch: int = 1000
    poll_interval_s: float = 0.25
    #: Seconds between refreshes of the backlog gauges (a Stats query).
    stats_interval_s: float = 15.0
    schedule_refresh_s: float = 1.0
    periodic_unique: bool = True
    #: Schedules a backend holds at most (every server reads them all each step).
    max_schedules: int = limits.MAX_SCHEDULES

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> QueueOptions:
        """From the resolved settings of :data:`QUEUE_OPTIONS` (negative retention: forever)."""
        if args.queue_retry_base > args.queue_retry_cap:
            raise InvalidArgumentError(
                "queue_retry_base must not exceed queue_retry_cap", field="queue_retry_base"
            )
        return cls(
            retry=Backoff(
                base=args.queue_retry_base * 1000,
                cap=args.queue_retry_cap * 1000,
                factor=DEFAULT_RETRY_BACKOFF.factor,
                jitter=DEFAULT_RETRY_BACKOFF.jitter,
            ),
            succeeded_retention_s=_forever_if_negative(args.queue_succeeded_retention),
            dead_retention_s=_forever_if_negative(args.queue_dead_retention),
        )


def _forever_if_negative(seconds: float) -> float | None:
    return None if seconds < 0 else seconds


#: The queue service's settings, for ``lease-server`` and ``fencing serve``.
QUEUE_OPTIONS: tuple[config.Option, ...] = (
    config.Option(
        "queue",
        "FENCING_QUEUE",
        None,
        "queue backend URL (memory://, sqlite:PATH, postgresql://...); unset: beside the "
        "lease backend (leases.db -> leases-queue.db, the same PostgreSQL schema); "
        "off: no queue service",
        metavar="URL",
    ),
    config.Option(
        "queue_succeeded_retention",
        "FENCING_QUEUE_SUCCEEDED_RETENTION",
        float(7 * DAY_S),
        "seconds a succeeded job (and so its idempotency key) is kept before the reaper "
        "deletes it; negative: forever",
        float,
        metavar="SECONDS",
    ),
    config.Option(
        "queue_dead_retention",
        "FENCING_QUEUE_DEAD_RETENTION",
        float(30 * DAY_S),
        "seconds a dead job is kept before the reaper deletes it; negative: forever",
        float,
        metavar="SECONDS",
    ),
    config.Option(
        "queue_retry_base",
        "FENCING_QUEUE_RETRY_BASE",
        DEFAULT_RETRY_BACKOFF.base / 1000,
        "seconds before a failed job's first retry; doubles with each attempt, jittered",
        float,
        check=config.positive,
        metavar="SECONDS",
    ),
    config.Option(
        "queue_retry_cap",
        "FENCING_QUEUE_RETRY_CAP",
        DEFAULT_RETRY_BACKOFF.cap / 1000,
        "longest retry delay of a failed job, in seconds",
        float,
        check=config.positive,
        metavar="SECONDS",
    ),
)


class _Wakeups:
    """One event per queue, set when work may have become claimable through this process."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def event(self, queue: str) -> asyncio.Event:
        return self._events.setdefault(queue, asyncio.Event())

    def notify(self, queue: str) -> None:
        """Wake the claims waiting on ``queue`` ("": on every queue)."""
        if not queue:
            for waiting in self._events.values():
                waiting.set()
            return
        event = self._events.get(queue)
        if event is not None:
            event.set()


def new_job_from_proto(msg: queue_pb2.NewJob, field: str, now_ms: int) -> NewJob:
    """Validate one ``NewJob``; the error names ``field`` (e.g. ``jobs[3].payload``)."""
    return NewJob(
        **limits.check_new_job(
            payload=msg.payload,
            idempotency_key=msg.idempotency_key,
            max_attempts=msg.max_attempts,
            delay_ms=msg.delay_ms,
            run_at_ms=msg.run_at_ms,
            ordering_key=msg.ordering_key,
            priority=msg.priority,
            resource=msg.resource,
            field=field,
            now_ms=now_ms,
        )
    )


def schedule_from_proto(msg: queue_pb2.Schedule) -> Schedule:
    """Validate a ``Schedule`` (:func:`lease_server.queue.schedules.validate`); the error
    names the request's field (``schedule.cron``)."""
    try:
        return schedules.validate(
            Schedule(
                name=msg.name,
                queue=msg.queue,
                cron=msg.cron.strip(),
                every_ms=msg.every_ms,
                timezone=msg.timezone,
                payload=msg.payload,
                priority=msg.priority,
                max_attempts=msg.max_attempts,
                resource=msg.resource,
                catch_up=msg.catch_up,
            )
        )
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(str(exc), field=f"schedule.{exc.field}") from None


def schedule_to_proto(record: ScheduleRecord, now_ms: int) -> queue_pb2.ScheduleInfo:
    s = record.schedule
    return queue_pb2.ScheduleInfo(
        schedule=queue_pb2.Schedule(
            name=s.name,
            queue=s.queue,
            cron=s.cron,
            every_ms=s.every_ms,
            timezone=s.timezone,
            payload=s.payload,
            priority=s.priority,
            max_attempts=s.max_attempts,
            resource=s.resource,
            catch_up=s.catch_up,
        ),
        created_at_ms=record.created_at_ms,
        next_run_ms=schedules.next_period(s, max(record.after_ms, now_ms)),
        last_period_ms=record.last_period_ms,
        last_job_id=record.last_job_id,
    )


def refs_from_proto(refs: Sequence[queue_pb2.JobRef], field: str = "jobs") -> list[JobRef]:
    limits.check_batch(len(refs), field)
    out = []
    for i, ref in enumerate(refs):
        limits.check_range(f"{field}[{i}].id", ref.id, 1, limits.MAX_TOKEN)
        limits.check_token(ref.token, f"{field}[{i}].token")
        out.append(JobRef(ref.id, ref.token))
    return out


def job_to_proto(record: JobRecord, ttl_ms: int) -> queue_pb2.Job:
    return queue_pb2.Job(
        id=record.id,
        queue=record.queue,
        payload=record.payload,
        token=record.token,
        attempt=record.attempts,
        max_attempts=record.max_attempts,
        resource=record.fenced_resource,
        ordering_key=record.ordering_key,
        priority=record.priority,
        idempotency_key=record.idempotency_key,
        last_error=record.last_error,
        ttl_ms=ttl_ms,
        enqueued_at_ms=record.created_at_ms,
    )


def stats_to_proto(c: jobs.QueueCounts) -> queue_pb2.QueueStats:
    return queue_pb2.QueueStats(
        queue=c.queue,
        ready=c.ready,
        scheduled=c.scheduled,
        waiting=c.waiting,
        running=c.running,
        expired=c.expired,
        succeeded=c.succeeded,
        dead=c.dead,
        cancelled=c.cancelled,
        oldest_ready_age_ms=c.oldest_ready_age_ms,
        retrying=c.retrying,
        retry_rate=c.retry_rate,
        finished_in_window=c.finished_in_window,
        window_ms=c.window_ms,
    )


def attempt_to_proto(a: jobs.JobAttempt) -> queue_pb2.JobAttempt:
    return queue_pb2.JobAttempt(
        attempt=a.attempt,
        started_at_ms=a.started_at_ms,
        ended_at_ms=a.ended_at_ms,
        worker=a.worker,
        token=a.token,
        outcome=a.outcome.value,
        error=a.error,
    )


def job_info_to_proto(
    record: JobRecord,
    include_payload: bool = False,
    history: Sequence[jobs.JobAttempt] = (),
) -> queue_pb2.JobInfo:
    """A job as an operator sees it (see the proto's ``JobInfo``), with its attempts'
    ``history`` (GetJob's; a listing leaves it empty)."""
    running = record.state is JobState.RUNNING
    return queue_pb2.JobInfo(
        history=[attempt_to_proto(a) for a in history],
        id=record.id,
        queue=record.queue,
        state=record.state.value,
        payload_size=len(record.payload),
        payload=record.payload if include_payload else b"",
        attempts=record.attempts,
        max_attempts=record.max_attempts,
        last_error=record.last_error,
        token=record.token,
        lease_owner=record.lease_owner,
        resource=record.fenced_resource,
        ordering_key=record.ordering_key,
        priority=record.priority,
        idempotency_key=record.idempotency_key,
        enqueued_at_ms=record.created_at_ms,
        run_at_ms=record.available_at_ms,
        claimed_at_ms=record.claimed_at_ms,
        finished_at_ms=record.finished_at_ms,
        lease_expires_at_ms=record.lease_until_ms if running else 0,
    )


def _job_state(value: str) -> JobState | None:
    """ListJobsRequest.state: empty for every state, else one of :class:`JobState`."""
    if not value:
        return None
    try:
        return JobState(value)
    except ValueError:
        names = ", ".join(s.value for s in JobState)
        raise InvalidArgumentError(
            f"state must be one of {names} (or empty), not {value!r}", field="state"
        ) from None


def _job_id(value: int) -> int:
    return limits.check_range("id", value, 1, limits.MAX_TOKEN)


def _optional_queue(value: str) -> str:
    return limits.check_name("queue", value, limits.MAX_QUEUE_BYTES, required=False)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


#: Complete transactions in flight at once, per backend: SQLite and memory commit one at
#: a time anyway; a pooled PostgreSQL overlaps a few, and what arrives meanwhile queues
#: up for the next batch.
COMPLETE_CONCURRENCY = {"memory": 1, "sqlite": 1}
DEFAULT_COMPLETE_CONCURRENCY = 2


def verdict_to_proto(ref: JobRef, verdict: LeaseLost | None) -> queue_pb2.CompleteVerdict:
    if verdict is None:
        return queue_pb2.CompleteVerdict(id=ref.id, token=ref.token, ok=True)
    return queue_pb2.CompleteVerdict(
        id=ref.id, token=ref.token, ok=False, error=str(verdict), resource=verdict.resource
    )


class QueueService(queue_pb2_grpc.QueueServiceServicer):
    """The queue service's RPC handlers."""

    def __init__(
        self,
        backend: QueueBackend,
        options: QueueOptions | None = None,
        *,
        metrics: QueueMetrics | None = None,
        rand: Callable[[], float] = random.random,
        leases: LeaseCalls | None = None,
    ) -> None:
        self.backend = backend
        #: The leases of claims of jobs naming their own resource (None: such jobs are
        #: refused, as a queue without the lease service cannot hold their leases).
        self.resources = ResourceLeases(backend, leases) if leases is not None else None
        self.options = options or QueueOptions()
        self.metrics = metrics or QueueMetrics(CollectorRegistry())
        self._rand = rand
        self._wakeups = _Wakeups()
        # Jobs enqueued through other servers, or by the application's own transactions
        # (fencing.pg.enqueue), wake this server's claims when they commit.
        backend.on_enqueued(self._wakeups.notify)
        #: Called after a schedule is put (the server points it at its scheduler's wake).
        self.schedules_changed: Callable[[], None] = lambda: None
        self.lost_rejections = 0
        #: Jobs completed by the completes a Claim carried (not by the Complete RPC).
        self.completed_in_claims = 0
        #: Completes (the RPC's and those a Claim carries) batched into shared transactions.
        self.completes = CompleteBatcher(
            backend,
            self._wakeups.notify,
            concurrency=COMPLETE_CONCURRENCY.get(backend.name, DEFAULT_COMPLETE_CONCURRENCY),
        )

    async def _why(self, exc: LeaseLost, refs: Sequence[JobRef]) -> LeaseLost:
        """``exc``, saying so when the refused job was cancelled (an operator's act, not
        a claim taken over: the worker logs which). Looked up on the refusal path only,
        so every backend says it alike."""
        ref = next((r for r in refs if r.token == exc.token), None)
        if ref is None:
            return exc
        try:
            record = await self.backend.get(ref.id)
        except FencingError:
            return exc  # the refusal stands; only its wording is lost
        if record is None or record.state is not JobState.CANCELLED:
            return exc
        return LeaseLost(
            f"job {ref.id} of {record.queue!r} {JOB_CANCELLED}: token {exc.token} "
            "is no longer its claim",
            resource=exc.resource,
            token=exc.token,
        )

    def _lost(self, exc: LeaseLost, call: str) -> LeaseLost:
        self.lost_rejections += 1
        self.metrics.lost.inc()
        log.warning("%s refused: %s", call, exc)
        return exc

    async def refresh_gauges_forever(self) -> None:
        """Every ``stats_interval_s``, set the backlog gauges from Stats (a server task)."""
        while True:
            try:
                counts = await self.backend.stats("", limits.DEFAULT_WINDOW_MS)
                paused = await self.backend.paused()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the gauges go stale; the next tick tries again
                # An outage fails every tick: the health probe's "backend down" says it once.
                outage = isinstance(exc, BackendUnavailableError)
                log.log(
                    logging.DEBUG if outage else logging.WARNING,
                    "queue stats for the gauges failed: %s",
                    exc,
                )
            else:
                self.metrics.observe(counts, paused)
            await asyncio.sleep(self.options.stats_interval_s)

    @rpc
    async def Enqueue(
        self, request: queue_pb2.EnqueueRequest, context: Context
    ) -> queue_pb2.EnqueueResponse:
        queue = limits.check_queue(request.queue)
        limits.check_batch(len(request.jobs), "jobs")
        now = _wall_ms()
        specs = [new_job_from_proto(j, f"jobs[{i}]", now) for i, j in enumerate(request.jobs)]
        for i, spec in enumerate(specs):
            self._require_leases(spec.resource, f"jobs[{i}].resource")
        enqueued = await self.backend.enqueue(queue, specs)
        created = sum(e.created for e in enqueued)
        if created:
            self.metrics.jobs.labels("enqueued").inc(created)
            self._wakeups.notify(queue)
        log.debug(
            "enqueued",
            extra={
                "queue": queue,
                "jobs": len(enqueued),
                "created": sum(e.created for e in enqueued),
            },
        )
        return queue_pb2.EnqueueResponse(
            jobs=[
                queue_pb2.EnqueuedJob(id=e.id, created=e.created, state=e.state) for e in enqueued
            ]
        )

    def _require_leases(self, resource: str, field: str) -> None:
        """A job naming its own resource needs the lease service: its claims hold the
        resource's lease (:mod:`lease_server.queue.resources`)."""
        if resource and self.resources is None:
            raise InvalidArgumentError(
                f"{field}: this queue service has no lease service to hold the lease on "
                f"{resource!r} its claims need; enqueue without a resource",
                field=field,
            )

    async def _claim(
        self, queue: str, worker: str, batch: int, ttl_ms: int, request_id: str
    ) -> list[JobRecord]:
        claimed = await self.backend.claim(queue, worker, batch, ttl_ms, request_id)
        return await self._hold(claimed, worker, ttl_ms, request_id)

    async def _hold(
        self, claimed: list[JobRecord], worker: str, ttl_ms: int, request_id: str
    ) -> list[JobRecord]:
        """``claimed``, each job naming its own resource holding the lease on it (those
        whose lease someone else holds are given back, left out). Every job goes through
        :meth:`ResourceLeases.take`, those naming none too: it remembers what each names,
        so ending the claim reads no job back."""
        if self.resources is None:
            return claimed
        return await self.resources.take(claimed, worker, ttl_ms, request_id)

    async def _named(self, refs: Sequence[JobRef]) -> list[tuple[JobRef, str]]:
        return await self.resources.named(refs) if self.resources is not None else []

    async def _end_leases(self, refs: Sequence[JobRef]) -> None:
        """Release the leases of ``refs`` (claims that ended) on their own resources."""
        if self.resources is not None:
            await self.resources.release(await self.resources.named(refs))

    @rpc
    async def Claim(
        self, request: queue_pb2.ClaimRequest, context: Context
    ) -> queue_pb2.ClaimResponse:
        queue = limits.check_queue(request.queue)
        worker = limits.check_worker(request.worker)
        batch = limits.check_batch(request.batch_size)
        ttl_ms = limits.check_ttl_ms(request.ttl_ms)
        wait_ms = limits.check_wait_ms(request.wait_ms)
        done = refs_from_proto(request.complete, "complete") if request.complete else []
        # A retry of a Claim whose reply was lost gets the jobs it claimed (the backend
        # replays them) rather than new ones: no attempt is counted for a lost reply.
        request_id = limits.check_request_id(request.request_id)
        loop = asyncio.get_running_loop()
        arrived = before_claim = loop.time()
        # The finished jobs first, each alone (a stale one is refused by its verdict and
        # the claim goes on), committed before the claim waits for work. With no other
        # complete under way they go with the first claim attempt, in one round trip;
        # otherwise they join the batch being gathered, shared with other workers.
        groups: list[CompleteGroup] = [([r], queue) for r in done]
        event = self._wakeups.event(queue)
        event.clear()  # before the first attempt: a job enqueued after it wakes the wait
        claimed: list[JobRecord] | None = None
        if groups and self.completes.idle:
            verdicts, woken, claimed = await self.backend.complete_and_claim(
                groups, queue, worker, batch, ttl_ms, request_id
            )
            for woke in woken:
                self._wakeups.notify(woke)
        else:
            verdicts = await self.completes.submit(groups)
        # The finished jobs' leases go before the new claims take theirs: the next job
        # naming the same resource finds it free.
        await self._end_leases([r for r, v in zip(done, verdicts, strict=True) if v is None])
        if claimed is not None:
            claimed = await self._hold(claimed, worker, ttl_ms, request_id)
        verdicts = [v if v is None else await self._why(v, done) for v in verdicts]
        for verdict in verdicts:
            if verdict is None:
                self.completed_in_claims += 1
                self.metrics.jobs.labels("completed").inc()
            else:
                self._lost(verdict, "complete in claim")
        completed = [verdict_to_proto(r, v) for r, v in zip(done, verdicts, strict=True)]
        deadline = loop.time() + wait_ms / 1000
        if claimed is None:
            event.clear()
            before_claim = loop.time()
            claimed = await self._claim(queue, worker, batch, ttl_ms, request_id)
        while not claimed and loop.time() < deadline:
            try:
                async with asyncio.timeout(
                    min(deadline - loop.time(), self.options.poll_interval_s)
                ):
                    await event.wait()
            except TimeoutError:
                pass
            event.clear()
            # Read before each attempt: the jobs' ttl counts from no earlier than this.
            before_claim = loop.time()
            claimed = await self._claim(queue, worker, batch, ttl_ms, request_id)
        rescued = sum(r.last_error.startswith(jobs.EXPIRED_PREFIX) for r in claimed)
        self.metrics.jobs.labels("claimed").inc(len(claimed))
        self.metrics.jobs.labels("rescued").inc(rescued)
        for record in claimed:
            log.debug(
                "claimed",
                extra={
                    "queue": queue,
                    "job_id": record.id,
                    "attempt": record.attempts,
                    "token": record.token,
                    "worker": worker,
                },
            )
        return queue_pb2.ClaimResponse(
            jobs=[job_to_proto(r, ttl_ms) for r in claimed],
            waited_ms=max(0, int((before_claim - arrived) * 1000)),
            completed=completed,
        )

    @rpc
    async def Heartbeat(
        self, request: queue_pb2.HeartbeatRequest, context: Context
    ) -> queue_pb2.HeartbeatResponse:
        refs = refs_from_proto(request.jobs)
        ttl_ms = limits.check_ttl_ms(request.ttl_ms)
        queue = _optional_queue(request.queue)
        try:
            # The leases first: a claim that lost its resource's lease is lost.
            if self.resources is not None:
                await self.resources.renew(await self._named(refs), ttl_ms)
            await self.backend.heartbeat(refs, ttl_ms, queue)
        except LeaseLost as exc:
            raise self._lost(await self._why(exc, refs), "heartbeat") from None
        return queue_pb2.HeartbeatResponse(ttl_ms=ttl_ms)

    @rpc
    async def Complete(
        self, request: queue_pb2.CompleteRequest, context: Context
    ) -> queue_pb2.CompleteResponse:
        refs = refs_from_proto(request.jobs)
        queue = _optional_queue(request.queue)
        # All or none, as one group of a batch shared with the Completes arriving with it
        # (the batcher tells the woken queues: the next job of an ordering key is ready).
        (verdict,) = await self.completes.submit([(refs, queue)])
        if verdict is not None:
            raise self._lost(await self._why(verdict, refs), "complete")
        await self._end_leases(refs)
        self.metrics.jobs.labels("completed").inc(len(refs))
        return queue_pb2.CompleteResponse()

    @rpc
    async def Fail(
        self, request: queue_pb2.FailRequest, context: Context
    ) -> queue_pb2.FailResponse:
        (ref,) = refs_from_proto([request.job], "job")
        queue = _optional_queue(request.queue)
        retry_in_ms = limits.check_delay_ms(request.retry_in_ms, "retry_in_ms")
        error = limits.truncate_error(request.error)
        policy = self.options.retry

        def delay(attempts: int) -> int:
            return jobs.retry_delay_ms(attempts, policy, self._rand(), retry_in_ms)

        try:
            outcome = await self.backend.fail(ref, error, delay, final=request.final, queue=queue)
        except LeaseLost as exc:
            raise self._lost(await self._why(exc, [ref]), "fail") from None
        await self._end_leases([ref])
        self.metrics.jobs.labels("dead" if outcome.state is JobState.DEAD else "retried").inc()
        if outcome.state is JobState.DEAD:
            log.warning("job dead: %r", error[:200], extra={"job_id": ref.id, "token": ref.token})
        else:
            log.info(
                "job failed, retry in %d ms",
                outcome.retry_in_ms,
                extra={"job_id": ref.id, "token": ref.token},
            )
        return queue_pb2.FailResponse(state=outcome.state, retry_in_ms=outcome.retry_in_ms)

    @rpc
    async def Release(
        self, request: queue_pb2.ReleaseJobsRequest, context: Context
    ) -> queue_pb2.ReleaseJobsResponse:
        refs = refs_from_proto(request.jobs)
        queue = _optional_queue(request.queue)
        try:
            woken = await self.backend.release(refs, queue)
        except LeaseLost as exc:
            raise self._lost(await self._why(exc, refs), "release") from None
        await self._end_leases(refs)
        self.metrics.jobs.labels("released").inc(len(refs))
        for woke in woken:
            self._wakeups.notify(woke)
        log.info("released", extra={"job_ids": ",".join(str(r.id) for r in refs)})
        return queue_pb2.ReleaseJobsResponse()

    @rpc
    async def Stats(
        self, request: queue_pb2.QueueStatsRequest, context: Context
    ) -> queue_pb2.QueueStatsResponse:
        queue = _optional_queue(request.queue)
        window_ms = limits.check_window_ms(request.window_ms)
        counts = await self.backend.stats(queue, window_ms)
        paused = await self.backend.paused()
        out = [stats_to_proto(c) for c in counts]
        for stats in out:
            stats.paused = stats.queue in paused
        # A pause outlives its queue's jobs (or comes before the first): such a queue is
        # listed too, with nothing in it, or nobody could see it is paused to resume it.
        listed = {stats.queue for stats in out}
        empty = sorted(q for q in paused if q not in listed and (not queue or q == queue))
        out.extend(queue_pb2.QueueStats(queue=q, paused=True) for q in empty)
        out.sort(key=lambda stats: stats.queue)
        return queue_pb2.QueueStatsResponse(queues=out)

    @rpc
    async def PutSchedule(
        self, request: queue_pb2.PutScheduleRequest, context: Context
    ) -> queue_pb2.ScheduleInfo:
        schedule = schedule_from_proto(request.schedule)
        self._require_leases(schedule.resource, "schedule.resource")
        _, existing = await self.backend.list_schedules()
        cap = self.options.max_schedules
        # A bound on what every scheduler reads each step, not a safety rule: puts that
        # race past it add a few more.
        if len(existing) >= cap and all(r.name != schedule.name for r in existing):
            raise ResourceExhaustedError(
                f"the queue backend holds {len(existing)} schedules, the most it takes "
                f"({cap}); delete some first",
                limit="schedules",
            )
        record = await self.backend.put_schedule(schedule)
        self.schedules_changed()
        log.info(
            "schedule put",
            extra={
                "schedule": schedule.name,
                "queue": schedule.queue,
                "cron": schedule.cron,
                "every_ms": schedule.every_ms,
            },
        )
        return schedule_to_proto(record, _wall_ms())

    @rpc
    async def DeleteSchedule(
        self, request: queue_pb2.DeleteScheduleRequest, context: Context
    ) -> queue_pb2.DeleteScheduleResponse:
        name = limits.check_schedule_name(request.name)
        queue = _optional_queue(request.queue)
        deleted = await self.backend.delete_schedule(name, queue)
        log.info(
            "schedule deleted" if deleted else "schedule to delete not found",
            extra={"schedule": name, "queue": queue},
        )
        return queue_pb2.DeleteScheduleResponse(deleted=deleted)

    @rpc
    async def ListSchedules(
        self, request: queue_pb2.ListSchedulesRequest, context: Context
    ) -> queue_pb2.ListSchedulesResponse:
        queue = _optional_queue(request.queue)
        now, records = await self.backend.list_schedules()
        return queue_pb2.ListSchedulesResponse(
            schedules=[
                schedule_to_proto(r, now) for r in records if not queue or r.schedule.queue == queue
            ],
            now_ms=now,
        )

    # -- admin --------------------------------------------------------------------------------

    def _audit(self, context: Context, action: str, queue: str, job_id: int, **fields: Any) -> None:
        """One INFO line per operator call: who (the principal, and the peer: who it is
        without auth), what, which job or queue (raise this logger's level to keep only
        warnings)."""
        principal = current_principal() or ""
        peer = context.peer()
        shown = " ".join(f"{k}={v}" for k, v in fields.items())
        log.info(
            "queue %s queue=%s job=%s by=%s peer=%s %s",
            action,
            queue or "(any)",
            job_id or "-",
            principal or "(no auth)",
            peer,
            shown,
            extra={
                "action": action,
                "queue": queue,
                "job_id": job_id,
                "principal": principal,
                "peer": peer,
                **fields,
            },
        )

    async def _named_job(self, job_id: int, queue: str) -> JobRecord:
        record = await self.backend.get(job_id)
        if record is None or (queue and record.queue != queue):
            raise NotFoundError(f"no job {job_id}" + (f" in queue {queue!r}" if queue else ""))
        return record

    def _acted(
        self,
        context: Context,
        action: str,
        job_id: int,
        queue: str,
        outcome: Administered | None,
    ) -> queue_pb2.JobActionResponse:
        if outcome is None:
            raise NotFoundError(f"no job {job_id}" + (f" in queue {queue!r}" if queue else ""))
        record = outcome.record
        if outcome.changed:
            self.metrics.jobs.labels("cancelled" if action == "cancel" else "requeued").inc()
            fields: dict[str, Any] = {"state": record.state.value}
            if outcome.fence_token:
                fields["fence_token"] = outcome.fence_token
                fields["resource"] = record.fenced_resource
            self._audit(context, action, record.queue, record.id, **fields)
        else:
            log.info(
                "queue %s of job %d: nothing to do, it is %s",
                action,
                record.id,
                record.state.value,
                extra={"action": action, "queue": record.queue, "job_id": record.id},
            )
        return queue_pb2.JobActionResponse(
            job=job_info_to_proto(record),
            changed=outcome.changed,
            fence_token=outcome.fence_token,
            resource=record.fenced_resource if outcome.fence_token else "",
        )

    @rpc
    async def ListJobs(
        self, request: queue_pb2.ListJobsRequest, context: Context
    ) -> queue_pb2.ListJobsResponse:
        """A page of a queue's jobs in id order; the cursor is the page's last id.

        Asks the backend for one more than the page, so a full page says whether
        another follows.
        """
        queue = limits.check_queue(request.queue)
        state = _job_state(request.state)
        size = limits.check_page_size(request.page_size)
        after = limits.check_job_page_token(request.page_token)
        records = await self.backend.list_jobs(queue, state, after, size + 1)
        page, more = records[:size], len(records) > size
        self._audit(
            context, "list_jobs", queue, 0, state=state or "any", after=after, jobs=len(page)
        )
        return queue_pb2.ListJobsResponse(
            jobs=[job_info_to_proto(r, request.include_payload) for r in page],
            next_page_token=str(page[-1].id) if more else "",
        )

    @rpc
    async def GetJob(self, request: queue_pb2.GetJobRequest, context: Context) -> queue_pb2.JobInfo:
        job_id = _job_id(request.id)
        queue = _optional_queue(request.queue)
        record = await self._named_job(job_id, queue)
        # Shown as a listing shows it (a ready job not yet due is scheduled), by the
        # backend's clock: the page of its queue that starts at it.
        page = await self.backend.list_jobs(record.queue, None, record.id - 1, 1)
        if page and page[0].id == record.id:
            record = page[0]
        history = await self.backend.history(record.id)
        self._audit(context, "get_job", record.queue, job_id, payload=request.include_payload)
        return job_info_to_proto(record, request.include_payload, history)

    @rpc
    async def RetryJob(
        self, request: queue_pb2.RetryJobRequest, context: Context
    ) -> queue_pb2.JobActionResponse:
        job_id = _job_id(request.id)
        queue = _optional_queue(request.queue)
        outcome = await self.backend.retry(job_id, queue)
        response = self._acted(context, "retry", job_id, queue, outcome)
        if response.changed:
            self._wakeups.notify(response.job.queue)
        return response

    @rpc
    async def CancelJob(
        self, request: queue_pb2.CancelJobRequest, context: Context
    ) -> queue_pb2.JobActionResponse:
        job_id = _job_id(request.id)
        queue = _optional_queue(request.queue)
        reason = limits.truncate_error(request.reason)
        before = await self.backend.get(job_id) if self.resources is not None else None
        outcome = await self.backend.cancel(job_id, queue, reason)
        if (
            self.resources is not None
            and before is not None
            and outcome is not None
            and outcome.fence_token
            and outcome.record.resource
        ):
            # Its claim held the lease on the job's resource: give it back, and fence
            # with a token of that resource's counter, not the queue's.
            token = await self.resources.cancelled(
                JobRef(before.id, before.token), outcome.record.resource
            )
            outcome = replace(outcome, fence_token=token)
        response = self._acted(context, "cancel", job_id, queue, outcome)
        if response.changed:
            self._wakeups.notify(response.job.queue)  # the next job of its ordering key
        return response

    @rpc
    async def RequeueDead(
        self, request: queue_pb2.RequeueDeadRequest, context: Context
    ) -> queue_pb2.RequeueDeadResponse:
        queue = limits.check_queue(request.queue)
        limit = limits.check_requeue_limit(request.limit)
        requeued = await self.backend.requeue_dead(queue, limit)
        if requeued:
            self.metrics.jobs.labels("requeued").inc(requeued)
            self._wakeups.notify(queue)
        self._audit(context, "requeue_dead", queue, 0, requeued=requeued, limit=limit)
        return queue_pb2.RequeueDeadResponse(requeued=requeued)

    @rpc
    async def PauseQueue(
        self, request: queue_pb2.PauseQueueRequest, context: Context
    ) -> queue_pb2.PauseQueueResponse:
        queue = limits.check_queue(request.queue)
        changed = await self.backend.set_paused(queue, True)
        self._audit(context, "pause_queue", queue, 0, changed=changed)
        return queue_pb2.PauseQueueResponse(changed=changed)

    @rpc
    async def ResumeQueue(
        self, request: queue_pb2.ResumeQueueRequest, context: Context
    ) -> queue_pb2.PauseQueueResponse:
        queue = limits.check_queue(request.queue)
        changed = await self.backend.set_paused(queue, False)
        if changed:
            self._wakeups.notify(queue)  # claims waiting here; other servers poll
        self._audit(context, "resume_queue", queue, 0, changed=changed)
        return queue_pb2.PauseQueueResponse(changed=changed)
