"""The I/O-free half of the queue SDK, shared by the sync and asyncio clients and workers.

:class:`Job` is a claimed job: its proof (``resource``, ``token``: pass the job
itself to ``guard.write(job, ...)``) and its local liveness (``lost``, ``check()``),
kept apart as for leases. The rest builds requests and reads responses, and
:class:`QueueSteps` holds the exchanges both twins run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from fencing._renewal import RenewalPolicy, RenewalSchedule
from fencing.client._core import (
    Call,
    Retries,
    Sleep,
    Steps,
    is_transient,
    new_request_id,
    ttl_ms_of,
    unary,
    wait_ms_of,
)
from fencing.errors import FencingError, InvalidArgumentError, LeaseLost
from fencing.types import JOB_CANCELLED, Claim
from fencing.v1 import queue_pb2

log = logging.getLogger("fencing.client.queue")

Clock = Callable[[], float]


class Job:
    """A claimed job.

    ``resource`` and ``token`` are the claim's proof: the guard fences the job's
    effects with them (``guard.write(job, ops, idempotency_key=...)``), and every
    later call on the job must present the token. ``lost`` (a ``threading.Event``) is
    set once this worker can no longer trust the claim (a heartbeat was refused, the
    local deadline passed, or the worker gave the job back); :meth:`check` raises
    :class:`LeaseLost` from then on. ``attempt`` counts claims (1 for the first).
    """

    def __init__(
        self,
        msg: queue_pb2.Job,
        sent_at: float,
        policy: RenewalPolicy | None = None,
        clock: Clock = time.monotonic,
        *,
        waited_ms: int = 0,
        received_at: float | None = None,
    ) -> None:
        self.id: int = msg.id
        self.queue: str = msg.queue
        self.payload: bytes = msg.payload
        self.token: int = msg.token
        self.resource: str = msg.resource
        self.attempt: int = msg.attempt
        self.max_attempts: int = msg.max_attempts
        self.ordering_key: str = msg.ordering_key
        self.priority: int = msg.priority
        self.idempotency_key: str = msg.idempotency_key
        self.last_error: str = msg.last_error
        self.ttl_ms: int = msg.ttl_ms
        self.enqueued_at_ms: int = msg.enqueued_at_ms
        self.lost = threading.Event()
        self.lost_reason = ""
        self._clock = clock
        self._lock = threading.Lock()
        # The claim's lease starts at the claim: the send plus the wait the server
        # reports (a Claim that waited for work), not at the send.
        self.schedule = RenewalSchedule(
            msg.ttl_ms, sent_at, policy, waited_ms=waited_ms, received_at=received_at
        )

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else "live"
        return (
            f"<Job {self.id} of {self.queue!r} attempt={self.attempt} token={self.token} {state}>"
        )

    @property
    def schedule_name(self) -> str:
        """The name of the schedule that enqueued this job ("" for a job enqueued by hand)."""
        return self._periodic()[0]

    @property
    def period(self) -> float | None:
        """The start of the period this periodic job is for (Unix seconds; None for a job
        enqueued by hand): a handler keys its effect by it."""
        ms = self._periodic()[1]
        return None if ms is None else ms / 1000

    def _periodic(self) -> tuple[str, int | None]:
        # The server's key of a period's job: "periodic:<schedule>:<period start in ms>".
        prefix, _, rest = self.idempotency_key.partition(":")
        name, _, period = rest.rpartition(":")
        if prefix != "periodic" or not name or not period.isdigit():
            return "", None
        return name, int(period)

    @property
    def final_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def log_fields(self) -> dict[str, object]:
        """What a log line about this job may say: never the payload."""
        return {
            "queue": self.queue,
            "job_id": self.id,
            "attempt": self.attempt,
            "token": self.token,
        }

    def remaining(self) -> float:
        """Seconds until the local deadline (0 once lost)."""
        if self.lost.is_set():
            return 0.0
        with self._lock:
            return self.schedule.remaining(self._clock())

    def expired(self) -> bool:
        with self._lock:
            return self.schedule.expired(self._clock())

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the claim is lost or its local deadline passed."""
        if not self.lost.is_set() and self.expired():
            self.mark_lost("local deadline passed")
        if self.lost.is_set():
            raise LeaseLost(
                f"job {self.id}: claim with token {self.token} is lost ({self.lost_reason})",
                resource=self.resource,
                token=self.token,
            )

    def mark_lost(self, why: str) -> bool:
        """Set ``lost`` (once); True if this call set it."""
        with self._lock:
            if self.lost.is_set():
                return False
            self.lost_reason = why
            self.lost.set()
            return True

    def renewed(self, sent_at: float, ttl_ms: int) -> None:
        with self._lock:
            self.schedule.renewed(sent_at, ttl_ms)

    def renew_failed(self, now: float) -> None:
        with self._lock:
            self.schedule.failed(now)

    def due_on_arrival(self) -> bool:
        """The claim arrived with its first heartbeat already due (a late reply):
        heartbeat it before handing it out."""
        with self._lock:
            return self.schedule.due_on_arrival(self._clock())

    def next_renewal(self) -> float:
        with self._lock:
            return min(self.schedule.next_renewal, self.schedule.deadline)


