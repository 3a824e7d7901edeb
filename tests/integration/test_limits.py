"""Abuse limits: per-client caps on waiters and watch streams, deadlines on backend calls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from fencing import _status
from fencing.errors import BackendUnavailableError, InvalidArgumentError, ResourceExhaustedError
from fencing.v1 import lease_pb2, lease_pb2_grpc
from lease_server.backends.memory import MemoryBackend
from lease_server.server import SERVICE_NAME, LeaseServer, start_lease_server
from lease_server.service import LeaseService
from serving.auth import AuthPolicy
from serving.server import ServerOptions, Service, build_server
from tests.waiting import HANG_GUARD, eventually

#: Channels in one process share connections unless told not to; a client without
#: auth is its connection (peer address), so each test client gets its own.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def acquire(resource: str, holder: str, wait_ms: int = 0) -> lease_pb2.AcquireRequest:
    return lease_pb2.AcquireRequest(
        resource=resource, holder=holder, ttl_ms=60_000, wait_ms=wait_ms
    )


def error_of(outcome: BaseException | Any) -> Exception | None:
    if isinstance(outcome, grpc.aio.AioRpcError):
        return _status.from_rpc_error(outcome)
    return outcome if isinstance(outcome, Exception) else None


@pytest.fixture
async def capped() -> AsyncIterator[LeaseServer]:
    server = await start_lease_server(
        MemoryBackend(), "127.0.0.1:0", options=ServerOptions(max_waiters=3)
    )
    yield server
    await server.stop(0)


async def test_a_flooding_client_hits_its_cap_while_another_still_acquires(
    capped: LeaseServer,
) -> None:
    metrics = capped.metrics.registry.get_sample_value
    async with (
        grpc.aio.insecure_channel(capped.address, OWN_CONNECTION) as holder_ch,
        grpc.aio.insecure_channel(capped.address, OWN_CONNECTION) as flood_ch,
        grpc.aio.insecure_channel(capped.address, OWN_CONNECTION) as other_ch,
    ):
        holder = lease_pb2_grpc.LeaseServiceStub(holder_ch)
        flooder = lease_pb2_grpc.LeaseServiceStub(flood_ch)
        other = lease_pb2_grpc.LeaseServiceStub(other_ch)
        await holder.Acquire(acquire("hot", "holder"))
        calls = [flooder.Acquire(acquire("hot", "flooder", wait_ms=120_000)) for _ in range(10)]
        waiting = [asyncio.ensure_future(_outcome(call)) for call in calls]
        await eventually(lambda: sum(f.done() for f in waiting) == 7, "7 refusals")
        refused = [error_of(f.result()) for f in waiting if f.done()]
        assert all(isinstance(e, ResourceExhaustedError) for e in refused), refused
        assert {e.limit for e in refused if isinstance(e, ResourceExhaustedError)} == {"waiters"}
        await eventually(lambda: metrics("fencing_lease_waiters") == 3, "3 queued waiters")
        assert metrics("fencing_client_limit_rejections_total", {"limit": "waiters"}) == 7

        # The other client is not starved: it acquires at once, and may wait too.
        lease = await other.Acquire(acquire("cool", "other"), timeout=HANG_GUARD)
        assert lease.token == 1
        lease = await other.Acquire(acquire("cool-2", "other", wait_ms=5_000), timeout=HANG_GUARD)
        assert lease.token == 1

        for call in calls:
            call.cancel()
        await asyncio.gather(*waiting)
    await eventually(lambda: metrics("fencing_lease_waiters") == 0, "waiters gone")


async def test_waiting_acquires_on_a_lease_stream_hold_the_same_cap(
    capped: LeaseServer,
) -> None:
    """On a Session stream an Acquire's first attempt is a step of its message, and one
    with ``wait_ms`` holds a waiter slot from admission to answer, as the unary call
    does: past the cap it is refused at once (a free resource's too, as unary), the
    others wait."""
    metrics = capped.metrics.registry.get_sample_value
    async with (
        grpc.aio.insecure_channel(capped.address, OWN_CONNECTION) as holder_ch,
        grpc.aio.insecure_channel(capped.address, OWN_CONNECTION) as flood_ch,
    ):
        await lease_pb2_grpc.LeaseServiceStub(holder_ch).Acquire(acquire("hot", "holder"))
        session = lease_pb2_grpc.LeaseServiceStub(flood_ch).Session()
        calls = [
            lease_pb2.SessionCall(id=i + 1, acquire=acquire("hot", "flooder", wait_ms=120_000))
            for i in range(5)
        ]
        calls.append(lease_pb2.SessionCall(id=99, acquire=acquire("free", "flooder", 120_000)))
        await session.write(lease_pb2.SessionRequest(calls=calls))
        replies: dict[int, lease_pb2.SessionReply] = {}
        while len(replies) < 3:  # the calls past the first three
            response = await asyncio.wait_for(session.read(), HANG_GUARD)
            assert isinstance(response, lease_pb2.SessionResponse)
            replies.update({r.id: r for r in response.replies})
        assert sorted(replies) == [4, 5, 99]
        refused = [_status.from_status(r.error) for r in replies.values()]
        assert all(isinstance(e, ResourceExhaustedError) for e in refused), refused
        assert {e.limit for e in refused if isinstance(e, ResourceExhaustedError)} == {"waiters"}
        await eventually(lambda: metrics("fencing_lease_waiters") == 3, "3 queued waiters")
        session.cancel()
        await eventually(lambda: metrics("fencing_lease_waiters") == 0, "waiters gone")
        # Their slots went with them: the same client waits three times again.
        again = lease_pb2_grpc.LeaseServiceStub(flood_ch).Session()
        await again.write(lease_pb2.SessionRequest(calls=calls[:3]))
        await eventually(lambda: metrics("fencing_lease_waiters") == 3, "3 queued again")
        again.cancel()
    await eventually(lambda: metrics("fencing_lease_waiters") == 0, "waiters gone")


async def _outcome(call: Any) -> Any:
    try:
        return await call
    except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
        return exc


async def test_with_auth_the_cap_is_per_principal_across_connections(tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(
        '[principals.flood]\ntokens = ["f"]\nallow = [{prefix = "", actions = ["*"]}]\n'
        '[principals.calm]\ntokens = ["c"]\nallow = [{prefix = "", actions = ["*"]}]\n'
    )
    options = ServerOptions(auth=AuthPolicy.load(path), max_waiters=2)
    server = await start_lease_server(MemoryBackend(), "127.0.0.1:0", options=options)

    def channel(token: str) -> grpc.aio.Channel:
        creds = grpc.composite_channel_credentials(
            grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP),
            grpc.access_token_call_credentials(token),
        )
        return grpc.aio.secure_channel(server.address, creds, OWN_CONNECTION)

    try:
        async with channel("c") as calm_ch, channel("f") as one, channel("f") as two:
            calm = lease_pb2_grpc.LeaseServiceStub(calm_ch)
            await calm.Acquire(acquire("hot", "x"))
            calls = [
                lease_pb2_grpc.LeaseServiceStub(ch).Acquire(acquire("hot", "x", wait_ms=120_000))
                for ch in (one, two, one, two)
            ]
            outcomes = [asyncio.ensure_future(_outcome(call)) for call in calls]
            await eventually(lambda: sum(f.done() for f in outcomes) == 2, "2 refusals")
            refused = [error_of(f.result()) for f in outcomes if f.done()]
            assert all(isinstance(e, ResourceExhaustedError) for e in refused), refused
            granted = await calm.Acquire(acquire("cool", "x", wait_ms=1000), timeout=HANG_GUARD)
            assert granted.holder == "calm"
            for call in calls:
                call.cancel()
            await asyncio.gather(*outcomes)
    finally:
        await server.stop(0)


class _StreamingLeaseService(LeaseService):
    """Watch that streams until cancelled: enough to exercise the edge's stream caps."""

    async def Watch(
        self, request: lease_pb2.WatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[lease_pb2.LeaseEvent]:
        yield lease_pb2.LeaseEvent(resource=request.resource)
        await asyncio.Event().wait()


async def test_watch_streams_are_capped_per_client_and_counted() -> None:
    service = _StreamingLeaseService(MemoryBackend())
    built = await build_server(
        "127.0.0.1:0",
        [Service(SERVICE_NAME, service, lease_pb2_grpc.add_LeaseServiceServicer_to_server)],
        options=ServerOptions(max_watch_streams=2),
    )
    await built.server.start()
    gauge = built.metrics.registry.get_sample_value
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{built.port}") as ch:
            stub = lease_pb2_grpc.LeaseServiceStub(ch)
            streams = [stub.Watch(lease_pb2.WatchRequest(resource=f"r{i}")) for i in range(2)]
            for stream in streams:
                event: Any = await stream.read()
                assert event.resource.startswith("r")
            assert gauge("fencing_lease_watch_streams") == 2
            third = stub.Watch(lease_pb2.WatchRequest(resource="r3"))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await third.read()
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            streams[0].cancel()
            await eventually(lambda: gauge("fencing_lease_watch_streams") == 1, "a stream closed")
            again = stub.Watch(lease_pb2.WatchRequest(resource="r4"))
            event = await again.read()
            assert event.resource == "r4"
            again.cancel()
            streams[1].cancel()
    finally:
        await built.server.stop(0)


class _HungBackend(MemoryBackend):
    async def acquire(self, resource: str, holder: str, ttl_ms: int, request_id: str) -> Any:
        await asyncio.Event().wait()


async def test_a_hung_backend_call_fails_unavailable_after_the_backend_timeout() -> None:
    options = ServerOptions(backend_timeout=0.2)
    server = await start_lease_server(_HungBackend(), "127.0.0.1:0", options=options)
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = lease_pb2_grpc.LeaseServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Acquire(acquire("r", "h"), timeout=HANG_GUARD)
            exc = error_of(err.value)
            assert isinstance(exc, BackendUnavailableError)
            assert "took longer than 0.2 s" in str(exc)
            # Describe is not hung: the server itself is fine.
            state = await stub.Describe(lease_pb2.DescribeRequest(resource="r"))
            assert not state.held
        value = server.metrics.registry.get_sample_value
        assert value("fencing_backend_timeouts_total", {"server": "lease"}) == 1
        assert value("fencing_lease_acquires_total", {"outcome": "error"}) == 1
    finally:
        await server.stop(0)


# -- bytes that are not a valid request --------------------------------------------------

#: Stands in for a string field's text while a frame is built; replaced, byte for byte
#: (same length, so every length prefix stays right), by bytes that are not UTF-8.
_MARK = "zqBADq"
_NOT_UTF8 = b"\xff\xfe\xc3\x28\xa0\xa1"
assert len(_MARK.encode()) == len(_NOT_UTF8)


def _mark_first_string(message: Any, path: str = "") -> str | None:
    """Put :data:`_MARK` into the first string field of ``message`` (depth first through
    message fields, one element of each repeated one); return the field's path."""
    from google.protobuf.descriptor import FieldDescriptor

    for fd in message.DESCRIPTOR.fields:
        name = f"{path}{fd.name}"
        repeated = fd.is_repeated
        if fd.type == FieldDescriptor.TYPE_STRING and not fd.message_type:
            if repeated:
                getattr(message, fd.name).append(_MARK)
                return f"{name}[0]"
            setattr(message, fd.name, _MARK)
            return name
        if fd.type == FieldDescriptor.TYPE_MESSAGE and not fd.message_type.GetOptions().map_entry:
            if repeated:
                child = getattr(message, fd.name).add()
                found = _mark_first_string(child, f"{name}[0].")
            else:
                child = getattr(message, fd.name)
                found = _mark_first_string(child, f"{name}.")
            if found is not None:
                return found
            message.ClearField(fd.name)
    return None


def _bad_frames() -> list[tuple[str, str, bool, bool, bytes]]:
    """(method, bad field, request streams, response streams, raw frame) for every RPC
    of both servers whose request has a string field."""
    from google.protobuf import message_factory

    from fencing.v1 import guard_pb2, queue_pb2

    frames = []
    for module in (lease_pb2, queue_pb2, guard_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                request = message_factory.GetMessageClass(method.input_type)()
                field = _mark_first_string(request)
                if field is None:
                    continue
                raw = request.SerializeToString().replace(_MARK.encode(), _NOT_UTF8)
                frames.append(
                    (
                        f"/{service.full_name}/{method.name}",
                        field,
                        method.client_streaming,
                        method.server_streaming,
                        raw,
                    )
                )
    return frames


BAD_FRAMES = _bad_frames()


@pytest.fixture
async def both_servers(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    from guard.server import start_guard
    from guard.stores.memory import MemoryStore
    from lease_server.queue.backends.memory import MemoryQueue

    lease = await start_lease_server(MemoryBackend(), "127.0.0.1:0", queue=MemoryQueue())
    guard = await start_guard(MemoryStore(), "127.0.0.1:0")
    try:
        yield lease.address, guard.address
    finally:
        await guard.stop(0)
        await lease.stop(0)


async def _send_raw(
    channel: grpc.aio.Channel, method: str, client_stream: bool, server_stream: bool, raw: bytes
) -> None:
    """Send ``raw`` as the request of ``method`` with grpcio's generic call API (no
    serializer: the bytes go on the wire as they are), and read the whole answer."""
    channel_: Any = channel  # the generic API is typed for serialized messages only
    if client_stream:

        async def requests() -> AsyncIterator[bytes]:
            yield raw

        if server_stream:
            async for _ in channel_.stream_stream(method)(requests(), timeout=HANG_GUARD):
                pass
        else:
            await channel_.stream_unary(method)(requests(), timeout=HANG_GUARD)
    elif server_stream:
        async for _ in channel_.unary_stream(method)(raw, timeout=HANG_GUARD):
            pass
    else:
        await channel_.unary_unary(method)(raw, timeout=HANG_GUARD)


def test_every_rpc_with_a_string_field_gets_a_bad_frame() -> None:
    methods = {m for m, *_ in BAD_FRAMES}
    for name in ("Acquire", "Watch", "AcquireMany"):
        assert f"/fencing.v1.LeaseService/{name}" in methods
    for name in ("Write", "WriteMany", "WriteStream", "Read", "Fence"):
        assert f"/fencing.v1.GuardService/{name}" in methods
    assert "/fencing.v1.QueueService/Enqueue" in methods


@pytest.mark.parametrize(
    ("method", "field", "client_stream", "server_stream", "raw"),
    BAD_FRAMES,
    ids=[m.rsplit(".", 1)[1] for m, *_ in BAD_FRAMES],
)
async def test_a_string_that_is_not_utf8_is_an_invalid_argument_naming_the_field(
    both_servers: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
    method: str,
    field: str,
    client_stream: bool,
    server_stream: bool,
    raw: bytes,
) -> None:
    lease_address, guard_address = both_servers
    address = guard_address if "GuardService" in method else lease_address
    caplog.set_level(logging.INFO)
    async with grpc.aio.insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _send_raw(channel, method, client_stream, server_stream, raw)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    error = _status.from_rpc_error(refused.value)
    assert isinstance(error, InvalidArgumentError)
    assert error.field == field
    assert "UTF-8" in str(error)
    # One line in the log, no traceback.
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    lines = [r for r in caplog.records if "not valid UTF-8" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert method in lines[0].getMessage()


async def test_a_nested_key_and_a_truncated_frame_are_invalid_arguments(
    both_servers: tuple[str, str],
) -> None:
    from fencing.v1 import guard_pb2

    _, guard_address = both_servers
    write = guard_pb2.WriteRequest(
        resource="orders",
        token=1,
        ops=[
            guard_pb2.Op(put=guard_pb2.Put(key="fine", value=b"\xff")),  # bytes may be anything
            guard_pb2.Op(put=guard_pb2.Put(key=_MARK, value=b"v")),
        ],
    )
    raw = write.SerializeToString().replace(_MARK.encode(), _NOT_UTF8)
    async with grpc.aio.insecure_channel(guard_address) as channel:
        call: Any = channel.unary_unary("/fencing.v1.GuardService/Write")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(raw, timeout=HANG_GUARD)
        error = _status.from_rpc_error(refused.value)
        assert isinstance(error, InvalidArgumentError) and error.field == "ops[1].put.key"
        with pytest.raises(grpc.aio.AioRpcError) as truncated:
            await call(write.SerializeToString()[:-3], timeout=HANG_GUARD)
        assert truncated.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid fencing.v1.WriteRequest" in (truncated.value.details() or "")
        # Nothing was written, and a well-formed request still works.
        read = channel.unary_unary(
            "/fencing.v1.GuardService/Read",
            request_serializer=guard_pb2.ReadRequest.SerializeToString,
            response_deserializer=guard_pb2.ReadResponse.FromString,
        )
        answer = await read(guard_pb2.ReadRequest(resource="orders", key="fine"))
        assert not answer.found
