"""The lease clients' transports over real gRPC, both SDK twins: the lease stream by
default, the unary fallback against a server without ``Session`` (an older server,
remembered per client), a stream broken mid-acquire (a real proxy reset), a goaway,
a draining server, and the server's in-flight limit."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest

from chaos.proxy import ThreadedFaultProxy
from fencing import AsyncLeaseClient, LeaseClient
from fencing.client import _lease_stream
from fencing.errors import (
    AcquireTimeoutError,
    BackendUnavailableError,
    DeadlineExceededError,
    InvalidArgumentError,
    ResourceExhaustedError,
)
from fencing.testing import RunningServers
from fencing.v1 import lease_pb2_grpc
from lease_server.backends import open_backend
from lease_server.server import SERVICE_NAME, lease_services
from serving.server import Service, build_server
from tests.integration.conftest import LeaseClientFactory
from tests.waiting import HANG_GUARD, eventually


def wait_until(check: Callable[[], bool], timeout: float = HANG_GUARD) -> None:
    """Poll ``check`` until it is true (from a blocking test); fail after ``timeout``."""
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "condition still false"
        time.sleep(0.01)


def stub_of(client: Any) -> Any:
    """The lease client's stub (the async twin sits behind the blocking adapter)."""
    return getattr(client, "client", client)._stub


def sessions(servers: RunningServers) -> Any:
    return servers.lease.service.sessions


class _NoSession(grpc.GenericRpcHandler):
    """The service's handlers without ``Session``: gRPC answers UNIMPLEMENTED, as a
    server built before the stream does."""

    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        if details.method.endswith("/Session"):
            return None
        return self._inner.service(details)


class _WithoutSession:
    """A server seen by the generated registrar: it registers every method but Session."""

    def __init__(self, server: Any) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(tuple(_NoSession(h) for h in handlers))

    def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
        kept = {method: h for method, h in handlers.items() if method != "Session"}
        self._server.add_registered_method_handlers(name, kept)


@contextmanager
def older_server(servers: RunningServers) -> Iterator[str]:
    """A real lease server (memory backend) without the Session method; its address."""

    def register(servicer: Any, server: Any) -> None:
        without: Any = _WithoutSession(server)
        lease_pb2_grpc.add_LeaseServiceServicer_to_server(servicer, without)

    async def start() -> Any:
        service, _ = lease_services(open_backend("memory://"))
        built = await build_server("127.0.0.1:0", [Service(SERVICE_NAME, service, register)])
        await built.server.start()
        return service, built

    service, built = servers.call(start())
    try:
        yield f"127.0.0.1:{built.port}"
    finally:
        service.waiters.close()
        service.close()
        servers.call(built.server.stop(0))


def test_lease_calls_go_on_one_stream_per_client(
    servers: RunningServers, lease_client: LeaseClientFactory
) -> None:
    client = lease_client(holder="streamer", transport="auto")
    lease = client.acquire("one", ttl=5)
    with client.hold("two", ttl=0.6) as held:
        time.sleep(1.0)  # renewed by the session, on the stream
        held.check()
    lease.release()
    assert sessions(servers).open_streams == 1
    assert not stub_of(client).unary_only


def test_the_unary_transport_opens_no_stream(
    servers: RunningServers, lease_client: LeaseClientFactory
) -> None:
    client = lease_client(holder="unary", transport="unary")
    with client.hold("plain", ttl=5) as lease:
        assert lease.token == 1
    assert sessions(servers).open_streams == 0


def test_a_server_without_session_gets_unary_calls_and_is_remembered(
    servers: RunningServers, lease_client: LeaseClientFactory
) -> None:
    with older_server(servers) as address:
        client = lease_client(target=address, holder="old", transport="auto")
        with client.hold("legacy", ttl=0.6) as lease:
            time.sleep(1.0)  # renewals fall back too
            lease.check()
        assert stub_of(client).unary_only
        other = client.acquire("other", ttl=5)
        assert other.token == 1
        client.release("other", other.token)
        assert client.describe("legacy").last_token == 1
        assert not client.describe("other").held


def test_the_stream_transport_refuses_a_server_without_session(
    servers: RunningServers, lease_client: LeaseClientFactory
) -> None:
    with older_server(servers) as address:
        client = lease_client(target=address, holder="strict", transport="stream")
        with pytest.raises(grpc.RpcError) as refused:
            client.acquire("x", ttl=5)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert not client.describe("x").held


def test_an_unknown_transport_names_the_field(lease_client: LeaseClientFactory) -> None:
    with pytest.raises(InvalidArgumentError) as bad:
        lease_client(transport="carrier-pigeon")
    assert bad.value.field == "transport"


def test_a_stream_cut_after_the_grant_gets_the_same_lease_on_retry(
    servers: RunningServers, lease_client: LeaseClientFactory, leases: LeaseClient
) -> None:
    """The grant is made while its reply is held in the proxy, then every connection is
    reset: the acquire retries on a new stream with the same request id and gets the
    lease already granted. A retry with a new request id would wait for that grant's
    ttl (10 s) and run out of its 5 s timeout."""
    first = leases.acquire("cut", ttl=30)
    host, port = servers.lease_address.rsplit(":", 1)
    with ThreadedFaultProxy(host, int(port)) as proxy:
        waiter = lease_client(target=proxy.target, holder="waiter")
        waiter.describe("cut")  # the channel is up
        got: list[Any] = []
        failed: list[BaseException] = []

        def wait() -> None:
            try:
                got.append(waiter.acquire("cut", ttl=10, timeout=5))
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        wait_until(lambda: servers.lease.service.waiters.waiting("cut") == 1)
        proxy.half_open("upstream")  # replies are held from now on
        first.release()
        wait_until(lambda: leases.describe("cut").holder == "waiter")
        proxy.reset()
        proxy.heal()
        thread.join(10)
    assert not failed, failed
    assert got[0].token == 2
    state = leases.describe("cut")
    assert (state.holder, state.token, state.last_token) == ("waiter", 2, 2)


