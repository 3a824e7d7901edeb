"""``Worker(..., fence=[guard])`` and ``AsyncWorker``: the promise for jobs, against real
servers. Each job's resource is fenced at the named guards before its handler starts
(so an older claim's write is refused before this handler wrote anything), and a job
whose fence fails is released without running. The control: without ``fence=`` the
guard's fence is still 0 when the handler starts, and the older claim's write lands.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fencing import (
    AsyncGuardClient,
    Claim,
    GuardClient,
    Job,
    LeaseClient,
    QueueClient,
    StaleTokenError,
)
from fencing.testing import RunningServers, running_servers
from fencing.worker import AsyncWorker, Worker

HANG_GUARD = 20.0  # seconds: only a bug waits this long


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(
        f"sqlite:{tmp_path / 'leases.db'}", f"sqlite:{tmp_path / 'guard.db'}"
    ) as running:
        yield running


def until(ok: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def older_claim(job: Job) -> Claim:
    """A token older than the job's claim (tokens of one queue backend only grow)."""
    return Claim(job.resource, job.token - 1)


@pytest.mark.parametrize("fenced", [True, False], ids=["fence", "control"])
def test_worker_fences_each_job_before_its_handler(servers: RunningServers, fenced: bool) -> None:
    with (
        QueueClient(servers.queue_address) as queue,
        GuardClient(servers.guard_address) as guard,
        GuardClient(servers.guard_address) as probe,
    ):
        queue.enqueue("w", b"first")  # takes token 1: job 2's first claim gets token 2
        (first,) = queue.claim("w", ttl=30)
        queue.complete(first)
        queue.enqueue("w", b"second")
        seen: list[tuple[int, int, str]] = []

        def handler(job: Job) -> None:
            outcome = "landed"
            try:
                probe.put(older_claim(job), "late", b"older claim")
            except StaleTokenError:
                outcome = "rejected"
            seen.append((probe.describe_fence(job.resource), job.token, outcome))

        worker = Worker(
            queue,
            "w",
            handler,
            poll=0.1,
            handle_signals=False,
            fence=[guard] if fenced else [],
        )
        t = threading.Thread(target=worker.run, daemon=True)
        t.start()
        until(lambda: len(seen) == 1, "the handler")
        worker.stop()
        t.join(10)
    ((fence, token, outcome),) = seen
    if fenced:  # promised before the handler ran: the older token is refused
        assert (fence, outcome) == (token, "rejected")
    else:  # the control: nothing told the guard, so the older claim's write lands
        assert (fence, outcome) == (token - 1, "landed")
    assert worker.counts["completed"] == 1


def test_worker_releases_a_job_whose_fence_fails_without_running_it(
    servers: RunningServers,
) -> None:
    with QueueClient(servers.queue_address) as queue, GuardClient(servers.guard_address) as guard:
        job_id = queue.enqueue("w", b"x").id
        guard.fence(Claim(f"job/w/{job_id}", 1_000_000))  # a newer token already fenced it
        ran: list[Job] = []
        worker = Worker(queue, "w", ran.append, poll=0.1, handle_signals=False, fence=[guard])
        t = threading.Thread(target=worker.run, daemon=True)
        t.start()
        until(lambda: worker.counts.get("unfenced", 0) >= 1, "the failed fence")
        worker.stop()
        t.join(10)
        assert ran == []
        assert worker.counts.get("started", 0) == 0
        assert worker.counts["released"] >= 1
        (stats,) = queue.stats("w")
        assert stats.running == 0 and stats.succeeded == 0  # given back, never finished


@pytest.mark.parametrize("fenced", [True, False], ids=["fence", "control"])
async def test_async_worker_fences_each_job_before_its_handler(
    servers: RunningServers, fenced: bool
) -> None:
    await asyncio.to_thread(_two_jobs_one_done, servers)
    seen: list[tuple[int, int, str]] = []
    async with AsyncGuardClient(servers.guard_address) as guard:
        worker: AsyncWorker

        async def handler(job: Job) -> None:
            outcome = "landed"
            try:
                await guard.put(older_claim(job), "late", b"older claim")
            except StaleTokenError:
                outcome = "rejected"
            seen.append((await guard.describe_fence(job.resource), job.token, outcome))
            worker.stop()

        worker = AsyncWorker(
            servers.queue_address,
            "w",
            handler,
            poll=0.1,
            handle_signals=False,
            fence=[guard] if fenced else [],
        )
        await asyncio.wait_for(worker.run(), HANG_GUARD)
    ((fence, token, outcome),) = seen
    if fenced:
        assert (fence, outcome) == (token, "rejected")
    else:
        assert (fence, outcome) == (token - 1, "landed")


async def test_async_worker_releases_a_job_whose_fence_fails(servers: RunningServers) -> None:
    with QueueClient(servers.queue_address) as queue:
        job_id = queue.enqueue("w", b"x").id
    ran: list[Job] = []
    async with AsyncGuardClient(servers.guard_address) as guard:
        await guard.fence(Claim(f"job/w/{job_id}", 1_000_000))

        async def handler(job: Job) -> None:
            ran.append(job)

        worker = AsyncWorker(
            servers.queue_address, "w", handler, poll=0.1, handle_signals=False, fence=[guard]
        )
        task = asyncio.create_task(worker.run())
        deadline = time.monotonic() + HANG_GUARD
        while worker.counts.get("unfenced", 0) < 1:
            assert time.monotonic() < deadline, "timed out waiting for the failed fence"
            await asyncio.sleep(0.02)
        worker.stop()
        await asyncio.wait_for(task, HANG_GUARD)
    assert ran == [] and worker.counts.get("started", 0) == 0
    assert worker.counts["released"] >= 1


def _two_jobs_one_done(servers: RunningServers) -> None:
    with QueueClient(servers.queue_address) as queue:
        queue.enqueue("w", b"first")
        (first,) = queue.claim("w", ttl=30)
        queue.complete(first)
        queue.enqueue("w", b"second")


def test_describe_counts_job_claims_as_granted_tokens(servers: RunningServers) -> None:
    """Describe of a job's resource reports its claim's token in ``last_token`` (a guard
    that asks whether a token was ever granted must not take a job claim for a forgery);
    nothing is held as a lease."""
    with QueueClient(servers.queue_address) as queue, LeaseClient(servers.lease_address) as leases:
        queue.enqueue("w", b"x")
        (job,) = queue.claim("w", ttl=30)
        state = leases.describe(job.resource)
        assert (state.last_token, state.held) == (job.token, False)
        assert leases.describe("orders").last_token == 0
