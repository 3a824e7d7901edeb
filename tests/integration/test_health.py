"""grpc.health.v1: NOT_SERVING while the backend is unreachable and from the start of a drain."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fencing import _status
from fencing.errors import BackendUnavailableError
from fencing.v1 import lease_pb2, lease_pb2_grpc
from guard.server import start_guard
from guard.stores.memory import MemoryStore
from lease_server.backends.memory import MemoryBackend
from lease_server.server import start_lease_server
from serving.server import ServerOptions
from tests.waiting import HANG_GUARD, eventually

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _Probed(MemoryBackend):
    """A memory backend whose health probe says what the test wants, and whose
    acquire of resource ``slow`` can be held at a gate (a slow database)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = True
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def healthy(self) -> bool:
        return self.up

    async def acquire(self, resource: str, holder: str, ttl_ms: int, request_id: str) -> Any:
        if resource == "slow":
            self.entered.set()
            await self.gate.wait()
        return await super().acquire(resource, holder, ttl_ms, request_id)


class _ProbedStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.up = True

    async def healthy(self) -> bool:
        return self.up


async def status(channel: grpc.aio.Channel, service: str = "") -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=HANG_GUARD
    )
    return int(reply.status)


async def until_status(channel: grpc.aio.Channel, service: str, wanted: int) -> None:
    async def reached() -> bool:
        return await status(channel, service) == wanted

    await eventually(reached, f"health of {service!r} is {wanted}")


@pytest.mark.parametrize("service", ["", "fencing.v1.LeaseService"])
async def test_lease_server_is_not_serving_while_its_backend_is_unreachable(service: str) -> None:
    backend = _Probed()
    server = await start_lease_server(
        backend, "127.0.0.1:0", options=ServerOptions(health_interval=0.02)
    )
    up = server.metrics.registry.get_sample_value
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            assert await status(channel, service) == SERVING
            backend.up = False
            await until_status(channel, service, NOT_SERVING)
            assert up("fencing_backend_up", {"server": "lease"}) == 0
            backend.up = True
            await until_status(channel, service, SERVING)
            assert up("fencing_backend_up", {"server": "lease"}) == 1
    finally:
        await server.stop(0)


async def test_guard_is_not_serving_while_its_store_is_unreachable() -> None:
    store = _ProbedStore()
    guard = await start_guard(store, "127.0.0.1:0", options=ServerOptions(health_interval=0.02))
    try:
        async with grpc.aio.insecure_channel(guard.address) as channel:
            service = "fencing.v1.GuardService"
            assert await status(channel, service) == SERVING
            store.up = False
            await until_status(channel, service, NOT_SERVING)
            store.up = True
            await until_status(channel, service, SERVING)
    finally:
        await guard.stop(0)


async def test_drain_reports_not_serving_finishes_in_flight_calls_and_refuses_new_ones() -> None:
    backend = _Probed()
    server = await start_lease_server(backend, "127.0.0.1:0")
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = lease_pb2_grpc.LeaseServiceStub(channel)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        assert (await watch.read()).status == SERVING
        # One call in flight inside a slow backend, one waiting in line for a held lease.
        await stub.Acquire(lease_pb2.AcquireRequest(resource="held", holder="a", ttl_ms=60_000))
        waiter = stub.Acquire(
            lease_pb2.AcquireRequest(resource="held", holder="b", ttl_ms=5000, wait_ms=120_000)
        )
        backend.gate.clear()
        in_flight = stub.Acquire(lease_pb2.AcquireRequest(resource="slow", holder="c", ttl_ms=5000))
        await eventually(backend.entered.is_set, "the slow call is in the backend")
        await eventually(lambda: server.service.waiters.waiting("held") == 1, "b is queued")

        stopping = asyncio.ensure_future(server.stop(grace=HANG_GUARD))
        async with asyncio.timeout(HANG_GUARD):
            assert (await watch.read()).status == NOT_SERVING
        watch.cancel()
        # The waiter is answered at once, cleanly and retryably.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(waiter, HANG_GUARD)
        assert isinstance(_status.from_rpc_error(err.value), BackendUnavailableError)
        assert "shutting down" in (err.value.details() or "")
        # New calls are refused while the slow one drains...
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Describe(lease_pb2.DescribeRequest(resource="r"), timeout=HANG_GUARD)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # ...which then completes normally.
        backend.gate.set()
        lease = await asyncio.wait_for(in_flight, HANG_GUARD)
        assert (lease.resource, lease.token) == ("slow", 1)
        await asyncio.wait_for(stopping, HANG_GUARD)