def test_a_goaway_moves_new_calls_and_lets_the_waiting_acquire_finish(
    servers: RunningServers, lease_client: LeaseClientFactory
) -> None:
    holder = lease_client(holder="holder", transport="unary")  # no stream of its own
    held = holder.acquire("moved", ttl=30)
    client = lease_client(holder="mover", transport="stream")
    client.describe("moved")
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(client.acquire("moved", ttl=5, timeout=20)))
    thread.start()
    wait_until(lambda: servers.lease.service.waiters.waiting("moved") == 1)
    (old,) = sessions(servers)._open
    # A goaway to this stream, without the server draining (as if the next stream
    # reached another server): the waiting acquire stays on it.
    servers.loop.call_soon_threadsafe(old.drain, "moving")
    wait_until(lambda: old.draining)
    other = client.acquire("elsewhere", ttl=5)  # a new call: on a new stream
    assert other.token == 1
    assert sessions(servers).open_streams == 2
    assert not got
    held.release()
    thread.join(10)
    assert got and got[0].token == 2  # finished on the old stream
    wait_until(lambda: sessions(servers).open_streams == 1)  # the old one ended


def test_a_draining_server_fails_new_calls_instead_of_moving_them_forever(
    servers: RunningServers, lease_client: LeaseClientFactory
) -> None:
    client = lease_client(holder="late", rpc_timeout=1.0, transport="stream")
    client.acquire("before", ttl=5)
    servers.loop.call_soon_threadsafe(sessions(servers).drain)
    wait_until(lambda: sessions(servers).draining)
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError):
        client.acquire("after", ttl=5, timeout=3)
    assert time.monotonic() - started < 30


def _waiting_acquires(
    servers: RunningServers, lease_client: LeaseClientFactory, leases: LeaseClient
) -> list[BaseException]:
    """Four acquires at once, on one client, of resources held elsewhere: what each ends with."""
    for i in range(4):
        leases.acquire(f"busy{i}", ttl=30)
    client = lease_client(holder="crowd", transport="stream")
    client.describe("busy0")
    outcomes: list[BaseException] = []
    lock = threading.Lock()

    def wait(i: int) -> None:
        try:
            client.acquire(f"busy{i}", ttl=5, timeout=1.0)
        except BaseException as exc:
            with lock:
                outcomes.append(exc)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


def test_the_servers_in_flight_limit_is_respected(
    servers: RunningServers, lease_client: LeaseClientFactory, leases: LeaseClient
) -> None:
    sessions(servers).max_in_flight = 2
    outcomes = _waiting_acquires(servers, lease_client, leases)
    assert len(outcomes) == 4
    assert all(isinstance(exc, AcquireTimeoutError) for exc in outcomes), outcomes


def test_control_a_client_ignoring_the_limit_is_refused(
    servers: RunningServers,
    lease_client: LeaseClientFactory,
    leases: LeaseClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_lease_stream, "max_in_flight_of", lambda headers: 1000)
    sessions(servers).max_in_flight = 2
    outcomes = _waiting_acquires(servers, lease_client, leases)
    assert any(isinstance(exc, ResourceExhaustedError) for exc in outcomes), outcomes


async def _give_up_waiting(servers: RunningServers) -> Any:
    """A stream acquire that waits in line, abandoned by its caller's timeout; the holder
    then releases, so the server grants the abandoned call. The resource's state 1 s on."""
    holder = AsyncLeaseClient(servers.lease_address, holder="holder", transport="unary")
    quitter = AsyncLeaseClient(servers.lease_address, holder="quitter", transport="stream")
    try:
        held = await holder.acquire("orphan", ttl=30)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await quitter.acquire("orphan", ttl=30)
        await held.release()
        await eventually(lambda: _last_token(holder, "orphan", 2), "the abandoned call was granted")
        await asyncio.sleep(1.0)
        return await holder.describe("orphan")
    finally:
        await quitter.aclose()
        await holder.aclose()


async def _last_token(client: AsyncLeaseClient, resource: str, token: int) -> bool:
    return (await client.describe(resource)).last_token >= token


async def test_a_grant_nobody_waits_for_any_more_is_released(servers: RunningServers) -> None:
    state = await _give_up_waiting(servers)
    assert not state.held, state


async def test_control_without_the_release_the_abandoned_grant_blocks_its_ttl(
    servers: RunningServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_lease_stream, "releases_of", lambda grants: [])
    state = await _give_up_waiting(servers)
    assert (state.held, state.holder) == (True, "quitter")


def test_a_call_without_a_reply_ends_at_its_deadline_and_the_stream_goes_on(
    servers: RunningServers, lease_client: LeaseClientFactory, leases: LeaseClient
) -> None:
    lease = leases.acquire("silent", ttl=30)
    host, port = servers.lease_address.rsplit(":", 1)
    with ThreadedFaultProxy(host, int(port)) as proxy:
        client = lease_client(target=proxy.target, holder="patient", rpc_timeout=0.5)
        assert client.renew("silent", lease.token, 30) == 30_000  # the stream is open
        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError):
            client.renew("silent", lease.token, 30)
        assert time.monotonic() - started < HANG_GUARD
        proxy.heal()  # the held reply now arrives, for a caller that has gone
        assert client.renew("silent", lease.token, 30) == 30_000
    assert leases.describe("silent").holder == "tester"