@dataclass(frozen=True, slots=True)
class EnqueuedJob:
    """What Enqueue returns per job: ``created`` is False for a known idempotency key."""

    id: int
    created: bool
    state: str


@dataclass(frozen=True, slots=True)
class FailOutcome:
    """After Fail: ``"ready"`` again in ``retry_in`` seconds, or ``"dead"``."""

    state: str
    retry_in: float


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's counts (see ``fencing.v1.QueueStats``); ages in seconds."""

    queue: str
    ready: int
    scheduled: int
    waiting: int
    running: int
    expired: int
    succeeded: int
    dead: int
    oldest_ready_age: float
    retrying: int
    retry_rate: float
    finished_in_window: int
    window: float
    cancelled: int = 0
    #: Paused by :meth:`~fencing.client.QueueClient.pause`: hands out no claims.
    paused: bool = False


def stats(msg: queue_pb2.QueueStats) -> QueueStats:
    return QueueStats(
        queue=msg.queue,
        ready=msg.ready,
        scheduled=msg.scheduled,
        waiting=msg.waiting,
        running=msg.running,
        expired=msg.expired,
        succeeded=msg.succeeded,
        dead=msg.dead,
        oldest_ready_age=msg.oldest_ready_age_ms / 1000,
        retrying=msg.retrying,
        retry_rate=msg.retry_rate,
        finished_in_window=msg.finished_in_window,
        window=msg.window_ms / 1000,
        cancelled=msg.cancelled,
        paused=msg.paused,
    )


# -- admin: what an operator reads and does ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobAttempt:
    """One attempt of a job (``fencing.v1.JobAttempt``): one claim, start to end.

    ``attempt`` is its number (a released attempt did not count, so the next claim has
    the same); ``outcome`` is ``running``, ``succeeded``, ``failed``, ``expired`` (its
    lease ran out: rescued by another claim, or declared dead by the reaper),
    ``released`` or ``cancelled``; ``error`` says why it failed, expired or was
    cancelled (at most 4,096 bytes). Times are Unix milliseconds on the server's clock,
    ``ended_at_ms`` 0 while it runs.
    """

    attempt: int
    started_at_ms: int
    ended_at_ms: int
    worker: str
    token: int
    outcome: str
    error: str


@dataclass(frozen=True, slots=True)
class JobInfo:
    """One job as stored (``fencing.v1.JobInfo``): never a claim, only a look at it.

    ``state`` is ``waiting``, ``ready``, ``running``, ``succeeded``, ``dead`` or
    ``cancelled``; ``token`` the job's current token (the live claim's while running);
    ``lease_owner`` the worker of the current or last claim. Times are Unix
    milliseconds on the server's clock, 0 when that has not happened; ``payload`` is
    empty unless asked for (``payload_size`` always says how large it is).
    ``history``: its attempts, oldest first (the newest 20 are kept), from ``get_job``
    only (a listing leaves it empty).
    """

    id: int
    queue: str
    state: str
    payload_size: int
    payload: bytes
    attempts: int
    max_attempts: int
    last_error: str
    token: int
    lease_owner: str
    resource: str
    ordering_key: str
    priority: int
    idempotency_key: str
    enqueued_at_ms: int
    run_at_ms: int
    claimed_at_ms: int
    finished_at_ms: int
    lease_expires_at_ms: int
    history: tuple[JobAttempt, ...] = ()


