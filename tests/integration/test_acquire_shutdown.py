"""A waiting Acquire or AcquireMany cut short by a shutdown: both answer the same way.

The waiter is answered at once with a retryable ``BackendUnavailableError``, and both
count it as an ``error`` outcome of ``fencing_lease_acquires_total`` (AcquireMany once
per resource it asked for, as for its other errors).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from fencing import _status
from fencing.errors import BackendUnavailableError
from fencing.v1 import lease_pb2, lease_pb2_grpc
from lease_server.backends.memory import MemoryBackend
from lease_server.server import start_lease_server
from tests.waiting import HANG_GUARD, eventually

Stub = lease_pb2_grpc.LeaseServiceStub


def _acquire(stub: Stub) -> Any:
    return stub.Acquire(
        lease_pb2.AcquireRequest(resource="held", holder="b", ttl_ms=5000, wait_ms=120_000)
    )


def _acquire_many(stub: Stub) -> Any:
    return stub.AcquireMany(
        lease_pb2.AcquireManyRequest(
            resources=["free", "held"], holder="b", ttl_ms=5000, wait_ms=120_000
        )
    )


@pytest.mark.parametrize(("call", "resources"), [(_acquire, 1), (_acquire_many, 2)])
async def test_a_waiter_cut_short_by_shutdown_is_unavailable_and_counted_as_an_error(
    call: Callable[[Stub], Awaitable[Any]], resources: int
) -> None:
    server = await start_lease_server(MemoryBackend(), "127.0.0.1:0")
    errors = server.service.metrics.acquires.labels("error")
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = Stub(channel)
            await stub.Acquire(lease_pb2.AcquireRequest(resource="held", holder="a", ttl_ms=60_000))
            before = errors._value.get()
            waiter = call(stub)
            await eventually(lambda: server.service.waiters.waiting("held") == 1, "b is queued")
            server.service.waiters.close()  # what the drain does first
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await waiter
            assert isinstance(_status.from_rpc_error(err.value), BackendUnavailableError)
            assert "shutting down" in (err.value.details() or "")
            assert errors._value.get() - before == resources
    finally:
        await server.stop(HANG_GUARD)
