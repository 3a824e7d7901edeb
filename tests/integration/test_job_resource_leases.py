"""A job naming its own resource holds the lease on it, on every lease backend.

The queue service takes the lease through the lease service it is hosted beside
(``lease_server/queue/resources.py``), so the rule holds whatever keeps the leases:
here every lease backend of tests/backends.py (memory, SQLite, PostgreSQL, Redis, a
Redis Cluster), each with an in-memory queue (a store of another kind: nothing is
shared but the lease service), over real gRPC. The e2e suite
(tests/e2e/test_job_resources.py) runs the same rule as server processes with their
default queues on SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest

from fencing import AsyncLeaseClient, AsyncQueueClient, LeaseHeldError
from fencing.v1 import queue_pb2
from lease_server.backends.base import LeaseBackend
from lease_server.queue.backends.memory import MemoryQueue
from lease_server.server import start_lease_server
from tests.backends import TimeControl


async def test_a_jobs_claim_and_the_leases_of_its_resource_share_one_counter(
    lease_backend: tuple[LeaseBackend, TimeControl],
) -> None:
    backend, _ = lease_backend
    server = await start_lease_server(backend, "127.0.0.1:0", queue=MemoryQueue())
    try:
        async with (
            AsyncLeaseClient(server.address, holder="alice") as alice,
            AsyncQueueClient(server.address, worker="w") as queue,
        ):
            lease = await alice.acquire("orders/1", ttl=30)
            # The queue's own counter starts at 1 too: the old path handed out 1 again.
            job_id = (await queue.enqueue("mq", b"x", resource="orders/1")).id
            assert await queue.claim("mq", ttl=30) == []
            await lease.release()
            (job,) = await queue.claim("mq", ttl=30, wait=5)
            assert job.id == job_id and job.token > lease.token
            state = await alice.describe("orders/1")
            assert (state.held, state.holder, state.token) == (True, "w", job.token)
            with pytest.raises(LeaseHeldError):
                await alice.acquire_nowait("orders/1", ttl=30)
            await queue.complete(job)
            after = await alice.acquire_nowait("orders/1", ttl=30)
            assert after.token > job.token
    finally:
        await server.stop(0)


async def test_a_retried_claim_of_a_job_naming_its_resource_gets_its_lease_back(
    lease_backend: tuple[LeaseBackend, TimeControl],
) -> None:
    """A Claim retried with its request id (its reply was lost) replays the job and the
    lease its claim took: the same token, the lease renewed with the job's, still
    excluding others; a fresh request id (the control) gets nothing: the job is held by
    the lost claim. Two jobs of one Claim naming one resource never share its lease."""
    backend, _ = lease_backend
    server = await start_lease_server(backend, "127.0.0.1:0", queue=MemoryQueue())
    try:
        async with (
            AsyncLeaseClient(server.address, holder="alice") as alice,
            AsyncQueueClient(server.address, worker="w") as queue,
        ):
            first = (await queue.enqueue("mq", b"1", resource="orders/1")).id
            second = (await queue.enqueue("mq", b"2", resource="orders/1")).id
            request = queue_pb2.ClaimRequest(
                queue="mq", worker="w", batch_size=5, ttl_ms=30_000, request_id="req-1"
            )
            lost = await queue._stub.Claim(request)
            assert [j.id for j in lost.jobs] == [first]  # the second job's lease is held
            again = await queue._stub.Claim(request)
            assert [(j.id, j.token, j.attempt) for j in again.jobs] == [
                (first, lost.jobs[0].token, 1)
            ]
            state = await alice.describe("orders/1")
            assert (state.holder, state.token) == ("w", lost.jobs[0].token)
            with pytest.raises(LeaseHeldError):
                await alice.acquire_nowait("orders/1", ttl=30)
            fresh = queue_pb2.ClaimRequest(
                queue="mq", worker="w", batch_size=5, ttl_ms=30_000, request_id="req-2"
            )
            assert list((await queue._stub.Claim(fresh)).jobs) == []
            info = await queue.get_job(second)
            assert (info.state, info.attempts) == ("scheduled", 0)  # given back, due later
    finally:
        await server.stop(0)
