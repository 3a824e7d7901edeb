"""A job claim returned after a long wait is alive for its ttl from the claim, not from
the send of the Claim that waited: QueueClient, AsyncQueueClient, Worker, AsyncWorker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import AsyncQueueClient, Job, QueueClient
from fencing._backoff import Backoff
from fencing.testing import RunningServers, running_servers
from fencing.worker import AsyncWorker, Worker
from lease_server.queue.service import QueueOptions

# slow: claims that wait past their ttl (the default loop leaves it out).
pytestmark = pytest.mark.slow

FAST = QueueOptions(
    retry=Backoff(base=50, cap=100, jitter=0.0), reap_interval_s=0.05, poll_interval_s=0.05
)
TTL = 1.0  # each claim's lease
LATE = 1.6  # the job is enqueued this long after the claim began to wait: longer than TTL


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(
        f"sqlite:{tmp_path / 'leases.db'}", "memory://", queue_options=FAST
    ) as running:
        yield running


def enqueue_later(servers: RunningServers, queue: str, delay: float = LATE) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        with QueueClient(servers.queue_address) as producer:
            producer.enqueue(queue, b"late")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_claim_after_a_long_wait_lives_from_the_claim(servers: RunningServers) -> None:
    with QueueClient(servers.queue_address) as queue:
        producer = enqueue_later(servers, "q")
        start = time.monotonic()
        jobs = queue.claim("q", ttl=TTL, wait=10)
        assert time.monotonic() - start > TTL  # it waited longer than the claim's ttl
        producer.join(10)
        [job] = jobs
        job.check()  # alive on arrival
        assert job.remaining() > TTL / 2
        assert queue.heartbeat(job) == []
        queue.complete(job)


async def test_async_claim_after_a_long_wait_lives_from_the_claim(
    servers: RunningServers,
) -> None:
    async with AsyncQueueClient(servers.queue_address) as queue:
        producer = enqueue_later(servers, "aq")
        jobs = await queue.claim("aq", ttl=TTL, wait=10)
        await asyncio.to_thread(producer.join, 10)
        [job] = jobs
        job.check()
        assert job.remaining() > TTL / 2
        assert await queue.heartbeat(job) == []
        await queue.complete(job)


def test_a_worker_whose_claim_waited_longer_than_the_ttl_runs_the_job(
    servers: RunningServers,
) -> None:
    checked: list[float] = []
    attempts: list[int] = []
    done = threading.Event()

    def handler(job: Job) -> None:
        attempts.append(job.attempt)
        job.check()  # LeaseLost here if the claim were lost on arrival
        checked.append(job.remaining())
        time.sleep(TTL * 1.5)  # longer than the ttl: heartbeats keep it
        job.check()
        done.set()

    worker = Worker(
        servers.queue_address, "w", handler, ttl=TTL, poll=LATE * 3, handle_signals=False
    )
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    enqueue_later(servers, "w")
    assert done.wait(20)
    worker.stop()
    t.join(10)
    assert attempts == [1]  # the first claim ran it: not failed, retried, or rescued
    assert checked and checked[0] > TTL / 2
    assert worker.counts.get("completed") == 1
    assert worker.counts.get("lost", 0) == 0 and worker.counts.get("failed", 0) == 0


async def test_an_async_worker_whose_claim_waited_longer_than_the_ttl_runs_the_job(
    servers: RunningServers,
) -> None:
    checked: list[float] = []
    attempts: list[int] = []
    done = asyncio.Event()

    async def handler(job: Job) -> None:
        attempts.append(job.attempt)
        job.check()
        checked.append(job.remaining())
        await asyncio.sleep(TTL * 1.5)  # cancelled if the claim were lost
        job.check()
        done.set()

    worker = AsyncWorker(servers.queue_address, "aw", handler, ttl=TTL, poll=LATE * 3)
    task = asyncio.create_task(worker.run())
    enqueue_later(servers, "aw")
    await asyncio.wait_for(done.wait(), 20)
    worker.stop()
    await asyncio.wait_for(task, 10)
    assert attempts == [1]  # the first claim ran it: not failed, retried, or rescued
    assert checked and checked[0] > TTL / 2
    assert worker.counts.get("completed") == 1
    assert worker.counts.get("lost", 0) == 0 and worker.counts.get("failed", 0) == 0
