"""Token propagation into a user's own gRPC service, fenced by FenceInterceptor.

The "user service" is a tiny ledger registered with generic handlers (no proto
needed): ``Append`` (unary) and ``Tail`` (server stream) over protobuf wrappers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf.wrappers_pb2 import Int64Value, StringValue
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fencing import (
    AsyncLeaseClient,
    Claim,
    InvalidArgumentError,
    LeaseClient,
    StaleTokenError,
    _status,
    propagation,
)
from fencing.client.interceptors import TokenInterceptor, async_token_interceptors
from guard.interceptor import FenceInterceptor
from guard.stores.memory import MemoryStore
from lease_server.server import LeaseServer, start_lease_server

APPEND = "/test.Ledger/Append"
TAIL = "/test.Ledger/Tail"


@dataclass
class Ledger:
    """The user's service: records every entry with the claim it was made under."""

    entries: list[tuple[str, int, str]] = field(default_factory=list)
    unfenced: list[str] = field(default_factory=list)

    async def append(self, request: StringValue, context: Any) -> Int64Value:
        claim = propagation.current()
        if claim is None:
            self.unfenced.append(request.value)
        else:
            self.entries.append((claim.resource, claim.token, request.value))
        return Int64Value(value=len(self.entries))

    async def tail(self, request: StringValue, context: Any) -> AsyncIterator[StringValue]:
        for _, _, value in self.entries:
            yield StringValue(value=value)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            "test.Ledger",
            {
                "Append": grpc.unary_unary_rpc_method_handler(
                    self.append,
                    request_deserializer=StringValue.FromString,
                    response_serializer=Int64Value.SerializeToString,
                ),
                "Tail": grpc.unary_stream_rpc_method_handler(
                    self.tail,
                    request_deserializer=StringValue.FromString,
                    response_serializer=StringValue.SerializeToString,
                ),
            },
        )


@dataclass
class Running:
    ledger: Ledger
    interceptor: FenceInterceptor
    address: str
    leases: LeaseServer


async def _serve(require: bool = True) -> tuple[grpc.aio.Server, Running, LeaseServer]:
    leases = await start_lease_server("memory://", "127.0.0.1:0")
    ledger = Ledger()
    interceptor = FenceInterceptor(MemoryStore(), require=require)
    server = grpc.aio.server(interceptors=[interceptor])
    server.add_generic_rpc_handlers((ledger.handler(),))
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, Running(ledger, interceptor, f"127.0.0.1:{port}", leases), leases


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    server, state, leases = await _serve()
    yield state
    await server.stop(0)
    await leases.stop(0)


@pytest.fixture
async def channel(running: Running) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(
        running.address, interceptors=async_token_interceptors()
    ) as ch:
        yield ch


async def append(channel: grpc.aio.Channel, value: str, **kwargs: Any) -> int:
    call = channel.unary_unary(
        APPEND,
        request_serializer=StringValue.SerializeToString,
        response_deserializer=Int64Value.FromString,
    )
    try:
        reply: Int64Value = await call(StringValue(value=value), timeout=10, **kwargs)
    except grpc.RpcError as err:
        raise _status.from_rpc_error(err) from err
    return reply.value


async def tail(channel: grpc.aio.Channel) -> list[str]:
    call = channel.unary_stream(
        TAIL,
        request_serializer=StringValue.SerializeToString,
        response_deserializer=StringValue.FromString,
    )
    try:
        return [msg.value async for msg in call(StringValue(), timeout=10)]
    except grpc.RpcError as err:
        raise _status.from_rpc_error(err) from err


async def test_calls_inside_hold_carry_the_token_and_the_handler_sees_it(
    running: Running, channel: grpc.aio.Channel
) -> None:
    async with AsyncLeaseClient(running.leases.address) as leases:
        async with leases.hold("ledger", ttl=5) as lease:
            assert await append(channel, "first") == 1
            assert await tail(channel) == ["first"]
        assert running.ledger.entries == [("ledger", lease.token, "first")]
        assert await running.interceptor.store.describe_fence("ledger") == lease.token


