"""LeaseService.Session over real gRPC on every lease backend: each call kind answered by
id with the unary call's verdict, concurrently, in any order."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_status import rpc_status

from fencing import _status
from fencing.errors import (
    BackendUnavailableError,
    DeadlineExceededError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLost,
    PermissionDeniedError,
    ResourceExhaustedError,
)
from fencing.limits import MAX_SESSION_CALLS
from fencing.types import SESSION_MAX_IN_FLIGHT_KEY, SESSION_MAX_UPKEEP_IN_FLIGHT_KEY
from fencing.v1 import lease_pb2, lease_pb2_grpc
from lease_server.backends.base import LeaseBackend
from lease_server.backends.memory import MemoryBackend
from lease_server.leases import LeaseStep, StepOutcome
from lease_server.metrics import LeaseMetrics
from lease_server.server import lease_services, start_lease_server
from lease_server.service import LeaseService
from serving.auth import AuthPolicy
from serving.server import (
    KEEPALIVE_TIME_MS,
    KEEPALIVE_TIMEOUT_MS,
    BuiltServer,
    ServerOptions,
    build_server,
)
from tests.backends import LEASE_BACKENDS
from tests.e2e.test_postgres_servers import lease_server_processes
from tests.sessions import Stream, acquire, error, info, ping, release
from tests.waiting import HANG_GUARD, eventually


@dataclass
class Served:
    service: LeaseService
    built: BuiltServer
    address: str

    async def stop(self, grace: float = 0) -> None:
        self.service.waiters.close()
        self.service.close()
        await self.built.server.stop(grace)


#: The in-flight cap of the servers here: small, so a test can reach it.
MAX_IN_FLIGHT = 8


async def serve(backend: LeaseBackend, options: ServerOptions | None = None) -> Served:
    options, metrics = (
        options or ServerOptions(session_max_in_flight=MAX_IN_FLIGHT)
    ).with_metrics()
    service, services = lease_services(
        backend, metrics.group(LeaseMetrics), session_max_in_flight=options.session_max_in_flight
    )
    built = await build_server("127.0.0.1:0", services, options=options)
    await built.server.start()
    return Served(service, built, f"127.0.0.1:{built.port}")


#: The stream is the service's, above any backend: one of each kind is enough (a Redis
#: Cluster behaves as Redis here, and takes long to start).
BACKENDS = ("memory", "sqlite", "postgres", "redis")


@pytest.fixture(params=BACKENDS)
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    async with LEASE_BACKENDS[request.param]() as (backend, _):
        server = await serve(backend)
        yield server
        await server.stop()


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


async def test_a_renewal_naming_no_ttl_keeps_the_leases_own_on_the_stream(
    stream: Stream, channel: grpc.aio.Channel
) -> None:
    """ttl_ms 0 (absent) in a Renew, a RenewMany and the unary Renew: the lease's own ttl."""
    one = (await stream.ask(acquire("own", ttl_ms=40_000))).acquired
    two = (await stream.ask(acquire("own-2", ttl_ms=20_000))).acquired
    renewed = await stream.ask(
        lease_pb2.SessionCall(renew=lease_pb2.RenewRequest(resource="own", token=one.token))
    )
    assert renewed.WhichOneof("outcome") == "renewed", renewed
    assert renewed.renewed.ttl_ms == 40_000
    many = await stream.ask(
        lease_pb2.SessionCall(
            renew_many=lease_pb2.RenewManyRequest(
                renewals=[
                    lease_pb2.RenewRequest(resource="own", token=one.token),
                    lease_pb2.RenewRequest(resource="own-2", token=two.token),
                ]
            )
        )
    )
    assert [r.lease.ttl_ms for r in many.renewed_many.results] == [40_000, 20_000]
    unary = lease_pb2_grpc.LeaseServiceStub(channel)
    lease = await unary.Renew(lease_pb2.RenewRequest(resource="own-2", token=two.token))
    assert lease.ttl_ms == 20_000
    # Below the minimum is still refused, naming the field: only 0 means "the lease's own".
    bad = await stream.ask(
        lease_pb2.SessionCall(
            renew=lease_pb2.RenewRequest(resource="own", token=one.token, ttl_ms=5)
        )
    )
    refused = error(bad)
    assert isinstance(refused, InvalidArgumentError) and refused.field == "ttl_ms", refused


