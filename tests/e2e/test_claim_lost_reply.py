"""A Claim whose reply is lost burns no attempt: a real lease server process, its replies
held by the fault proxy (:mod:`chaos.proxy`, ``half_open("upstream")``: the Claim
reaches the server, which claims the job, and the reply waits in the proxy until the
client's deadline has passed), then the link healed and the Claim retried.

With one request id for the tries, the retry gets the job the lost reply carried (same
token, attempt 1) and the job runs. The control is what clients sent before: no
request id, so the retry finds nothing to claim (the job is claimed by nobody until its
lease expires), and a job on its last attempt goes dead without ever running, which is
how ``python -m examples.worker_pool`` failed for a new user one run in two.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

import fencing.client._queue as queue_core
from chaos.proxy import ThreadedFaultProxy
from chaos.servers import ServerProc, lease_server
from fencing import AsyncQueueClient, Job, QueueClient
from fencing.v1 import queue_pb2, queue_pb2_grpc
from fencing.worker import Worker
from tests.waiting import wait_until

pytestmark = pytest.mark.e2e

TTL_S = 2.0  # the claims' lease: the control waits it out once per test
RPC_S = 0.3  # each try's deadline past its wait: far below the server's ttl


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProc]:
    if request.param == "sqlite":
        url = f"sqlite:{tmp_path / 'leases.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    proc = lease_server(url, tmp_path)
    proc.start()
    try:
        yield proc
    finally:
        proc.close()


@pytest.fixture
def proxy(server: ServerProc) -> Iterator[ThreadedFaultProxy]:
    host, port = server.target.rsplit(":", 1)
    with ThreadedFaultProxy(host, int(port)) as p:
        yield p


@pytest.fixture
def admin(server: ServerProc) -> Iterator[QueueClient]:
    """A client straight to the server (no proxy): enqueue and look at the job."""
    client = QueueClient(server.target)
    try:
        yield client
    finally:
        client.close()


class ClaimDeadlines(grpc.UnaryUnaryClientInterceptor):
    """Sets ``passed`` when a Claim on the channel ends DEADLINE_EXCEEDED: its reply was
    lost (whatever the client does next: a retry of its own, or the caller's)."""

    def __init__(self) -> None:
        self.passed = threading.Event()

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        outcome = continuation(details, request)
        if details.method.endswith("/Claim") and outcome.code() == _DEADLINE:
            self.passed.set()
        return outcome


class AioClaimDeadlines(grpc.aio.UnaryUnaryClientInterceptor):
    """:class:`ClaimDeadlines` for ``grpc.aio`` channels."""

    def __init__(self) -> None:
        self.passed = threading.Event()

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = await continuation(details, request)
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            method = (
                details.method.decode() if isinstance(details.method, bytes) else details.method
            )
            if method.endswith("/Claim") and exc.code() == _DEADLINE:
                self.passed.set()
        return call


_DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED


def no_request_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the SDK sends Claims without a request id (as it did before)."""
    monkeypatch.setattr(queue_core, "new_request_id", lambda: "")


def enqueue_last_chance(admin: QueueClient, queue: str) -> int:
    """A job with one attempt: a claim lost is the job lost, unless the retry replays it."""
    return admin.enqueue(queue, b"once", idempotency_key="k", max_attempts=1).id


def state(admin: QueueClient, job_id: int) -> str:
    return admin.get_job(job_id).state


def claim_request(request_id: str) -> queue_pb2.ClaimRequest:
    return queue_pb2.ClaimRequest(
        queue="q", worker="w", batch_size=5, ttl_ms=int(TTL_S * 1000), request_id=request_id
    )


def lose_a_claim_reply(
    stub: queue_pb2_grpc.QueueServiceStub,
    proxy: ThreadedFaultProxy,
    admin: QueueClient,
    job_id: int,
    request_id: str,
) -> None:
    """Send a Claim whose reply is held past its deadline, the job claimed meanwhile."""
    stub.Stats(queue_pb2.QueueStatsRequest(queue="q"), timeout=10)  # the link is up
    proxy.half_open("upstream")
    with pytest.raises(grpc.RpcError) as lost:
        stub.Claim(claim_request(request_id), timeout=RPC_S)
    assert lost.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(lambda: state(admin, job_id) == "running", "the server claimed the job")
    proxy.heal()


def test_the_wire_a_retry_with_the_same_request_id_gets_the_lost_claim(
    proxy: ThreadedFaultProxy, admin: QueueClient
) -> None:
    job_id = enqueue_last_chance(admin, "q")
    with grpc.insecure_channel(proxy.target) as channel:
        stub = queue_pb2_grpc.QueueServiceStub(channel)
        lose_a_claim_reply(stub, proxy, admin, job_id, "req-1")
        granted = admin.get_job(job_id)
        reply = stub.Claim(claim_request("req-1"), timeout=10)
        assert [(j.id, j.token, j.attempt) for j in reply.jobs] == [(job_id, granted.token, 1)]
        done = queue_pb2.JobRef(id=job_id, token=reply.jobs[0].token)
        stub.Complete(queue_pb2.CompleteRequest(jobs=[done], queue="q"), timeout=10)
    assert state(admin, job_id) == "succeeded"
    assert admin.get_job(job_id).attempts == 1


def test_the_wire_control_a_fresh_request_id_leaves_the_job_to_die(
    proxy: ThreadedFaultProxy, admin: QueueClient
) -> None:
    job_id = enqueue_last_chance(admin, "q")
    with grpc.insecure_channel(proxy.target) as channel:
        stub = queue_pb2_grpc.QueueServiceStub(channel)
        lose_a_claim_reply(stub, proxy, admin, job_id, "req-1")
        assert list(stub.Claim(claim_request("req-2"), timeout=10).jobs) == []
        assert list(stub.Claim(claim_request(""), timeout=10).jobs) == []
    # Claimed by nobody until its lease expires; then, on its last attempt, dead.
    wait_until(lambda: state(admin, job_id) == "dead", "the reaper ended the lost claim")
    info = admin.get_job(job_id)
    assert info.attempts == 1 and info.finished_at_ms > 0


def run_worker(proxy: ThreadedFaultProxy, admin: QueueClient, job_id: int) -> tuple[list[int], str]:
    """A Worker (the SDK's, sync) behind the proxy: its first Claim's reply is lost; the
    link heals once that Claim's deadline passed. Returns the attempts its handler saw
    and the job's end state."""
    runs: list[int] = []
    claims = ClaimDeadlines()
    channel = grpc.intercept_channel(grpc.insecure_channel(proxy.target), claims)
    client = QueueClient(proxy.target, worker="w", rpc_timeout=RPC_S, channel=channel)
    pool = Worker(
        client,
        "q",
        lambda job: runs.append(job.attempt),
        ttl=TTL_S,
        poll=0.1,
        grace=1.0,
        handle_signals=False,
    )
    client.stats("q")  # the link is up
    proxy.half_open("upstream")
    thread = threading.Thread(target=pool.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: state(admin, job_id) == "running", "the server claimed the job")
        assert claims.passed.wait(30), "the lost reply's Claim never ended"
        proxy.heal()
        wait_until(lambda: state(admin, job_id) in ("succeeded", "dead"), "the job ended")
        return runs, state(admin, job_id)
    finally:
        proxy.heal()
        pool.stop()
        thread.join(30)
        client.close()


def test_a_worker_runs_the_job_whose_claim_reply_was_lost(
    proxy: ThreadedFaultProxy, admin: QueueClient
) -> None:
    job_id = enqueue_last_chance(admin, "q")
    runs, end = run_worker(proxy, admin, job_id)
    assert (runs, end) == ([1], "succeeded")


def test_control_without_request_ids_the_worker_loses_the_job(
    proxy: ThreadedFaultProxy,
    admin: QueueClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_request_id(monkeypatch)
    job_id = enqueue_last_chance(admin, "q")
    runs, end = run_worker(proxy, admin, job_id)
    assert (runs, end) == ([], "dead")


async def async_claim(proxy: ThreadedFaultProxy, admin: QueueClient, job_id: int) -> list[Job]:
    claims = AioClaimDeadlines()
    channel = grpc.aio.insecure_channel(proxy.target, interceptors=[claims])
    client = AsyncQueueClient(proxy.target, worker="w", rpc_timeout=RPC_S, channel=channel)
    await client.stats("q")  # the link is up
    proxy.half_open("upstream")
    try:
        task = asyncio.create_task(client.claim("q", batch=5, ttl=TTL_S, wait=0.1))
        await asyncio.to_thread(
            wait_until, lambda: state(admin, job_id) == "running", "the server claimed the job"
        )
        assert await asyncio.to_thread(claims.passed.wait, 30), "the Claim never ended"
        proxy.heal()
        return await task
    finally:
        proxy.heal()
        await client.aclose()


async def test_the_asyncio_client_retries_a_claim_with_the_same_request_id(
    proxy: ThreadedFaultProxy, admin: QueueClient
) -> None:
    job_id = enqueue_last_chance(admin, "q")
    jobs = await async_claim(proxy, admin, job_id)
    granted = admin.get_job(job_id)
    assert [(j.id, j.token, j.attempt) for j in jobs] == [(job_id, granted.token, 1)]


async def test_control_the_asyncio_client_without_request_ids_gets_nothing(
    proxy: ThreadedFaultProxy,
    admin: QueueClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_request_id(monkeypatch)
    job_id = enqueue_last_chance(admin, "q")
    assert await async_claim(proxy, admin, job_id) == []
    info = admin.get_job(job_id)
    assert info.state == "running" and info.attempts == 1  # claimed, by nobody