async def test_a_call_without_a_token_is_refused(
    running: Running, channel: grpc.aio.Channel
) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        await append(channel, "anonymous")
    assert err.value.field == propagation.TOKEN_KEY
    assert running.ledger.entries == [] and running.ledger.unfenced == []


async def test_a_former_holder_is_rejected_and_its_handler_never_runs(
    running: Running, channel: grpc.aio.Channel
) -> None:
    async with (
        AsyncLeaseClient(running.leases.address, holder="a") as a,
        AsyncLeaseClient(running.leases.address, holder="b") as b,
    ):
        old = await a.acquire("ledger", ttl=0.2)
        with propagation.bound(old):
            await append(channel, "old-1")
        await asyncio.sleep(0.3)  # old is paused past its ttl
        new = await b.acquire("ledger", ttl=5)
        with propagation.bound(new):
            await append(channel, "new-1")
        with propagation.bound(old), pytest.raises(StaleTokenError) as stale:
            await append(channel, "old-2")  # the paused holder resumes
        assert stale.value.current_token == new.token
        with propagation.bound(old), pytest.raises(StaleTokenError):
            await tail(channel)  # streams are fenced too
    assert [value for _, _, value in running.ledger.entries] == ["old-1", "new-1"]
    assert running.interceptor.stale_rejections == 2


async def test_explicit_metadata_wins_and_grpc_services_are_not_fenced(
    running: Running, channel: grpc.aio.Channel
) -> None:
    async with AsyncLeaseClient(running.leases.address) as leases, leases.hold("ledger", ttl=5):
        await append(channel, "x", metadata=propagation.to_metadata(Claim("other", 9)))
    assert running.ledger.entries == [("other", 9, "x")]
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_the_blocking_sdk_and_interceptor_carry_it_too(running: Running) -> None:
    def blocking() -> tuple[int, int]:
        with (
            LeaseClient(running.leases.address) as leases,
            grpc.intercept_channel(
                grpc.insecure_channel(running.address), TokenInterceptor()
            ) as intercepted,
        ):
            stub = intercepted.unary_unary(
                APPEND,
                request_serializer=StringValue.SerializeToString,
                response_deserializer=Int64Value.FromString,
            )
            with leases.hold("ledger", ttl=5) as lease:
                reply = stub(StringValue(value="sync"), timeout=10)
            return lease.token, reply.value

    token, count = await asyncio.to_thread(blocking)
    assert count == 1
    assert running.ledger.entries == [("ledger", token, "sync")]


async def test_require_false_lets_unfenced_calls_through() -> None:
    server, state, leases = await _serve(require=False)
    try:
        async with grpc.aio.insecure_channel(state.address) as plain:
            await append(plain, "plain")
        assert state.ledger.unfenced == ["plain"]
    finally:
        await server.stop(0)
        await leases.stop(0)


async def test_a_request_that_cannot_be_decoded_is_refused_before_the_fence(
    running: Running,
) -> None:
    """Bad bytes are INVALID_ARGUMENT naming the field, and neither reach the handler
    nor move the fence (the claim they carry is never judged)."""
    raw = b"\x0a\x03\xff\xfe\xfd"  # StringValue.value = 3 bytes that are not UTF-8
    metadata = ((propagation.RESOURCE_KEY, "ledger"), (propagation.TOKEN_KEY, "7"))
    async with grpc.aio.insecure_channel(running.address) as plain:
        call: Any = plain.unary_unary(APPEND)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(raw, metadata=metadata, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = _status.from_rpc_error(refused.value)
    assert isinstance(error, InvalidArgumentError) and error.field == "value"
    assert running.ledger.entries == [] and running.ledger.unfenced == []
    assert await running.interceptor.store.describe_fence("ledger") == 0