async def test_the_stream_announces_its_in_flight_limit(stream: Stream) -> None:
    metadata = dict(await stream.call.initial_metadata())
    assert metadata[SESSION_MAX_IN_FLIGHT_KEY] == str(MAX_IN_FLIGHT)
    assert metadata[SESSION_MAX_UPKEEP_IN_FLIGHT_KEY] == str(MAX_IN_FLIGHT)


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


async def test_errors_equal_the_unary_calls_when_sent_in_one_message(
    stream: Stream, channel: grpc.aio.Channel
) -> None:
    stub = lease_pb2_grpc.LeaseServiceStub(channel)
    taken = await stream.ask(acquire("held-by-other", holder="other"))
    assert taken.WhichOneof("outcome") == "acquired"
    cases = sorted(_FAILING)
    calls = []
    for case in cases:
        call = lease_pb2.SessionCall()
        call.CopyFrom(_FAILING[case])
        calls.append(call)
    futures = await stream.send(*calls)
    replies = await asyncio.wait_for(asyncio.gather(*futures), HANG_GUARD)
    for case, call, reply in zip(cases, calls, replies, strict=True):
        which = call.WhichOneof("call")
        assert which is not None
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await getattr(stub, _UNARY[which])(getattr(call, which), timeout=HANG_GUARD)
        assert reply.error.code == unary.value.code().value[0], case
        assert type(_status.from_status(reply.error)) is type(
            _status.from_rpc_error(unary.value)
        ), case


async def test_the_steps_of_one_message_are_one_backend_step_in_message_order(
    served: Served, stream: Stream
) -> None:
    value = served.built.metrics.registry.get_sample_value
    steps = value("fencing_lease_steps_total") or 0.0
    stepped = value("fencing_lease_step_calls_total") or 0.0
    futures = await stream.send(
        acquire("one", holder="first"),
        # Held: the first holder's acquire, earlier in the message, was decided first.
        acquire("one", holder="second"),
        lease_pb2.SessionCall(release=lease_pb2.ReleaseRequest(resource="nobody", token=3)),
        # Invalid, so never a step; a ping is the stream's own.
        acquire("two", ttl_ms=5),
        ping(),
    )
    granted, held, lost, invalid, pong = await asyncio.wait_for(
        asyncio.gather(*futures), HANG_GUARD
    )
    assert granted.acquired.holder == "first"
    assert isinstance(error(held), LeaseHeldError)
    assert isinstance(error(lost), LeaseLost)
    assert isinstance(error(invalid), InvalidArgumentError)
    assert info(invalid.error).metadata["field"] == "ttl_ms"
    assert pong.WhichOneof("outcome") == "pong"
    # The three steps went to the backend together: one step of three calls.
    assert value("fencing_lease_steps_total") == steps + 1
    assert value("fencing_lease_step_calls_total") == stepped + 3


