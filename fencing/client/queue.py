"""``QueueClient``: enqueue, claim, heartbeat, complete, fail and release jobs (blocking);
list, inspect, retry and cancel them as an operator.

::

    queue = QueueClient("127.0.0.1:50051")          # the lease server hosts the queues
    queue.enqueue("emails", b'{"to": "a@example.com"}', idempotency_key="welcome-42")
    for job in queue.claim("emails", batch=10, ttl=30, wait=5):
        guard.write(job, Put("sent/42", b"1"), idempotency_key=f"job-{job.id}")
        queue.complete(job)

Most programs want :class:`fencing.worker.Worker` instead, which heartbeats,
cancels, retries and shuts down gracefully. Complete, Fail, Release and Heartbeat
are safe to retry (a repeat of a call that took effect is a no-op), so this client
retries them on transient failures; Enqueue only when every job has an
idempotency key; Claim with one request id for every try (a retry whose first try's
reply was lost gets the jobs that try claimed: no attempt is lost to a lost reply).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import TypeVar, cast

import grpc

from fencing._renewal import RenewalPolicy
from fencing.client import _core
from fencing.client import _queue as core
from fencing.client._calls import BlockingCalls
from fencing.client._queue import (
    EnqueuedJob,
    FailOutcome,
    Job,
    JobAction,
    JobAttempt,
    JobInfo,
    QueueStats,
    ScheduleInfo,
)
from fencing.client.guard import GuardClient
from fencing.errors import FencingError, LeaseLost, StaleTokenError
from fencing.tls import TLSConfig
from fencing.v1 import queue_pb2, queue_pb2_grpc

T = TypeVar("T")
log = logging.getLogger(__name__)
Clock = Callable[[], float]


class QueueClient(BlockingCalls):
    """A blocking client of ``fencing.v1.QueueService`` (hosted by the lease server).

    ``worker`` names this client in claims (default host-pid-random). Times are seconds.
    ``tls``, ``token`` and ``credentials`` secure the channel as for ``LeaseClient``.
    """

    def __init__(
        self,
        target: str,
        *,
        worker: str | None = None,
        tls: TLSConfig | None = None,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        rpc_timeout: float = _core.DEFAULT_RPC_TIMEOUT,
        policy: RenewalPolicy | None = None,
        clock: Clock = time.monotonic,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.target = target
        self.worker = worker or _core.default_holder()
        self.rpc_timeout = rpc_timeout
        self.policy = policy or RenewalPolicy()
        self._clock = clock
        self._channel = (
            channel
            if channel is not None
            else _core.open_channel(target, tls=tls, token=token, credentials=credentials)
        )
        self._stub = queue_pb2_grpc.QueueServiceStub(self._channel)
        self._steps = core.QueueSteps(self)

    def close(self) -> None:
        self._channel.close()

    # -- producing -------------------------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        payload: bytes | str,
        *,
        idempotency_key: str = "",
        ordering_key: str = "",
        priority: int = 0,
        max_attempts: int = 0,
        delay: float = 0.0,
        run_at: datetime | float | None = None,
        resource: str = "",
    ) -> EnqueuedJob:
        """Add one job. With ``idempotency_key``, a second enqueue returns the first job
        (``created=False``). ``ordering_key``: jobs of one key run one at a time, in order.
        ``max_attempts`` 0 means the server's default (5)."""
        job = core.new_job(
            payload,
            idempotency_key=idempotency_key,
            ordering_key=ordering_key,
            priority=priority,
            max_attempts=max_attempts,
            delay=delay,
            run_at=run_at,
            resource=resource,
        )
        return self.enqueue_many(queue, [job])[0]

    def enqueue_many(self, queue: str, jobs: Sequence[queue_pb2.NewJob]) -> list[EnqueuedJob]:
        """Add several jobs (built with :func:`fencing.client.new_job`) atomically."""
        request = queue_pb2.EnqueueRequest(queue=queue, jobs=jobs)
        retry = all(j.idempotency_key for j in jobs)
        response = self._call(self._stub.Enqueue, request, retry=retry)
        return core.enqueued(response)

    # -- consuming -------------------------------------------------------------------------

    def claim(
        self, queue: str, *, batch: int = 1, ttl: float = 30.0, wait: float = 0.0
    ) -> list[Job]:
        """Claim up to ``batch`` jobs for ``ttl`` seconds, waiting up to ``wait`` for one.

        Each claim's local deadline starts at the claim (the send plus the wait the
        server reports), so jobs that arrive after a long wait have their whole ttl;
        claims whose reply came too late to trust are heartbeated before they are
        returned (those found taken over are left out). The jobs are not heartbeated
        after that: call :meth:`heartbeat` every ttl/3, or use a Worker. Transient
        failures (a deadline, the server unreachable) are retried with the same request
        id: if the server had claimed jobs for a try whose reply was lost, the retry
        gets those jobs, with the same tokens and attempts.
        """
        jobs, _ = self.complete_and_claim((), queue, batch=batch, ttl=ttl, wait=wait)
        return jobs

    def complete_and_claim(
        self,
        done: Sequence[Job],
        queue: str,
        *,
        batch: int = 1,
        ttl: float = 30.0,
        wait: float = 0.0,
    ) -> tuple[list[Job], list[LeaseLost | None]]:
        """Mark ``done`` (finished jobs of ``queue``) succeeded and claim the next jobs,
        in one call: what :meth:`complete` then :meth:`claim` do, one round trip.

        Returns the claimed jobs (as :meth:`claim`) and one verdict per job of ``done``,
        in order: None (completed, or already was) or ``LeaseLost`` (refused: the job
        was taken over; it is marked ``lost``). A refused job does not stop the others
        nor the claim. Transient failures are retried with the same request id, as
        :meth:`claim`'s are: a retry whose first try's reply was lost gets the same jobs
        back, and judges the completes again (a repeat is a no-op).
        """
        return self._run(self._steps.complete_and_claim(done, queue, batch, ttl, wait))

    def heartbeat(self, jobs: Job | Sequence[Job], ttl: float | None = None) -> list[Job]:
        """Extend the claims of ``jobs``; return those found lost (now marked ``lost``).

        A refused job is marked lost and the rest are renewed; transient failures raise
        (the caller retries on its schedule, before the jobs' local deadlines).
        """
        live, lost = core.split_expired(core.job_list(jobs))
        return self._run(self._steps.heartbeat(live, ttl, lost))

    def complete(self, jobs: Job | Sequence[Job]) -> None:
        """Mark ``jobs`` succeeded (all or none); ``LeaseLost`` (naming one) if any is stale."""
        items = core.job_list(jobs)
        request = core.complete_request(items)
        self._settle(items, self._stub.Complete, request)

    def fail(
        self,
        job: Job,
        error: str | BaseException,
        *,
        retry_in: float | None = None,
        final: bool = False,
    ) -> FailOutcome:
        """Record a failed attempt: ready again after the server's backoff (or ``retry_in``
        seconds), or dead after the last attempt (or at once with ``final``)."""
        request = queue_pb2.FailRequest(
            job=queue_pb2.JobRef(id=job.id, token=job.token),
            error=core.error_text(error),
            retry_in_ms=0 if retry_in is None else max(1, round(retry_in * 1000)),
            final=final,
            queue=job.queue,
        )
        response = self._settle([job], self._stub.Fail, request)
        return FailOutcome(response.state, response.retry_in_ms / 1000)

    def release(self, jobs: Job | Sequence[Job]) -> None:
        """Give ``jobs`` back at once (the attempt does not count), e.g. on shutdown."""
        items = core.job_list(jobs)
        request = queue_pb2.ReleaseJobsRequest(jobs=core.refs(items), queue=core.queue_of(items))
        self._settle(items, self._stub.Release, request)
        for job in items:
            job.mark_lost("released")

    def _settle(self, items: list[Job], method: Callable[..., T], request: object) -> T:
        return cast(T, self._run(self._steps.settle(items, method, request)))

    def stats(self, queue: str = "", *, window: float = 0.0) -> list[QueueStats]:
        """Counts and ages of ``queue`` (or every queue)."""
        request = queue_pb2.QueueStatsRequest(queue=queue, window_ms=round(window * 1000))
        response = self._call(self._stub.Stats, request, retry=True)
        return [core.stats(s) for s in response.queues]

    # -- periodic jobs -----------------------------------------------------------------------

    def put_schedule(
        self,
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
    ) -> ScheduleInfo:
        """Add the schedule of a periodic job, or replace the one named ``name``.

        Every lease server sharing the queue backend enqueues one job per period into
        ``queue`` (its idempotency key is ``periodic:<name>:<period start in ms>``, its
        due time the period's start): ``cron`` is a 5-field expression evaluated in
        ``timezone`` (default UTC), ``every`` a fixed interval in seconds (at least 1,
        periods aligned to the Unix epoch). After downtime only the latest missed period
        is enqueued, or with ``catch_up=N`` each missed one, the latest N (at most 100).
        A replaced schedule keeps its last period: no period is enqueued twice.
        """
        request = core.put_schedule_request(
            name,
            queue,
            cron=cron,
            every=every,
            timezone=timezone,
            payload=payload,
            priority=priority,
            max_attempts=max_attempts,
            resource=resource,
            catch_up=catch_up,
        )
        response = self._call(self._stub.PutSchedule, request, retry=True)
        return core.schedule_info(response)

    def delete_schedule(self, name: str, *, queue: str = "") -> bool:
        """Remove a schedule (the jobs it enqueued stay); False if there was none (of
        ``queue``, when given: an auth policy scopes the call by it)."""
        request = queue_pb2.DeleteScheduleRequest(name=name, queue=queue)
        response = self._call(self._stub.DeleteSchedule, request, retry=True)
        return bool(response.deleted)

    def list_schedules(self, queue: str = "") -> list[ScheduleInfo]:
        """The schedules (of ``queue``, or all), by name, with next run and last period."""
        request = queue_pb2.ListSchedulesRequest(queue=queue)
        response = self._call(self._stub.ListSchedules, request, retry=True)
        return [core.schedule_info(s) for s in response.schedules]

    # -- admin -----------------------------------------------------------------------------

    def list_jobs_page(
        self,
        queue: str,
        *,
        state: str = "",
        page_size: int = 0,
        page_token: str = "",
        include_payload: bool = False,
    ) -> tuple[list[JobInfo], str]:
        """One page of :meth:`list_jobs` and the ``page_token`` of the next ('' after the
        last), for a caller that pages on demand."""
        request = core.list_jobs_request(queue, state, page_size, page_token, include_payload)
        page = self._call(self._stub.ListJobs, request, retry=True)
        return [core.job_info(msg) for msg in page.jobs], page.next_page_token

    def list_jobs(
        self, queue: str, *, state: str = "", page_size: int = 0, include_payload: bool = False
    ) -> Iterator[JobInfo]:
        """Yield the jobs of ``queue`` (of ``state`` only, if given) in id order.

        Asks for one page at a time (``page_size`` jobs, at most 1,000; 0: the server's
        default, 100) as the iteration goes on. Each page is read on its own: a job that
        changes state meanwhile may or may not appear under a state filter, none twice.
        """
        page_token = ""
        while True:
            request = core.list_jobs_request(queue, state, page_size, page_token, include_payload)
            page = self._call(self._stub.ListJobs, request, retry=True)
            for msg in page.jobs:
                yield core.job_info(msg)
            page_token = page.next_page_token
            if not page_token:
                return

    def get_job(self, job_id: int, *, queue: str = "", include_payload: bool = False) -> JobInfo:
        """One job as stored, with its attempts (``JobInfo.history``: the newest 20,
        oldest first); ``NotFoundError`` if there is none (in ``queue``, if named)."""
        request = queue_pb2.GetJobRequest(id=job_id, queue=queue, include_payload=include_payload)
        return core.job_info(self._call(self._stub.GetJob, request, retry=True))

    def retry_job(self, job_id: int, *, queue: str = "") -> JobAction:
        """Make a dead, cancelled or failed job due now (``changed=False`` for any other).

        The attempts used are kept; a job that used them all is allowed one more
        (``max_attempts = attempts + 1``).
        """
        request = queue_pb2.RetryJobRequest(id=job_id, queue=queue)
        return core.job_action(self._call(self._stub.RetryJob, request, retry=True))

    def cancel_job(
        self,
        job_id: int,
        *,
        queue: str = "",
        reason: str = "",
        fence: Sequence[GuardClient] = (),
    ) -> JobAction:
        """Cancel a waiting, ready or running job (``changed=False`` for a finished one).

        A running job's claim is fenced by a new token: its worker's next heartbeat,
        complete or fail is ``LeaseLost``, and so are its writes at a strict guard; a
        watch guard fences it from the cancel's event. A monotonic guard only learns
        from a token it sees: name it in ``fence`` and it is fenced to the new token
        here, after the cancel (:attr:`JobAction.fence`; a guard already past it is
        left as it is).
        """
        request = queue_pb2.CancelJobRequest(id=job_id, queue=queue, reason=reason)
        action = core.job_action(self._call(self._stub.CancelJob, request, retry=True))
        claim = action.fence
        if claim is not None:
            for guard in fence:
                with contextlib.suppress(StaleTokenError):  # already fenced at or past it
                    guard.fence(claim)
        return action

    def requeue_dead(self, queue: str, *, limit: int = 0) -> int:
        """Retry up to ``limit`` dead jobs of ``queue`` (0: 1,000), as :meth:`retry_job`
        does; returns how many. Call again while it returns ``limit`` to requeue more."""
        request = queue_pb2.RequeueDeadRequest(queue=queue, limit=limit)
        return int(self._call(self._stub.RequeueDead, request, retry=True).requeued)

    def pause(self, queue: str) -> bool:
        """Pause ``queue``: it still accepts enqueues and lets running jobs heartbeat,
        complete and fail, but hands out no claims (waiting claims keep waiting) until
        :meth:`resume`. Kept in the queue backend, so every server sharing it honours it.
        Returns False if it already was paused. Needs ``manage`` on the queue."""
        request = queue_pb2.PauseQueueRequest(queue=queue)
        return bool(self._call(self._stub.PauseQueue, request, retry=True).changed)

    def resume(self, queue: str) -> bool:
        """Resume a paused ``queue``; returns False if it was not paused."""
        request = queue_pb2.ResumeQueueRequest(queue=queue)
        return bool(self._call(self._stub.ResumeQueue, request, retry=True).changed)


__all__ = ["FencingError", "Job", "JobAction", "JobAttempt", "JobInfo", "QueueClient"]