def job_attempt(msg: queue_pb2.JobAttempt) -> JobAttempt:
    return JobAttempt(
        attempt=msg.attempt,
        started_at_ms=msg.started_at_ms,
        ended_at_ms=msg.ended_at_ms,
        worker=msg.worker,
        token=msg.token,
        outcome=msg.outcome,
        error=msg.error,
    )


def job_info(msg: queue_pb2.JobInfo) -> JobInfo:
    return JobInfo(
        id=msg.id,
        queue=msg.queue,
        state=msg.state,
        payload_size=msg.payload_size,
        payload=msg.payload,
        attempts=msg.attempts,
        max_attempts=msg.max_attempts,
        last_error=msg.last_error,
        token=msg.token,
        lease_owner=msg.lease_owner,
        resource=msg.resource,
        ordering_key=msg.ordering_key,
        priority=msg.priority,
        idempotency_key=msg.idempotency_key,
        enqueued_at_ms=msg.enqueued_at_ms,
        run_at_ms=msg.run_at_ms,
        claimed_at_ms=msg.claimed_at_ms,
        finished_at_ms=msg.finished_at_ms,
        lease_expires_at_ms=msg.lease_expires_at_ms,
        history=tuple(job_attempt(a) for a in msg.history),
    )


@dataclass(frozen=True, slots=True)
class JobAction:
    """After RetryJob or CancelJob: the job, whether the call changed it (False: it was in
    no state the call applies to), and for a cancel of a running job the token that
    fenced its claim (``fence_token``, for ``resource``)."""

    job: JobInfo
    changed: bool
    fence_token: int = 0
    resource: str = ""

    @property
    def fence(self) -> Claim | None:
        """What a monotonic guard must be fenced to so the cancelled job's worker is
        refused there too: the cancelled job's resource at its last token (None for a
        job that is not cancelled or never ran). Safe to repeat: nobody holds a claim of
        a cancelled job, and a retry's next claim takes a larger token."""
        if self.job.state != "cancelled" or self.job.token <= 0:
            return None
        return Claim(self.job.resource, self.job.token)


def job_action(msg: queue_pb2.JobActionResponse) -> JobAction:
    return JobAction(job_info(msg.job), msg.changed, msg.fence_token, msg.resource)