class _GatedSteps(MemoryBackend):
    """A step touching ``slow`` waits for ``gate``: a message kept undecided at will."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def lease_steps(self, steps: Sequence[LeaseStep]) -> list[StepOutcome]:
        if any(op.resource == "slow" for op in steps):
            await self.gate.wait()
        return await super().lease_steps(steps)


async def test_a_deadline_in_a_message_answers_its_call_and_the_others_wait_for_the_step() -> None:
    backend = _GatedSteps()
    await backend.open()
    server = await serve(backend)
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            s = Stream.open(ch)
            cut, kept = await s.send(acquire("slow", deadline_ms=300), acquire("other"))
            assert isinstance(error(await asyncio.wait_for(cut, HANG_GUARD)), DeadlineExceededError)
            assert not kept.done()
            backend.gate.set()
            assert (await asyncio.wait_for(kept, HANG_GUARD)).acquired.resource == "other"
            # The cut call's step went on (its effect was unknown to its caller): granted.
            assert isinstance(error(await s.ask(acquire("slow", holder="next"))), LeaseHeldError)
            s.call.cancel()
    finally:
        await server.stop()
        await backend.close()


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
    names = [f"r{i}" for i in range(MAX_IN_FLIGHT)]
    futures = await stream.send(*(acquire(name) for name in names))
    replies = await asyncio.wait_for(asyncio.gather(*futures), HANG_GUARD)
    assert sorted(r.acquired.resource for r in replies) == sorted(names)


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


# -- limits -------------------------------------------------------------------------------


async def test_calls_beyond_the_in_flight_cap_are_resource_exhausted(
    stream: Stream, channel: grpc.aio.Channel
) -> None:
    first = await stream.ask(acquire("busy", holder="first"))
    waiting = await stream.send(
        *(acquire("busy", holder=f"w{i}", wait_ms=30_000) for i in range(MAX_IN_FLIGHT))
    )
    beyond = await stream.ask(acquire("free"))
    exhausted = error(beyond)
    assert isinstance(exhausted, ResourceExhaustedError)
    assert exhausted.limit == "session_in_flight"
    assert beyond.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    # Renewals and releases have a limit of their own: acquires waiting in line never
    # hold up the renewal of a lease already held.
    renew = lease_pb2.RenewRequest(
        resource="busy", token=first.acquired.token, ttl_ms=60_000, holder="first"
    )
    renewed = await stream.ask(lease_pb2.SessionCall(renew=renew))
    assert renewed.WhichOneof("outcome") == "renewed", renewed
    # Pings are not calls in flight: the stream's liveness is never refused.
    assert (await stream.ask(ping())).WhichOneof("outcome") == "pong"
    assert not any(w.done() for w in waiting)
    # The cap is per stream: another stream of the same client is not full.
    other = Stream(lease_pb2_grpc.LeaseServiceStub(channel).Session())
    other.start()
    released = await other.ask(
        lease_pb2.SessionCall(
            release=lease_pb2.ReleaseRequest(resource="busy", token=first.acquired.token)
        )
    )
    assert released.WhichOneof("outcome") == "released"
    other.call.cancel()
    (done,), _ = await asyncio.wait(waiting, timeout=HANG_GUARD, return_when="FIRST_COMPLETED")
    assert done.result().WhichOneof("outcome") == "acquired"
    # One slot free again: the call that was refused now gets its verdict.
    assert (await stream.ask(acquire("free"))).WhichOneof("outcome") == "acquired"


async def test_a_message_of_too_many_calls_is_invalid_naming_calls(stream: Stream) -> None:
    futures = await stream.send(
        *(lease_pb2.SessionCall(ping=lease_pb2.Ping()) for _ in range(MAX_SESSION_CALLS + 1))
    )
    replies = await asyncio.wait_for(asyncio.gather(*futures), HANG_GUARD)
    assert len(replies) == MAX_SESSION_CALLS + 1
    for reply in replies:
        assert isinstance(error(reply), InvalidArgumentError)
        assert info(reply.error).metadata["field"] == "calls"
    # A full message is fine.
    futures = await stream.send(*(lease_pb2.SessionCall(ping=lease_pb2.Ping()) for _ in range(10)))
    assert all(r.WhichOneof("outcome") == "pong" for r in await asyncio.gather(*futures))


async def test_a_bad_deadline_is_invalid_naming_it(stream: Stream) -> None:
    reply = await stream.ask(acquire("r", deadline_ms=-1))
    assert isinstance(error(reply), InvalidArgumentError)
    assert info(reply.error).metadata["field"] == "deadline_ms"


async def test_calls_are_counted_by_kind_and_code(served: Served, stream: Stream) -> None:
    await stream.ask(acquire("c"))
    await stream.ask(acquire("c", holder="other"))
    await stream.ask(ping())
    value = served.built.metrics.registry.get_sample_value
    calls = "fencing_lease_session_calls_total"
    assert value(calls, {"kind": "acquire", "code": "OK"}) == 1
    assert value(calls, {"kind": "acquire", "code": "ABORTED"}) == 1
    assert value(calls, {"kind": "ping", "code": "OK"}) == 1
    assert value("fencing_lease_session_streams") == 1
    assert value("fencing_lease_acquires_total", {"outcome": "held"}) == 1


# -- drain --------------------------------------------------------------------------------


class _GatedBackend(MemoryBackend):
    """Acquires of ``slow`` wait for ``gate``: a call kept in flight as long as a test wants."""

    # The gated call is slow on its own: the other calls' steps go beside it. (With one
    # step in flight, as the shipped backends run, every call would wait for it.)
    step_concurrency = 4

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def acquire(self, resource: str, holder: str, ttl_ms: int, request_id: str) -> Any:
        if resource == "slow":
            self.entered.set()
            await self.gate.wait()
        return await super().acquire(resource, holder, ttl_ms, request_id)


async def test_a_draining_server_sends_goaway_refuses_new_calls_and_finishes_those_in_flight() -> (
    None
):
    backend = _GatedBackend()
    server = await start_lease_server(backend, "127.0.0.1:0", queue="off")
    stopping: asyncio.Task[None] | None = None
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            s = Stream(lease_pb2_grpc.LeaseServiceStub(ch).Session())
            s.start()
            held = await s.ask(acquire("busy", holder="first"))
            assert held.WhichOneof("outcome") == "acquired"
            (slow,) = await s.send(acquire("slow"))
            (waiter,) = await s.send(acquire("busy", holder="second", wait_ms=30_000))
            await asyncio.wait_for(backend.entered.wait(), HANG_GUARD)
            stopping = asyncio.create_task(server.stop(grace=HANG_GUARD))
            await eventually(lambda: any(r.HasField("goaway") for r in s.responses), "goaway")
            # The waiter is answered at once, retryable (the same request id, elsewhere).
            assert isinstance(
                error(await asyncio.wait_for(waiter, HANG_GUARD)), BackendUnavailableError
            )
            late = await s.ask(acquire("late"))
            assert isinstance(error(late), BackendUnavailableError)
            assert late.error.code == grpc.StatusCode.UNAVAILABLE.value[0]
            assert not slow.done()
            backend.gate.set()
            assert (await asyncio.wait_for(slow, HANG_GUARD)).acquired.resource == "slow"
            assert s.reader is not None
            await asyncio.wait_for(s.reader, HANG_GUARD)  # the stream ended, status OK
            assert await s.call.code() == grpc.StatusCode.OK
            await asyncio.wait_for(stopping, HANG_GUARD)
    finally:
        if stopping is None:
            await server.stop(0)


# -- keepalive ----------------------------------------------------------------------------

#: A client process: a Session to each address with a waiting acquire on it, "ready"
#: once both are queued, then idle (the test pauses it with SIGSTOP).
_PAUSED_CLIENT = """
import asyncio, sys
import grpc.aio
from fencing.v1 import lease_pb2, lease_pb2_grpc

