"""LeaseService.Session over real gRPC on every lease backend: each call kind answered by
id with the unary call's verdict, concurrently, in any order."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from fencing import _status
from fencing.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLost,
    PermissionDeniedError,
)
from fencing.types import SESSION_MAX_IN_FLIGHT_KEY
from fencing.v1 import lease_pb2, lease_pb2_grpc
from lease_server.backends.base import LeaseBackend
from lease_server.server import lease_services
from lease_server.service import LeaseService
from serving.auth import AuthPolicy
from serving.server import BuiltServer, ServerOptions, build_server
from tests.backends import TimeControl
from tests.waiting import HANG_GUARD

Pair = tuple[LeaseBackend, TimeControl]


@dataclass
class Served:
    service: LeaseService
    built: BuiltServer
    address: str

    async def stop(self, grace: float = 0) -> None:
        self.service.waiters.close()
        self.service.close()
        await self.built.server.stop(grace)


async def serve(backend: LeaseBackend, options: ServerOptions | None = None) -> Served:
    service, services = lease_services(backend)
    built = await build_server("127.0.0.1:0", services, options=options)
    await built.server.start()
    return Served(service, built, f"127.0.0.1:{built.port}")


@pytest.fixture
async def served(lease_backend: Pair) -> AsyncIterator[Served]:
    server = await serve(lease_backend[0])
    yield server
    await server.stop()


@dataclass
class Stream:
    """A raw Session stream: send calls, await each reply by id."""

    call: Any
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    pending: dict[int, asyncio.Future[lease_pb2.SessionReply]] = field(default_factory=dict)
    responses: list[lease_pb2.SessionResponse] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for response in self.call:
            self.responses.append(response)
            for reply in response.replies:
                self.order.append(reply.id)
                future = self.pending.pop(reply.id, None)
                if future is not None and not future.done():
                    future.set_result(reply)

    async def send(self, *calls: lease_pb2.SessionCall) -> list[asyncio.Future[Any]]:
        futures = []
        for call in calls:
            if not call.id:
                call.id = next(self.ids)
            future = asyncio.get_running_loop().create_future()
            self.pending[call.id] = future
            futures.append(future)
        await self.call.write(lease_pb2.SessionRequest(calls=calls))
        return futures

    async def ask(self, call: lease_pb2.SessionCall) -> lease_pb2.SessionReply:
        (future,) = await self.send(call)
        reply: lease_pb2.SessionReply = await asyncio.wait_for(future, HANG_GUARD)
        return reply


@pytest.fixture
async def channel(served: Served) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(served.address) as ch:
        yield ch


@pytest.fixture
async def stream(channel: grpc.aio.Channel) -> AsyncIterator[Stream]:
    s = Stream(lease_pb2_grpc.LeaseServiceStub(channel).Session())
    s.start()
    yield s
    s.call.cancel()


def acquire(resource: str, holder: str = "h", *, wait_ms: int = 0, ttl_ms: int = 60_000,
            request_id: str = "", deadline_ms: int = 0) -> lease_pb2.SessionCall:  # fmt: skip
    return lease_pb2.SessionCall(
        deadline_ms=deadline_ms,
        acquire=lease_pb2.AcquireRequest(
            resource=resource, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms, request_id=request_id
        ),
    )


def error(reply: lease_pb2.SessionReply) -> Exception:
    assert reply.WhichOneof("outcome") == "error", reply
    found = _status.from_status(reply.error)
    assert found is not None, reply.error
    return found


def info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo:
    for detail in status.details:
        found = error_details_pb2.ErrorInfo()
        if detail.Unpack(found):
            return found
    raise AssertionError(f"no ErrorInfo in {status}")


async def test_every_call_kind_is_answered_by_id(stream: Stream) -> None:
    got = await stream.ask(acquire("a"))
    lease = got.acquired
    assert (lease.resource, lease.holder, lease.token) == ("a", "h", lease.token)
    assert lease.token >= 1
    renewed = await stream.ask(
        lease_pb2.SessionCall(
            renew=lease_pb2.RenewRequest(resource="a", token=lease.token, ttl_ms=30_000)
        )
    )
    assert renewed.WhichOneof("outcome") == "renewed"
    assert renewed.renewed.token == lease.token
    released = await stream.ask(
        lease_pb2.SessionCall(release=lease_pb2.ReleaseRequest(resource="a", token=lease.token))
    )
    assert released.WhichOneof("outcome") == "released"
    many = await stream.ask(
        lease_pb2.SessionCall(
            acquire_many=lease_pb2.AcquireManyRequest(resources=["m"], holder="h", ttl_ms=60_000)
        )
    )
    assert [x.resource for x in many.acquired_many.leases] == ["m"]
    token = many.acquired_many.leases[0].token
    renewed_many = await stream.ask(
        lease_pb2.SessionCall(
            renew_many=lease_pb2.RenewManyRequest(
                renewals=[
                    lease_pb2.RenewRequest(resource="m", token=token, ttl_ms=60_000),
                    lease_pb2.RenewRequest(resource="gone", token=7, ttl_ms=60_000),
                ]
            )
        )
    )
    assert [r.lost for r in renewed_many.renewed_many.results] == [False, True]
    released_many = await stream.ask(
        lease_pb2.SessionCall(
            release_many=lease_pb2.ReleaseManyRequest(
                releases=[lease_pb2.ReleaseRequest(resource="m", token=token)]
            )
        )
    )
    assert list(released_many.released_many.released) == [True]
    pong = await stream.ask(lease_pb2.SessionCall(ping=lease_pb2.Ping()))
    assert pong.WhichOneof("outcome") == "pong"


async def test_the_stream_announces_its_in_flight_limit(stream: Stream) -> None:
    metadata = dict(await stream.call.initial_metadata())
    assert int(metadata[SESSION_MAX_IN_FLIGHT_KEY]) >= 1


#: Calls whose unary twin fails, and how (each checked against the unary call itself).
_FAILING = {
    "empty resource": acquire(""),
    "ttl too short": acquire("r", ttl_ms=5),
    "held": acquire("held-by-other", holder="me"),
    "renew lost": lease_pb2.SessionCall(
        renew=lease_pb2.RenewRequest(resource="nobody", token=3, ttl_ms=1000)
    ),
    "release lost": lease_pb2.SessionCall(
        release=lease_pb2.ReleaseRequest(resource="nobody", token=3)
    ),
    "acquire_many twice": lease_pb2.SessionCall(
        acquire_many=lease_pb2.AcquireManyRequest(resources=["x", "x"], holder="h", ttl_ms=1000)
    ),
    "renew_many bad token": lease_pb2.SessionCall(
        renew_many=lease_pb2.RenewManyRequest(
            renewals=[lease_pb2.RenewRequest(resource="x", token=0, ttl_ms=1000)]
        )
    ),
    "release_many empty": lease_pb2.SessionCall(release_many=lease_pb2.ReleaseManyRequest()),
}

_UNARY = {
    "acquire": "Acquire",
    "renew": "Renew",
    "release": "Release",
    "acquire_many": "AcquireMany",
    "renew_many": "RenewMany",
    "release_many": "ReleaseMany",
}


@pytest.mark.parametrize("case", sorted(_FAILING))
async def test_errors_equal_the_unary_calls(
    case: str, stream: Stream, channel: grpc.aio.Channel
) -> None:
    stub = lease_pb2_grpc.LeaseServiceStub(channel)
    taken = await stream.ask(acquire("held-by-other", holder="other"))
    assert taken.WhichOneof("outcome") == "acquired"
    call = lease_pb2.SessionCall()
    call.CopyFrom(_FAILING[case])
    which = call.WhichOneof("call")
    assert which is not None
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await getattr(stub, _UNARY[which])(getattr(call, which), timeout=HANG_GUARD)
    unary_status = rpc_status.from_call(unary.value)
    assert unary_status is not None
    streamed = (await stream.ask(call)).error
    assert streamed.code == unary_status.code == unary.value.code().value[0]
    assert info(streamed).reason == info(unary_status).reason
    assert info(streamed).metadata.keys() == info(unary_status).metadata.keys()
    if info(streamed).reason != "LEASE_HELD":  # the held one names the time left
        assert streamed.message == unary_status.message
        assert dict(info(streamed).metadata) == dict(info(unary_status).metadata)
    assert type(_status.from_status(streamed)) is type(_status.from_rpc_error(unary.value))


async def test_a_waiting_acquire_holds_up_nothing_and_replies_come_out_of_order(
    stream: Stream,
) -> None:
    first = await stream.ask(acquire("busy", holder="first"))
    (waiting,) = await stream.send(acquire("busy", holder="second", wait_ms=30_000))
    # Fast calls behind the waiting one are answered while it waits.
    for i in range(5):
        reply = await stream.ask(acquire(f"free{i}"))
        assert reply.WhichOneof("outcome") == "acquired"
    assert not waiting.done()
    await stream.ask(
        lease_pb2.SessionCall(
            release=lease_pb2.ReleaseRequest(resource="busy", token=first.acquired.token)
        )
    )
    granted = await asyncio.wait_for(waiting, HANG_GUARD)
    assert granted.acquired.holder == "second"
    assert granted.acquired.token > first.acquired.token
    wait_id = granted.id
    assert stream.order.index(wait_id) > stream.order.index(wait_id + 1)


async def test_a_waiting_acquire_that_runs_out_is_lease_held(stream: Stream) -> None:
    await stream.ask(acquire("busy", holder="first"))
    reply = await stream.ask(acquire("busy", holder="second", wait_ms=300))
    assert isinstance(error(reply), LeaseHeldError)
    assert reply.error.code == grpc.StatusCode.ABORTED.value[0]


async def test_many_calls_in_one_message_each_get_a_reply(stream: Stream) -> None:
    futures = await stream.send(*(acquire(f"r{i}") for i in range(50)))
    replies = await asyncio.wait_for(asyncio.gather(*futures), HANG_GUARD)
    assert sorted(r.acquired.resource for r in replies) == sorted(f"r{i}" for i in range(50))


async def test_a_replayed_request_id_returns_the_same_lease(stream: Stream) -> None:
    one = await stream.ask(acquire("idem", request_id="req-1"))
    two = await stream.ask(acquire("idem", request_id="req-1"))
    assert one.acquired.token == two.acquired.token


async def test_a_call_of_no_kind_and_a_duplicate_id_are_invalid(stream: Stream) -> None:
    reply = await stream.ask(lease_pb2.SessionCall())
    assert isinstance(error(reply), InvalidArgumentError)
    assert info(reply.error).metadata["field"] == "call"
    await stream.ask(acquire("busy", holder="first"))
    waiting = acquire("busy", holder="second", wait_ms=30_000)
    waiting.id = 1000
    await stream.send(waiting)
    again = acquire("other")
    again.id = 1000
    reply = await stream.ask(again)
    assert isinstance(error(reply), InvalidArgumentError)
    assert info(reply.error).metadata["field"] == "id"


async def test_deadline_ms_cuts_a_wait_short(stream: Stream) -> None:
    await stream.ask(acquire("busy", holder="first"))
    reply = await stream.ask(acquire("busy", holder="second", wait_ms=60_000, deadline_ms=300))
    assert isinstance(error(reply), DeadlineExceededError)
    assert reply.error.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    # The stream goes on.
    assert (await stream.ask(acquire("after"))).WhichOneof("outcome") == "acquired"


async def test_each_call_is_authorized_as_its_unary_method_and_bound_to_the_principal() -> None:
    from lease_server.backends.memory import MemoryBackend

    policy = AuthPolicy.from_dict(
        {
            "principals": {
                "billing": {
                    "tokens": ["t"],
                    "allow": [{"prefix": "orders/", "actions": ["acquire", "release"]}],
                }
            }
        }
    )
    backend = MemoryBackend()
    await backend.open()
    server = await serve(backend, ServerOptions(auth=policy))
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            bearer = (("authorization", "Bearer t"),)
            s = Stream(lease_pb2_grpc.LeaseServiceStub(ch).Session(metadata=bearer))
            s.start()
            granted = await s.ask(acquire("orders/1", holder="someone-else"))
            assert granted.acquired.holder == "billing"
            refused = await s.ask(acquire("payments/1"))
            assert isinstance(error(refused), PermissionDeniedError)
            renew = await s.ask(
                lease_pb2.SessionCall(
                    renew=lease_pb2.RenewRequest(
                        resource="orders/1", token=granted.acquired.token, ttl_ms=1000
                    )
                )
            )
            assert isinstance(error(renew), PermissionDeniedError)
            assert isinstance(
                error(
                    await s.ask(
                        lease_pb2.SessionCall(
                            release=lease_pb2.ReleaseRequest(resource="orders/1", token=999)
                        )
                    )
                ),
                LeaseLost,
            )
            s.call.cancel()
            anonymous = lease_pb2_grpc.LeaseServiceStub(ch).Session()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await anonymous.read()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await server.stop()
        await backend.close()
