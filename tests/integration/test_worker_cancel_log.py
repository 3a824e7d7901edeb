"""A job an operator cancels is reported as cancelled, not as taken over.

The server says why it refuses a cancelled job's heartbeat, complete or fail (the job
was cancelled); the SDK twins mark the job lost with that reason and both workers log
it. The control: a claim that was really taken over (a newer claim after expiry)
still says "taken over". Real lease server, real gRPC, embedded SQLite.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest

from fencing import AsyncQueueClient, LeaseLost, QueueClient
from fencing.client._queue import refs
from fencing.client.queue import Job
from fencing.testing import RunningServers
from fencing.v1 import queue_pb2
from fencing.worker import AsyncWorker, Worker
from tests.waiting import HANG_GUARD

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def queue(servers: RunningServers) -> Iterator[QueueClient]:
    with QueueClient(servers.queue_address, worker="operator") as client:
        yield client


def test_the_sdk_says_a_cancelled_claim_was_cancelled(queue: QueueClient) -> None:
    queue.enqueue("mail", b"a")
    (job,) = queue.claim("mail", ttl=30)
    queue.cancel_job(job.id, queue="mail")
    assert queue.heartbeat(job) == [job]
    assert "cancelled" in job.lost_reason and "taken over" not in job.lost_reason
    with pytest.raises(LeaseLost, match="cancelled"):
        queue.complete(job)


def test_the_async_sdk_says_a_cancelled_claim_was_cancelled(servers: RunningServers) -> None:
    async def main() -> str:
        async with AsyncQueueClient(servers.queue_address) as client:
            await client.enqueue("mail", b"a")
            (job,) = await client.claim("mail", ttl=30)
            await client.cancel_job(job.id, queue="mail")
            assert await client.heartbeat(job) == [job]
            return job.lost_reason

    reason = asyncio.run(main())
    assert "cancelled" in reason and "taken over" not in reason


def test_control_a_claim_taken_over_still_says_taken_over(queue: QueueClient) -> None:
    queue.enqueue("mail", b"a")
    (old,) = queue.claim("mail", ttl=30)
    # The claim ends behind the job's back (as an expiry would): a new one takes it.
    queue._stub.Release(queue_pb2.ReleaseJobsRequest(jobs=refs([old]), queue="mail"))
    (new,) = queue.claim("mail", ttl=30)
    assert new.id == old.id and new.token > old.token
    assert queue.heartbeat(old) == [old]
    assert "taken over" in old.lost_reason, old.lost_reason


def lost_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("job lost")]


def test_the_worker_logs_a_cancel_as_cancelled(
    servers: RunningServers, queue: QueueClient, caplog: pytest.LogCaptureFixture
) -> None:
    started = threading.Event()

    def handler(job: Job) -> None:
        started.set()
        job.lost.wait(HANG_GUARD)

    job_id = queue.enqueue("mail", b"a").id
    worker = Worker(servers.queue_address, "mail", handler, ttl=1.0, handle_signals=False)
    thread = threading.Thread(target=worker.run)
    with caplog.at_level(logging.INFO, logger="fencing.worker"):
        thread.start()
        try:
            assert started.wait(HANG_GUARD)
            queue.cancel_job(job_id, queue="mail")
            while not lost_lines(caplog):
                assert thread.is_alive()
                started.wait(0.05)
        finally:
            worker.stop(grace=1)
            thread.join(HANG_GUARD)
    lines = lost_lines(caplog)
    assert lines and all("cancelled" in ln and "taken over" not in ln for ln in lines), lines


def test_the_async_worker_logs_a_cancel_as_cancelled(
    servers: RunningServers, queue: QueueClient, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def handler(job: Job) -> None:
            started.set()
            await asyncio.sleep(HANG_GUARD)  # cancelled by the worker on the loss

        job_id = queue.enqueue("mail", b"a").id
        worker = AsyncWorker(servers.queue_address, "mail", handler, ttl=1.0, handle_signals=False)
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(started.wait(), HANG_GUARD)
            await asyncio.to_thread(queue.cancel_job, job_id, queue="mail")
            while not lost_lines(caplog):
                assert not task.done()
                await asyncio.sleep(0.05)
        finally:
            worker.stop(grace=1)
            await asyncio.wait_for(task, HANG_GUARD)

    with caplog.at_level(logging.INFO, logger="fencing.worker"):
        asyncio.run(main())
    lines = lost_lines(caplog)
    assert lines and all("cancelled" in ln and "taken over" not in ln for ln in lines), lines