async def main():
    calls = []
    for address in sys.argv[1:]:
        channel = grpc.aio.insecure_channel(address)
        call = lease_pb2_grpc.LeaseServiceStub(channel).Session()
        await call.write(lease_pb2.SessionRequest(calls=[lease_pb2.SessionCall(
            id=1, acquire=lease_pb2.AcquireRequest(
                resource="busy", holder="paused", ttl_ms=60_000, wait_ms=300_000))]))
        calls.append(call)
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.slow
async def test_a_paused_client_is_noticed_by_keepalive_and_its_calls_let_go() -> None:
    """With a short keepalive a server drops the stream of a paused client, and the
    waiter it left with it; the control server, keepalive as shipped (10 + 5 s), still
    holds its stream then."""
    servers = []
    # The control's keepalive as shipped, timeout included: 15 s before it could drop the
    # stream, where the quick one drops it within about 1 s.
    for keepalive_ms, timeout_ms in ((500, 500), (KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS)):
        backend = MemoryBackend()
        await backend.open()
        options = ServerOptions(keepalive_time_ms=keepalive_ms, keepalive_timeout_ms=timeout_ms)
        server = await serve(backend, options)
        holder = Stream.open(grpc.aio.insecure_channel(server.address))
        assert (await holder.ask(acquire("busy", holder="first"))).WhichOneof("outcome")
        servers.append((server, holder))
    (quick, _), (control, _) = servers
    client = subprocess.Popen(  # noqa: ASYNC220  (started once; its output read off-loop)
        [sys.executable, "-c", _PAUSED_CLIENT, quick.address, control.address],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert client.stdout is not None
        assert await asyncio.to_thread(client.stdout.readline) == "ready\n"
        for server, _ in servers:
            waiters = server.service.waiters
            await eventually(lambda w=waiters: w.waiting("busy") == 1, "queued")  # type: ignore[misc]
        client.send_signal(signal.SIGSTOP)
        paused = time.monotonic()
        await eventually(
            lambda: quick.service.sessions.open_streams == 1, "the paused stream dropped"
        )
        await eventually(lambda: quick.service.waiters.waiting("busy") == 0, "its waiter let go")
        waited = time.monotonic() - paused
        assert control.service.sessions.open_streams == 2, f"{waited:.1f} s after the pause"
        assert control.service.waiters.waiting("busy") == 1
    finally:
        client.kill()
        client.wait()
        if client.stdout is not None:
            client.stdout.close()
        for server, holder in servers:
            holder.call.cancel()
            await server.stop()


# -- a broken stream, carried on at another server -------------------------------------


@pytest.mark.postgres
async def test_a_broken_streams_calls_are_retried_on_a_second_server_with_the_same_outcome(
    postgres_url: str,
) -> None:
    """Two server processes on one PostgreSQL: a client's stream to the first breaks (the
    process is killed) with an acquire granted and one waiting; on a stream to the second,
    the granted one retried with its request id returns the same lease, and the waiting
    one, retried, waits on and gets the lease once it is released there."""
    with lease_server_processes(postgres_url, 2) as [(first, first_proc), (second, _)]:
        async with grpc.aio.insecure_channel(first) as ch:
            stream = Stream.open(ch)
            granted = await stream.ask(acquire("orders", holder="A", request_id="a-1"))
            assert granted.WhichOneof("outcome") == "acquired"
            (waiting,) = await stream.send(
                acquire("orders", holder="B", wait_ms=60_000, request_id="b-1")
            )
            await asyncio.sleep(0.5)  # B is in line (not asserted: only its retry matters)
            first_proc.kill()
            await asyncio.to_thread(first_proc.wait, HANG_GUARD)
            assert stream.reader is not None
            await asyncio.wait_for(
                asyncio.gather(stream.reader, return_exceptions=True), HANG_GUARD
            )
            assert await stream.call.code() == grpc.StatusCode.UNAVAILABLE
            assert not waiting.done()  # its outcome is unknown: retry it
        async with grpc.aio.insecure_channel(second) as ch:
            stream = Stream.open(ch)
            again = await stream.ask(acquire("orders", holder="A", request_id="a-1"))
            assert again.acquired.token == granted.acquired.token
            (retried,) = await stream.send(
                acquire("orders", holder="B", wait_ms=60_000, request_id="b-1")
            )
            released = await stream.ask(release("orders", granted.acquired.token))
            assert released.WhichOneof("outcome") == "released"
            taken = await asyncio.wait_for(retried, HANG_GUARD)
            assert taken.acquired.holder == "B"
            assert taken.acquired.token > granted.acquired.token
            stream.call.cancel()
