"""Sessions (one keepalive for every lease of a client) and AcquireMany, over real gRPC."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import ExitStack
from typing import Any

import grpc
import pytest

from fencing import AsyncLeaseClient, LeaseClient, LeaseHeldError, LeaseLost
from fencing.errors import AcquireTimeoutError, InvalidArgumentError
from fencing.testing import RunningServers
from fencing.v1 import lease_pb2, lease_pb2_grpc


def test_many_holds_share_one_session(servers: RunningServers) -> None:
    with LeaseClient(servers.lease_address, holder="many") as client, ExitStack() as stack:
        leases = [stack.enter_context(client.hold(f"s{i}", ttl=0.6)) for i in range(40)]
        time.sleep(1.5)  # two and a half ttls: every lease lives only if renewed
        for lease in leases:
            lease.check()
            assert client.describe(lease.resource).token == lease.token
        core = client.session().core
        # Renewed together: far fewer calls than leases times renewals.
        assert core.renewals >= 40 * 2
        assert core.calls <= 12
    with LeaseClient(servers.lease_address) as other:
        assert not any(other.describe(f"s{i}").held for i in range(40))


def test_hold_many_acquires_all_or_nothing(servers: RunningServers) -> None:
    with (
        LeaseClient(servers.lease_address, holder="one") as one,
        LeaseClient(servers.lease_address, holder="two") as two,
    ):
        with one.hold_many([f"m{i}" for i in range(100)], ttl=0.6) as held:
            assert [lease.resource for lease in held] == [f"m{i}" for i in range(100)]
            tokens = {lease.resource: lease.token for lease in held}
            with pytest.raises(LeaseHeldError) as refused:
                two.acquire_many(["free-1", "m50", "free-2"], ttl=5, timeout=0)
            assert refused.value.resource == "m50"
            assert not one.describe("free-1").held
            time.sleep(1.2)
            assert all(one.describe(r).token == t for r, t in tokens.items())
        assert not any(one.describe(f"m{i}").held for i in range(100))
        again = two.acquire_many(["m1", "m2"], ttl=5)
        assert all(lease.token > tokens[lease.resource] for lease in again)
        two.release_many(again)


def test_acquire_many_waits_for_a_release(servers: RunningServers) -> None:
    with (
        LeaseClient(servers.lease_address, holder="one") as one,
        LeaseClient(servers.lease_address, holder="two") as two,
    ):
        blocker = one.acquire("w2", ttl=5)
        timer = threading.Timer(0.3, blocker.release)
        timer.start()
        started = time.monotonic()
        got = two.acquire_many(["w1", "w2", "w3"], ttl=5, timeout=5)
        assert time.monotonic() - started >= 0.25
        assert [lease.resource for lease in got] == ["w1", "w2", "w3"]
        timer.join()
        with pytest.raises(AcquireTimeoutError):
            one.acquire_many(["w3"], ttl=5, timeout=0.2)


def test_overlapping_sets_in_opposite_orders_both_get_through(servers: RunningServers) -> None:
    """No deadlock: each caller holds nothing while it waits, so both finish."""
    order_a = [f"o{i}" for i in range(10)]
    order_b = [*reversed(order_a[3:]), "o-extra"]
    finished: list[str] = []

    def worker(name: str, resources: list[str]) -> None:
        with LeaseClient(servers.lease_address, holder=name) as client:
            for _ in range(5):
                leases = client.acquire_many(resources, ttl=5, timeout=20)
                client.release_many(leases)
        finished.append(name)

    threads = [
        threading.Thread(target=worker, args=("a", order_a)),
        threading.Thread(target=worker, args=("b", order_b)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(finished) == ["a", "b"]


def test_the_session_loses_a_taken_lease_alone(servers: RunningServers) -> None:
    with (
        LeaseClient(servers.lease_address, holder="mine") as mine,
        LeaseClient(servers.lease_address, holder="thief") as thief,
        ExitStack() as stack,
    ):
        keep = stack.enter_context(mine.hold("keep", ttl=0.6))
        taken = mine.acquire("taken", ttl=0.6)
        mine.session().add(taken)  # kept by the session like a held lease
        thief.release("taken", taken.token)  # anyone knowing the token may release
        thief.acquire("taken", ttl=5)
        assert taken.lost.wait(2)
        keep.check()
        time.sleep(0.5)
        keep.check()


def test_losing_the_session_loses_every_lease(servers: RunningServers) -> None:
    client = LeaseClient(servers.lease_address, holder="cut", rpc_timeout=0.3)
    try:
        leases = client.acquire_many([f"c{i}" for i in range(5)], ttl=0.5)
        for lease in leases:
            client.session().add(lease)
        servers.call(servers.lease.built.server.stop(0))
        for lease in leases:
            assert lease.lost.wait(3), lease
    finally:
        client.close()


def test_a_server_without_renew_many_gets_one_renew_per_lease(
    servers: RunningServers,
) -> None:
    class Unimplemented(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNIMPLEMENTED

        def details(self) -> str:
            return "no RenewMany here"

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise Unimplemented()

    with LeaseClient(servers.lease_address, holder="old") as client:
        client._stub.RenewMany = refuse
        # Past its ttl, so the lease is still held only if the session renewed it one
        # by one; a ttl of seconds leaves a loaded machine room for each renewal.
        with client.hold("legacy", ttl=1.5) as lease:
            time.sleep(2.0)
            lease.check()
        assert client.session()._one_by_one


def test_batch_limits_are_checked(servers: RunningServers) -> None:
    with grpc.insecure_channel(servers.lease_address) as channel:
        stub = lease_pb2_grpc.LeaseServiceStub(channel)
        for request in (
            lease_pb2.AcquireManyRequest(resources=["a", "a"], holder="h", ttl_ms=1000),
            lease_pb2.AcquireManyRequest(resources=[], holder="h", ttl_ms=1000),
        ):
            with pytest.raises(grpc.RpcError) as err:
                stub.AcquireMany(request, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        renewals = [lease_pb2.RenewRequest(resource="x", token=1, ttl_ms=1000)] * 2
        with pytest.raises(grpc.RpcError) as err:
            stub.RenewMany(lease_pb2.RenewManyRequest(renewals=renewals), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with LeaseClient(servers.lease_address) as client, pytest.raises(InvalidArgumentError):
        client.acquire_many(["x"] * 1001, ttl=1)


async def test_async_twin_holds_many_with_one_session(servers: RunningServers) -> None:
    async with AsyncLeaseClient(servers.lease_address, holder="aio") as client:
        async with client.hold_many([f"a{i}" for i in range(30)], ttl=0.6) as held:
            async with client.hold("a-single", ttl=0.6) as single:
                await asyncio.sleep(1.3)
                single.check()
                for lease in held:
                    lease.check()
            assert client.session().core.calls <= 10
        state = await client.describe("a3")
        assert not state.held
        with pytest.raises(LeaseLost):
            async with client.hold_many(["b1", "b2"], ttl=0.5) as held:
                await client.release(held[0].resource, held[0].token)
                await asyncio.sleep(0.6)
