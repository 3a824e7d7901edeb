"""``AsyncQueueClient``: the asyncio twin of :class:`fencing.client.queue.QueueClient`.

Same methods, same semantics, same I/O-free core (:mod:`fencing.client._queue`);
``aclose`` instead of ``close``. It talks to the generated ``grpc.aio`` stub directly.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import TypeVar, cast

import grpc
import grpc.aio

from fencing._renewal import RenewalPolicy
from fencing.client import _core
from fencing.client import _queue as core
from fencing.client._calls import AsyncCalls
from fencing.client._queue import (
    EnqueuedJob,
    FailOutcome,
    Job,
    JobAction,
    JobInfo,
    QueueStats,
    ScheduleInfo,
)
from fencing.client.async_guard import AsyncGuardClient
from fencing.errors import LeaseLost, StaleTokenError
from fencing.tls import TLSConfig
from fencing.v1 import queue_pb2, queue_pb2_grpc

T = TypeVar("T")
log = logging.getLogger(__name__)
Clock = Callable[[], float]


class AsyncQueueClient(AsyncCalls):
    """An asyncio client of ``fencing.v1.QueueService`` (see :class:`QueueClient`)."""

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
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        self.target = target
        self.worker = worker or _core.default_holder()
        self.rpc_timeout = rpc_timeout
        self.policy = policy or RenewalPolicy()
        self._clock = clock
        self._channel = (
            channel
            if channel is not None
            else _core.open_aio_channel(target, tls=tls, token=token, credentials=credentials)
        )
        self._stub = queue_pb2_grpc.QueueServiceStub(self._channel)
        self._steps = core.QueueSteps(self)

    async def aclose(self) -> None:
        await self._channel.close()

    async def enqueue(
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
        return (await self.enqueue_many(queue, [job]))[0]

    async def enqueue_many(self, queue: str, jobs: Sequence[queue_pb2.NewJob]) -> list[EnqueuedJob]:
        request = queue_pb2.EnqueueRequest(queue=queue, jobs=jobs)
        retry = all(j.idempotency_key for j in jobs)
        response = await self._call(self._stub.Enqueue, request, retry=retry)
        return core.enqueued(response)

    async def claim(
        self, queue: str, *, batch: int = 1, ttl: float = 30.0, wait: float = 0.0
    ) -> list[Job]:
        jobs, _ = await self.complete_and_claim((), queue, batch=batch, ttl=ttl, wait=wait)
        return jobs

    async def complete_and_claim(
        self,
        done: Sequence[Job],
        queue: str,
        *,
        batch: int = 1,
        ttl: float = 30.0,
        wait: float = 0.0,
    ) -> tuple[list[Job], list[LeaseLost | None]]:
        """See :meth:`QueueClient.complete_and_claim`."""
        return await self._run(self._steps.complete_and_claim(done, queue, batch, ttl, wait))

    async def heartbeat(self, jobs: Job | Sequence[Job], ttl: float | None = None) -> list[Job]:
        live, lost = core.split_expired(core.job_list(jobs))
        return await self._run(self._steps.heartbeat(live, ttl, lost))

    async def complete(self, jobs: Job | Sequence[Job]) -> None:
        items = core.job_list(jobs)
        request = core.complete_request(items)
        await self._settle(items, self._stub.Complete, request)

    async def fail(
        self,
        job: Job,
        error: str | BaseException,
        *,
        retry_in: float | None = None,
        final: bool = False,
    ) -> FailOutcome:
        request = queue_pb2.FailRequest(
            job=queue_pb2.JobRef(id=job.id, token=job.token),
            error=core.error_text(error),
            retry_in_ms=0 if retry_in is None else max(1, round(retry_in * 1000)),
            final=final,
            queue=job.queue,
        )
        response = await self._settle([job], self._stub.Fail, request)
        return FailOutcome(response.state, response.retry_in_ms / 1000)

    async def release(self, jobs: Job | Sequence[Job]) -> None:
        items = core.job_list(jobs)
        request = queue_pb2.ReleaseJobsRequest(jobs=core.refs(items), queue=core.queue_of(items))
        await self._settle(items, self._stub.Release, request)
        for job in items:
            job.mark_lost("released")

    async def _settle(
        self, items: list[Job], method: Callable[..., Awaitable[T]], request: object
    ) -> T:
        return cast(T, await self._run(self._steps.settle(items, method, request)))

    async def stats(self, queue: str = "", *, window: float = 0.0) -> list[QueueStats]:
        request = queue_pb2.QueueStatsRequest(queue=queue, window_ms=round(window * 1000))
        response = await self._call(self._stub.Stats, request, retry=True)
        return [core.stats(s) for s in response.queues]

    # -- periodic jobs -----------------------------------------------------------------------

    async def put_schedule(
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
        """See :meth:`QueueClient.put_schedule`."""
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
        response = await self._call(self._stub.PutSchedule, request, retry=True)
        return core.schedule_info(response)

    async def delete_schedule(self, name: str, *, queue: str = "") -> bool:
        """Remove a schedule (the jobs it enqueued stay); False if there was none (of
        ``queue``, when given: an auth policy scopes the call by it)."""
        request = queue_pb2.DeleteScheduleRequest(name=name, queue=queue)
        response = await self._call(self._stub.DeleteSchedule, request, retry=True)
        return bool(response.deleted)

    async def list_schedules(self, queue: str = "") -> list[ScheduleInfo]:
        """The schedules (of ``queue``, or all), by name, with next run and last period."""
        request = queue_pb2.ListSchedulesRequest(queue=queue)
        response = await self._call(self._stub.ListSchedules, request, retry=True)
        return [core.schedule_info(s) for s in response.schedules]

    # -- admin -----------------------------------------------------------------------------

    async def list_jobs_page(
        self,
        queue: str,
        *,
        state: str = "",
        page_size: int = 0,
        page_token: str = "",
        include_payload: bool = False,
    ) -> tuple[list[JobInfo], str]:
        """See :meth:`QueueClient.list_jobs_page`."""
        request = core.list_jobs_request(queue, state, page_size, page_token, include_payload)
        page = await self._call(self._stub.ListJobs, request, retry=True)
        return [core.job_info(msg) for msg in page.jobs], page.next_page_token

    async def list_jobs(
        self, queue: str, *, state: str = "", page_size: int = 0, include_payload: bool = False
    ) -> AsyncIterator[JobInfo]:
        """See :meth:`QueueClient.list_jobs`."""
        page_token = ""
        while True:
            request = core.list_jobs_request(queue, state, page_size, page_token, include_payload)
            page = await self._call(self._stub.ListJobs, request, retry=True)
            for msg in page.jobs:
                yield core.job_info(msg)
            page_token = page.next_page_token
            if not page_token:
                return

    async def get_job(
        self, job_id: int, *, queue: str = "", include_payload: bool = False
    ) -> JobInfo:
        """See :meth:`QueueClient.get_job`."""
        request = queue_pb2.GetJobRequest(id=job_id, queue=queue, include_payload=include_payload)
        return core.job_info(await self._call(self._stub.GetJob, request, retry=True))

    async def retry_job(self, job_id: int, *, queue: str = "") -> JobAction:
        """See :meth:`QueueClient.retry_job`."""
        request = queue_pb2.RetryJobRequest(id=job_id, queue=queue)
        return core.job_action(await self._call(self._stub.RetryJob, request, retry=True))

    async def cancel_job(
        self,
        job_id: int,
        *,
        queue: str = "",
        reason: str = "",
        fence: Sequence[AsyncGuardClient] = (),
    ) -> JobAction:
        """See :meth:`QueueClient.cancel_job`."""
        request = queue_pb2.CancelJobRequest(id=job_id, queue=queue, reason=reason)
        action = core.job_action(await self._call(self._stub.CancelJob, request, retry=True))
        claim = action.fence
        if claim is not None:
            for guard in fence:
                with contextlib.suppress(StaleTokenError):  # already fenced at or past it
                    await guard.fence(claim)
        return action

    async def requeue_dead(self, queue: str, *, limit: int = 0) -> int:
        """See :meth:`QueueClient.requeue_dead`."""
        request = queue_pb2.RequeueDeadRequest(queue=queue, limit=limit)
        response = await self._call(self._stub.RequeueDead, request, retry=True)
        return int(response.requeued)

    async def pause(self, queue: str) -> bool:
        """See :meth:`QueueClient.pause`."""
        request = queue_pb2.PauseQueueRequest(queue=queue)
        return bool((await self._call(self._stub.PauseQueue, request, retry=True)).changed)

    async def resume(self, queue: str) -> bool:
        """See :meth:`QueueClient.resume`."""
        request = queue_pb2.ResumeQueueRequest(queue=queue)
        return bool((await self._call(self._stub.ResumeQueue, request, retry=True)).changed)


__all__ = ["AsyncQueueClient"]