def list_jobs_request(
    queue: str, state: str, page_size: int, page_token: str, include_payload: bool
) -> queue_pb2.ListJobsRequest:
    return queue_pb2.ListJobsRequest(
        queue=queue,
        state=state,
        page_size=page_size,
        page_token=page_token,
        include_payload=include_payload,
    )


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A periodic job's schedule as the server keeps it (see ``fencing.v1.ScheduleInfo``).

    Exactly one of ``cron`` (5 fields, in ``timezone``; "" is UTC) and ``every`` (seconds)
    is set. ``next_run`` is the start of the next period not yet enqueued, ``last_period``
    the latest one enqueued (None: none yet) with its job ``last_job_id``; Unix seconds.
    """

    name: str
    queue: str
    cron: str
    every: float
    timezone: str
    payload: bytes
    priority: int
    max_attempts: int
    resource: str
    catch_up: int
    created_at: float
    next_run: float
    last_period: float | None
    last_job_id: int


def schedule_info(msg: queue_pb2.ScheduleInfo) -> ScheduleInfo:
    s = msg.schedule
    return ScheduleInfo(
        name=s.name,
        queue=s.queue,
        cron=s.cron,
        every=s.every_ms / 1000,
        timezone=s.timezone,
        payload=s.payload,
        priority=s.priority,
        max_attempts=s.max_attempts,
        resource=s.resource,
        catch_up=s.catch_up,
        created_at=msg.created_at_ms / 1000,
        next_run=msg.next_run_ms / 1000,
        last_period=msg.last_period_ms / 1000 if msg.last_period_ms else None,
        last_job_id=msg.last_job_id,
    )


def put_schedule_request(
    name: str,
    queue: str,
    *,
    cron: str = "",
    every: float = 0.0,
    timezone: str = "",
    payload: bytes | str = b"",
    priority: int = 0,
    max_attempts: int = 0,
    resource: str = "",
    catch_up: int = 0,
) -> queue_pb2.PutScheduleRequest:
    """A PutSchedule: ``cron`` (5 fields) or ``every`` (seconds, at least 1), not both."""
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    if every < 0:
        raise InvalidArgumentError("every must not be negative", field="every")
    return queue_pb2.PutScheduleRequest(
        schedule=queue_pb2.Schedule(
            name=name,
            queue=queue,
            cron=cron,
            every_ms=round(every * 1000),
            timezone=timezone,
            payload=payload,
            priority=priority,
            max_attempts=max_attempts,
            resource=resource,
            catch_up=catch_up,
        )
    )


def new_job(
    payload: bytes | str,
    *,
    idempotency_key: str = "",
    ordering_key: str = "",
    priority: int = 0,
    max_attempts: int = 0,
    delay: float = 0.0,
    run_at: datetime | float | None = None,
    resource: str = "",
) -> queue_pb2.NewJob:
    """One job for Enqueue. ``delay`` in seconds; ``run_at`` a datetime or Unix seconds."""
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    if delay < 0:
        raise InvalidArgumentError("delay must not be negative", field="delay")
    run_at_ms = 0
    if run_at is not None:
        seconds = run_at.timestamp() if isinstance(run_at, datetime) else float(run_at)
        run_at_ms = max(1, round(seconds * 1000))
    return queue_pb2.NewJob(
        payload=payload,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        delay_ms=round(delay * 1000),
        run_at_ms=run_at_ms,
        ordering_key=ordering_key,
        priority=priority,
        resource=resource,
    )


def enqueued(msg: queue_pb2.EnqueueResponse) -> list[EnqueuedJob]:
    return [EnqueuedJob(j.id, j.created, j.state) for j in msg.jobs]


def refs(jobs: Iterable[Job]) -> list[queue_pb2.JobRef]:
    return [queue_pb2.JobRef(id=j.id, token=j.token) for j in jobs]


def job_list(jobs: Job | Sequence[Job]) -> list[Job]:
    return [jobs] if isinstance(jobs, Job) else list(jobs)


def queue_of(jobs: Sequence[Job]) -> str:
    """The one queue of ``jobs``, which every call on them names (for the server's check
    and its auth policy); mixing queues in one call is refused."""
    queues = {j.queue for j in jobs}
    if len(queues) > 1:
        raise InvalidArgumentError(
            f"one call names jobs of one queue, not {sorted(queues)}", field="jobs"
        )
    return queues.pop() if queues else ""


def complete_request(jobs: Sequence[Job]) -> queue_pb2.CompleteRequest:
    """A Complete of ``jobs`` (all of one queue)."""
    return queue_pb2.CompleteRequest(jobs=refs(jobs), queue=queue_of(jobs))


def error_text(error: str | BaseException) -> str:
    """The text a Fail carries: ``Type: message`` for an exception (never a traceback)."""
    if isinstance(error, BaseException):
        message = str(error)
        return f"{type(error).__name__}: {message}" if message else type(error).__name__
    return error


def lost_because(exc: LeaseLost) -> str:
    """Why the server refused a job's claim, as the workers say it: an operator's cancel
    (the server's refusal says so) or a claim taken over."""
    return JOB_CANCELLED if JOB_CANCELLED in exc.message else "was taken over"


def stale_job(jobs: Sequence[Job], exc: LeaseLost) -> Job | None:
    """Which of ``jobs`` a LEASE_LOST refusal of a batch call names (tokens are unique)."""
    for job in jobs:
        if job.token == exc.token and (not exc.resource or job.resource == exc.resource):
            return job
    return None


def split_expired(jobs: Sequence[Job]) -> tuple[list[Job], list[Job]]:
    """(still live, lost): jobs past their local deadline are marked lost, not renewed."""
    live: list[Job] = []
    lost: list[Job] = []
    for job in jobs:
        if job.lost.is_set():
            continue
        if job.expired():
            job.mark_lost("local deadline passed before a heartbeat succeeded")
            lost.append(job)
        else:
            live.append(job)
    return live, lost


def claimed(
    response: queue_pb2.ClaimResponse,
    sent_at: float,
    received_at: float,
    policy: RenewalPolicy,
    clock: Clock,
) -> list[Job]:
    """The jobs of a Claim reply, their leases started at the claim (send + waited)."""
    return [
        Job(msg, sent_at, policy, clock, waited_ms=response.waited_ms, received_at=received_at)
        for msg in response.jobs
    ]


def claim_request(
    queue: str,
    worker: str,
    batch: int,
    ttl_ms: int,
    wait_ms: int,
    done: Sequence[Job] = (),
    request_id: str = "",
) -> queue_pb2.ClaimRequest:
    """A Claim, carrying ``done`` (finished jobs of ``queue``) to complete first, and the
    ``request_id`` every retry of it repeats (the server replays the jobs it claimed)."""
    if done and queue_of(done) != queue:
        raise InvalidArgumentError(
            f"jobs completed with a claim of {queue!r} must belong to it", field="done"
        )
    return queue_pb2.ClaimRequest(
        queue=queue,
        worker=worker,
        batch_size=batch,
        ttl_ms=ttl_ms,
        wait_ms=wait_ms,
        complete=refs(done),
        request_id=request_id,
    )


def completed_verdicts(
    done: Sequence[Job], response: queue_pb2.ClaimResponse
) -> list[LeaseLost | None] | None:
    """The verdict on each of ``done`` a Claim carried (None: completed; ``LeaseLost``:
    refused, and that job is marked lost), or None when the server returned none (it
    predates completes in a Claim and ignored them: the caller completes them itself)."""
    if len(response.completed) != len(done):
        return None
    verdicts: list[LeaseLost | None] = []
    for job, verdict in zip(done, response.completed, strict=True):
        if verdict.ok and verdict.id == job.id and verdict.token == job.token:
            verdicts.append(None)
            continue
        lost = LeaseLost(
            verdict.error or f"job {job.id}: complete with token {job.token} refused",
            resource=verdict.resource,
            token=job.token,
        )
        job.mark_lost(f"complete refused: the job {lost_because(lost)}")
        verdicts.append(lost)
    return verdicts


def heartbeat_timeout(jobs: Sequence[Job], cap: float) -> float:
    """A heartbeat's RPC deadline: never past the earliest local deadline among ``jobs``."""
    return max(0.001, min(cap, *(j.remaining() for j in jobs)))


# -- the exchanges, as steps for either twin --------------------------------------------------


class QueueClientLike(Protocol):
    """What :class:`QueueSteps` reads of a queue client (either twin)."""

    worker: str
    rpc_timeout: float
    policy: RenewalPolicy
    _clock: Clock

    @property
    def _stub(self) -> Any: ...


class QueueSteps:
    """The queue client's exchanges that take more than one call or judge their
    outcome: claim (with the heartbeat of late claims), heartbeat, and the settling
    calls (complete, fail, release) that mark a refused job lost. Run by the twins
    (:mod:`fencing.client._calls`); see :mod:`fencing.client._core` for steps."""

    def __init__(self, client: QueueClientLike) -> None:
        self.client = client

    def claim(self, queue: str, batch: int, ttl: float, wait: float) -> Steps[list[Job]]:
        """``claim``: claims whose reply came too late to trust are heartbeated before
        they are handed out; those found taken over are left out."""
        jobs, _ = yield from self.complete_and_claim((), queue, batch, ttl, wait)
        return jobs

    def complete_and_claim(
        self, done: Sequence[Job], queue: str, batch: int, ttl: float, wait: float
    ) -> Steps[tuple[list[Job], list[LeaseLost | None]]]:
        """``complete_and_claim``: one Claim carrying ``done``; a server that returns no
        verdicts (it predates completes in a Claim and ignored them) has each completed
        on its own. Transient failures are retried (:data:`RETRY_BACKOFF`) with the same
        request id: a Claim whose reply was lost gets the jobs it claimed back, with the
        same tokens and attempts (their completes are judged again: a repeat is a
        no-op); what is left of ``wait`` is asked for again."""
        client = self.client
        items = list(done)
        ttl_ms, request_id = ttl_ms_of(ttl), new_request_id()
        end = client._clock() + max(0.0, wait)
        # The budget of the retries: the wait, and the client's rpc_timeout after it.
        retries = Retries(end + client.rpc_timeout)
        while True:
            left = max(0.0, end - client._clock())
            request = claim_request(
                queue, client.worker, batch, ttl_ms, wait_ms_of(left), items, request_id
            )
            sent_at = client._clock()
            try:
                response = yield Call(client._stub.Claim, request, left + client.rpc_timeout)
                break
            except FencingError as exc:
                now = client._clock()
                pause = retries.pause(exc, now, now - sent_at)
                if pause is None:
                    raise
                log.info("claim of %r failed (%s): retrying with the same request id", queue, exc)
            yield Sleep(pause)
        jobs = claimed(response, sent_at, client._clock(), client.policy, client._clock)
        verdicts = completed_verdicts(items, response)
        if verdicts is None:
            verdicts = []
            for job in items:
                try:
                    yield from self.settle([job], client._stub.Complete, complete_request([job]))
                    verdicts.append(None)
                except LeaseLost as exc:
                    verdicts.append(exc)
        due = [job for job in jobs if job.due_on_arrival()]
        if due:
            yield from self.heartbeat_on_arrival(due)
        return [job for job in jobs if not job.lost.is_set()], verdicts

    def heartbeat_on_arrival(self, jobs: list[Job]) -> Steps[None]:
        """Heartbeat claims whose reply came too late to trust their first deadline
        (the server may still hold them for us even if that deadline passed). A claim
        found taken over is marked lost and not handed out; a transient failure leaves
        the claims to the caller's heartbeats."""
        try:
            lost = yield from self.heartbeat(list(jobs), None, [], self.client.rpc_timeout)
        except FencingError as exc:
            if not is_transient(exc):
                raise
            log.info("heartbeat of %d claims on arrival failed: %s", len(jobs), exc)
            return
        for job in lost:
            log.warning("job %d claim arrived too late: taken over before it could be used", job.id)

    def heartbeat(
        self, live: list[Job], ttl: float | None, lost: list[Job], cap: float | None = None
    ) -> Steps[list[Job]]:
        """Heartbeat ``live``; append the refused ones to ``lost`` and return it.
        ``cap``: the call's deadline (default: never past the earliest local deadline).
        A refusal that names no job is judged job by job."""
        client = self.client
        while live:
            ttl_ms = ttl_ms_of(ttl) if ttl is not None else live[0].ttl_ms
            request = queue_pb2.HeartbeatRequest(
                jobs=refs(live), ttl_ms=ttl_ms, queue=queue_of(live)
            )
            sent_at = client._clock()
            timeout = heartbeat_timeout(live, client.rpc_timeout) if cap is None else cap
            try:
                response = yield Call(client._stub.Heartbeat, request, timeout)
            except LeaseLost as exc:
                stale = stale_job(live, exc)
                if stale is None:  # cannot tell which: judge them one by one
                    if len(live) > 1:
                        for job in list(live):
                            lost += yield from self.heartbeat([job], ttl, [], cap)
                        return lost
                    stale = live[0]
                stale.mark_lost(f"heartbeat refused: the job {lost_because(exc)}")
                lost.append(stale)
                live.remove(stale)
                continue
            for job in live:
                job.renewed(sent_at, response.ttl_ms)
            break
        return lost

    def settle(self, items: list[Job], method: Callable[..., Any], request: object) -> Steps[Any]:
        """Complete, Fail or Release ``items`` (safe to retry: a repeat is a no-op); a
        refusal marks the stale job it names lost, and is raised."""
        try:
            return (yield from unary(method, request, retry=True, budget=self.client.rpc_timeout))
        except LeaseLost as exc:
            stale = stale_job(items, exc)
            if stale is not None:
                stale.mark_lost(f"refused: the job {lost_because(exc)}")
            raise
