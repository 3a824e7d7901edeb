"""Worker and AsyncWorker against real servers (in a thread): outcomes, retries, a lost
claim (lost event / task cancelled), graceful stop, backoff while the server is down."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fencing import Job, QueueClient
from fencing._backoff import Backoff
from fencing.client._queue import QueueStats
from fencing.testing import RunningServers, running_servers
from fencing.v1 import queue_pb2
from fencing.worker import AsyncWorker, Discard, Retry, Worker
from lease_server.queue.service import QueueOptions
from serving.ports import free_port

FAST = QueueOptions(
    retry=Backoff(base=50, cap=100, jitter=0.0), reap_interval_s=0.05, poll_interval_s=0.05
)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(
        f"sqlite:{tmp_path / 'leases.db'}", "memory://", queue_options=FAST
    ) as running:
        yield running


@pytest.fixture
def queue(servers: RunningServers) -> Iterator[QueueClient]:
    with QueueClient(servers.queue_address, worker="test") as client:
        yield client


def wait_for(
    queue: QueueClient, name: str, ok: Callable[[QueueStats], bool], timeout: float = 20.0
) -> QueueStats:
    deadline = time.monotonic() + timeout
    while True:
        stats = {s.queue: s for s in queue.stats(name)}.get(name)
        if stats is not None and ok(stats):
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting; last stats {stats}")
        time.sleep(0.05)


def in_thread(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    return t


def test_worker_completes_jobs(servers: RunningServers, queue: QueueClient) -> None:
    for i in range(20):
        queue.enqueue("w", str(i).encode())
    seen: list[bytes] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        with lock:
            seen.append(job.payload)

    worker = Worker(
        servers.queue_address, "w", handler, concurrency=4, poll=0.2, handle_signals=False
    )
    t = in_thread(worker)
    wait_for(queue, "w", lambda s: s.succeeded == 20)
    worker.stop()
    t.join(10)
    assert not t.is_alive()
    assert sorted(seen) == sorted(str(i).encode() for i in range(20))
    assert worker.counts["completed"] == 20 and worker.counts["started"] == 20
    # Each complete rode on the claim of the next job: one call per job, not two.
    assert servers.lease.queue_service is not None
    assert servers.lease.queue_service.completed_in_claims == 20


def test_worker_fails_retries_and_gives_up(servers: RunningServers, queue: QueueClient) -> None:
    queue.enqueue("w", b"flaky", max_attempts=3)
    queue.enqueue("w", b"retry-me", max_attempts=2)
    queue.enqueue("w", b"poison", max_attempts=5)
    attempts: dict[bytes, list[int]] = {}

    def handler(job: Job) -> None:
        attempts.setdefault(job.payload, []).append(job.attempt)
        if job.payload == b"flaky":
            raise ValueError(f"no luck on attempt {job.attempt}")
        if job.payload == b"retry-me" and job.attempt == 1:
            raise Retry("not yet", after=0.05)
        if job.payload == b"poison":
            raise Discard("cannot parse")

    worker = Worker(queue, "w", handler, concurrency=2, poll=0.1, handle_signals=False)
    t = in_thread(worker)
    wait_for(queue, "w", lambda s: s.dead == 2 and s.succeeded == 1)
    worker.stop()
    t.join(10)
    assert attempts == {b"flaky": [1, 2, 3], b"retry-me": [1, 2], b"poison": [1]}
    assert worker.counts["dead"] == 2 and worker.counts["failed"] == 3
    assert worker.counts["completed"] == 1


def steal(servers: RunningServers, job: Job) -> Job:
    """Take ``job`` away from its worker as a rescue would: give it back, claim it anew."""
    with QueueClient(servers.queue_address, worker="thief") as thief:
        handle = Job(job_message(job), time.monotonic())
        thief.release(handle)
        (taken,) = thief.claim(job.queue, ttl=30)
    assert taken.id == job.id and taken.token > job.token
    return taken


def job_message(job: Job) -> queue_pb2.Job:
    return queue_pb2.Job(
        id=job.id, queue=job.queue, token=job.token, resource=job.resource, ttl_ms=job.ttl_ms
    )


def test_worker_marks_a_taken_over_job_lost(servers: RunningServers, queue: QueueClient) -> None:
    queue.enqueue("w", b"slow")
    running: list[Job] = []
    saw_lost = threading.Event()

    def handler(job: Job) -> None:
        running.append(job)
        if job.lost.wait(20):  # a cooperative handler: stops once it learns
            saw_lost.set()

    worker = Worker(queue, "w", handler, ttl=0.6, poll=0.1, handle_signals=False)
    t = in_thread(worker)
    deadline = time.monotonic() + 10
    while not running and time.monotonic() < deadline:
        time.sleep(0.01)
    taken = steal(servers, running[0])
    assert saw_lost.wait(10)
    assert "heartbeat refused" in running[0].lost_reason
    queue.complete(taken)
    worker.stop()
    t.join(10)
    assert worker.counts["lost"] >= 1 and worker.counts.get("completed", 0) == 0


def test_a_late_complete_is_refused_alone_and_the_worker_claims_on(
    servers: RunningServers, queue: QueueClient
) -> None:
    queue.enqueue("w", b"paused", priority=1)
    running: list[Job] = []
    stolen = threading.Event()

    def handler(job: Job) -> None:
        running.append(job)
        if job.payload == b"paused":
            stolen.wait(20)  # a handler that never looks at job.lost, and finishes late

    worker = Worker(queue, "w", handler, ttl=0.6, poll=0.1, handle_signals=False)
    t = in_thread(worker)
    deadline = time.monotonic() + 10
    while not running and time.monotonic() < deadline:
        time.sleep(0.01)
    taken = steal(servers, running[0])
    queue.enqueue("w", b"next")
    stolen.set()
    wait_for(queue, "w", lambda s: s.succeeded == 1)
    worker.stop()
    t.join(10)
    # The late complete was refused (the thief's claim is untouched), the claim riding
    # with it went on: the next job ran and completed.
    assert [j.payload for j in running] == [b"paused", b"next"]
    assert worker.counts["refused"] == 1 and worker.counts["completed"] == 1
    (stats,) = queue.stats("w")
    assert (stats.running, stats.succeeded) == (1, 1)
    queue.complete(taken)


def test_graceful_stop_releases_what_is_still_running(
    servers: RunningServers, queue: QueueClient
) -> None:
    for i in range(4):
        queue.enqueue("w", str(i).encode())
    started: list[int] = []

    def handler(job: Job) -> None:
        started.append(job.id)
        job.lost.wait(30)  # runs until the worker gives it back

    worker = Worker(queue, "w", handler, concurrency=2, poll=0.1, grace=0.3, handle_signals=False)
    t = in_thread(worker)
    deadline = time.monotonic() + 10
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop_at = time.monotonic()
    worker.stop()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - stop_at < 5
    assert len(started) == 2  # nothing new started after the stop
    assert worker.counts["released"] == 2
    (stats,) = queue.stats("w")
    assert (stats.ready, stats.running, stats.retrying) == (4, 0, 0)
    again = queue.claim("w", batch=4)
    assert {j.attempt for j in again} == {1}  # the released attempts did not count


def test_worker_backs_off_while_the_server_is_unreachable() -> None:
    port = free_port()  # nothing listens there
    client = QueueClient(f"127.0.0.1:{port}", rpc_timeout=0.2)
    worker = Worker(client, "w", lambda job: None, poll=0.1, handle_signals=False)
    t = in_thread(worker)
    time.sleep(1.5)
    worker.stop()
    t.join(10)
    client.close()
    # 0.1 + 0.2 + 0.4 + 0.8 s ... (jittered down by at most 30 %): a handful, not a storm.
    assert 2 <= worker.counts["unavailable"] <= 8


# -- asyncio ---------------------------------------------------------------------------------


async def test_async_worker_completes_and_cancels_a_lost_handler(
    servers: RunningServers, queue: QueueClient
) -> None:
    queue.enqueue("a", b"quick", priority=1)
    queue.enqueue("a", b"slow")
    events: list[str] = []
    slow: list[Job] = []

    async def handler(job: Job) -> None:
        if job.payload == b"quick":
            events.append("quick done")
            return
        slow.append(job)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            events.append(f"slow cancelled: {job.lost_reason}")
            raise

    # One slot: while "slow" runs the worker does not claim, so the thief gets it.
    worker = AsyncWorker(servers.queue_address, "a", handler, concurrency=1, ttl=0.6, poll=0.1)
    task = asyncio.create_task(worker.run())
    for _ in range(500):
        if slow:
            break
        await asyncio.sleep(0.01)
    taken = await asyncio.to_thread(steal, servers, slow[0])
    for _ in range(500):
        if len(events) == 2:
            break
        await asyncio.sleep(0.01)
    assert events[0] == "quick done"
    assert events[1].startswith("slow cancelled") and "taken over" in events[1]
    worker.stop()
    await asyncio.wait_for(task, 10)
    queue.complete(taken)
    assert worker.counts["completed"] == 1 and worker.counts["lost"] == 1


async def test_async_worker_completes_with_its_next_claim(
    servers: RunningServers, queue: QueueClient
) -> None:
    for i in range(20):
        queue.enqueue("a", str(i).encode())
    seen: list[bytes] = []

    async def handler(job: Job) -> None:
        seen.append(job.payload)

    worker = AsyncWorker(servers.queue_address, "a", handler, concurrency=4, poll=0.2)
    task = asyncio.create_task(worker.run())
    await asyncio.to_thread(wait_for, queue, "a", lambda s: s.succeeded == 20)
    worker.stop()
    await asyncio.wait_for(task, 10)
    assert sorted(seen) == sorted(str(i).encode() for i in range(20))
    assert worker.counts["completed"] == 20
    assert servers.lease.queue_service is not None
    assert servers.lease.queue_service.completed_in_claims == 20


async def test_async_worker_graceful_stop(servers: RunningServers, queue: QueueClient) -> None:
    for i in range(3):
        queue.enqueue("a", str(i).encode())
    started: list[int] = []
    finished: list[int] = []

    async def handler(job: Job) -> None:
        started.append(job.id)
        await asyncio.sleep(0.1 if job.payload == b"0" else 30)
        finished.append(job.id)

    worker = AsyncWorker(queue.target, "a", handler, concurrency=2, poll=0.1, grace=0.5)
    task = asyncio.create_task(worker.run())
    for _ in range(500):
        if len(started) == 2:
            break
        await asyncio.sleep(0.01)
    worker.stop()
    await asyncio.wait_for(task, 10)
    assert len(started) == 2 and len(finished) == 1  # the quick one finished in the grace
    assert worker.counts["completed"] == 1 and worker.counts["released"] == 1
    (stats,) = queue.stats("a")
    assert (stats.ready, stats.running, stats.succeeded) == (2, 0, 1)
