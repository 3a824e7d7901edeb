"""A lease's life from the grant to the exit, against real servers, for both SDK twins.

A lease granted after a long wait is alive for its ttl from the grant (not from the
send of the Acquire that waited); waiters in a convoy each get a whole lease; leaving
``hold`` releases what it may still hold, lost or not, within a short bound even
when the server is unreachable; an explicit release is not a loss. The blocking
tests run for both twins through tests/integration/flavors.py; what only asyncio
does (cancelling a ``hold_many`` body) is tested natively.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from chaos.proxy import ThreadedFaultProxy
from fencing import AsyncLeaseClient, GuardClient, LeaseClient, LeaseLost
from fencing._renewal import RenewalPolicy
from fencing.testing import RunningServers
from tests.integration.conftest import LeaseClientFactory

# slow: real waits past real ttls, a delay proxy (the default loop leaves it out).
pytestmark = pytest.mark.slow

HANG_GUARD = 30.0  # seconds a body would sleep if nobody cancelled it


def wait_until_waiting(servers: RunningServers, resource: str, n: int) -> None:
    """Block until ``n`` Acquire calls wait in the server's line for ``resource``."""
    waiters = servers.lease.service.waiters
    deadline = time.monotonic() + 20
    while waiters.waiting(resource) < n:
        assert time.monotonic() < deadline, f"never {n} waiters for {resource!r}"
        time.sleep(0.01)


@pytest.fixture
def proxy(servers: RunningServers) -> Iterator[ThreadedFaultProxy]:
    host, port = servers.lease_address.rsplit(":", 1)
    with ThreadedFaultProxy(host, int(port)) as p:
        yield p


def test_a_lease_granted_after_a_long_wait_lives_from_the_grant(
    servers: RunningServers,
    lease_client: LeaseClientFactory,
    leases: LeaseClient,
    guard: GuardClient,
) -> None:
    """The README's story scaled down: someone holds the resource for three of our
    ttls; our hold waits, then its body runs, writes through the guard, and leaves."""
    with lease_client(holder="other") as other:
        first = other.acquire("orders", ttl=3)
        start = time.monotonic()
        with leases.hold("orders", ttl=1, timeout=10) as lease:
            waited = time.monotonic() - start
            assert waited > 2.0  # it really waited for the other holder's lease to expire
            lease.check()  # alive on arrival
            assert lease.remaining() > 0.5
            assert lease.token > first.token
            guard.put(lease, "next-id", b"1")
            time.sleep(1.5)  # longer than the ttl: renewals keep it
            lease.check()
            guard.put(lease, "next-id", b"2")
        assert not lease.lost.is_set()
    state = leases.describe("orders")
    assert not state.held  # released on exit, not left to expire
    record = guard.read("orders", "next-id")
    assert record is not None and record.value == b"2" and record.written_by_token == lease.token


def test_a_convoy_of_waiters_each_gets_a_whole_lease_in_order(
    servers: RunningServers, lease_client: LeaseClientFactory, guard: GuardClient
) -> None:
    """N holders, each body longer than the ttl, queued on one resource: every one
    runs in the order it asked, none loses its lease, and together they take about
    N bodies (no ttl lost between them: each release hands over at once)."""
    n, ttl, body = 4, 0.6, 1.0
    entered: list[int] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        client = lease_client(holder=f"worker-{i}")
        try:
            with client.hold("convoy", ttl=ttl, timeout=60) as lease:
                with lock:
                    entered.append(i)
                deadline = time.monotonic() + body
                while time.monotonic() < deadline:
                    lease.check()
                    time.sleep(0.05)
                guard.put(lease, f"done-{i}", b"1")
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    start = time.monotonic()
    for i, t in enumerate(threads):
        t.start()
        if i > 0:  # the first holds it; each next one queues behind the ones before
            wait_until_waiting(servers, "convoy", i)
        else:
            while not entered:
                time.sleep(0.01)
    for t in threads:
        t.join(60)
    total = time.monotonic() - start
    assert failures == []
    assert entered == list(range(n))
    assert total < n * body * 1.5  # about N bodies; a lost lease would add a ttl each
    for i in range(n):
        assert guard.read("convoy", f"done-{i}") is not None


@pytest.mark.parametrize("latency", [0.2, 0.6])
def test_behind_a_delay_the_deadline_starts_at_the_grant_and_ends_before_the_expiry(
    servers: RunningServers,
    lease_client: LeaseClientFactory,
    proxy: ThreadedFaultProxy,
    latency: float,
) -> None:
    """A real server behind a proxy that delays every byte both ways: the request
    arrives late, waits in line, and its reply arrives late. The local deadline must
    still end before the server's expiry (read with a direct Describe), and the lease
    must be alive on arrival. With 0.6 s each way the reply comes so late that the
    first renewal is due on arrival: the grant is renewed before it is handed out."""
    ttl = 2.0
    policy = RenewalPolicy()
    with lease_client(holder="other") as other, lease_client(holder="direct") as direct:
        other.acquire("delayed", ttl=2.5)  # we wait about 2.5 s in line: longer than our ttl
        proxy.latency(latency * 1000)
        client = lease_client(target=proxy.target)
        sent = time.monotonic()
        lease = client.acquire("delayed", ttl=ttl, timeout=20)
        arrived = time.monotonic()
        deadline = time.monotonic() + lease.remaining()
        asked = time.monotonic()
        state = direct.describe("delayed")
        answered = time.monotonic()
    assert state.held and state.token == lease.token
    # The server's expiry lies within [asked, answered] + remaining_ms on our clock.
    expiry_earliest = asked + state.remaining_ms / 1000
    expiry_latest = answered + state.remaining_ms / 1000
    assert deadline <= expiry_earliest  # safe
    # Alive: the wait in line is not counted; what it may lose is the skew allowance on
    # the wait and the round trip (the renewal's, when one was due on arrival).
    skew_allowance = policy.margin_ratio * 2.5
    assert deadline - arrived > ttl - policy.margin(ttl) - skew_allowance - 2 * latency - 0.3
    # Controls, from the same timeline. The old rule (send + ttl - margin) counts the
    # wait against the lease: lost on arrival.
    assert sent + ttl - policy.margin(ttl) < arrived
    if latency < ttl / 3:
        # Starting at the reply instead (arrival + ttl - margin) outlives the expiry by
        # about the reply's delay: unsafe.
        assert arrived + ttl - policy.margin(ttl) > expiry_latest
    proxy.heal()


def test_an_explicit_release_then_exit_is_not_a_loss(leases: LeaseClient) -> None:
    with leases.hold("r", ttl=1) as lease:
        lease.release()
        assert not lease.lost.is_set()
        assert lease.released
        assert not leases.describe("r").held
        with pytest.raises(LeaseLost, match="released"):
            lease.check()  # not ours to act on any more
        time.sleep(1.2)  # past the ttl: nothing marks a released lease lost
        assert not lease.lost.is_set()
    assert not lease.lost.is_set()


def test_leaving_hold_releases_a_lease_it_believes_lost(
    servers: RunningServers, lease_client: LeaseClientFactory, proxy: ThreadedFaultProxy
) -> None:
    """Lost locally (renewals cannot get through until the local deadline) while the
    server still holds it: the exit sends the token-checked Release anyway, so the
    resource is free at once instead of at its expiry."""
    # A wide margin leaves time between the local deadline and the server's expiry.
    client = lease_client(
        target=proxy.target, rpc_timeout=0.2, policy=RenewalPolicy(margin_ratio=0.4)
    )
    with pytest.raises(LeaseLost), client.hold("lost-but-held", ttl=3) as lease:
        proxy.blackhole()
        assert lease.lost.wait(10)  # about 1.8 s after the grant: 1.2 s before its expiry
        proxy.heal()
    with lease_client(holder="watcher") as direct:
        state = direct.describe("lost-but-held")
    assert not state.held  # released on exit, not left to run out its ttl
    assert state.last_token == lease.token  # and nobody else took it meanwhile


def test_an_unreachable_server_does_not_hang_the_exit(
    servers: RunningServers, lease_client: LeaseClientFactory, proxy: ThreadedFaultProxy
) -> None:
    client = lease_client(target=proxy.target)  # the default bounds
    with client.hold("r", ttl=30) as lease:
        proxy.blackhole()
        start = time.monotonic()
    took = time.monotonic() - start
    assert took < 3.0  # the exit's release is bounded (2 s by default), not rpc_timeout (5 s)
    assert not lease.lost.is_set()  # the ttl has not run out: it was not lost, only unreleased
    proxy.heal()


def test_the_release_bound_is_an_option(
    servers: RunningServers, lease_client: LeaseClientFactory, proxy: ThreadedFaultProxy
) -> None:
    client = lease_client(target=proxy.target, release_timeout=0.3)
    with client.hold("r", ttl=30):
        proxy.blackhole()
        start = time.monotonic()
    assert time.monotonic() - start < 1.5
    proxy.heal()
    with pytest.raises(Exception, match="release_timeout"):
        lease_client(release_timeout=0)


# -- hold_many ------------------------------------------------------------------------------


def test_hold_many_explicit_release_then_exit_is_not_a_loss(servers: RunningServers) -> None:
    with LeaseClient(servers.lease_address) as client:
        with client.hold_many(["a", "b"], ttl=1) as held:
            held[0].release()
            assert not held[0].lost.is_set()
        assert not any(lease.lost.is_set() for lease in held)
        assert not client.describe("a").held and not client.describe("b").held


async def test_async_hold_many_explicit_release_then_exit_is_not_a_loss(
    servers: RunningServers,
) -> None:
    async with AsyncLeaseClient(servers.lease_address) as client:
        async with client.hold_many(["a", "b"], ttl=1) as held:
            await held[0].release()
            assert not held[0].lost.is_set()
        assert not any(lease.lost.is_set() for lease in held)
        assert not (await client.describe("a")).held
        assert not (await client.describe("b")).held


async def test_async_hold_many_cancels_its_body_on_loss(servers: RunningServers) -> None:
    reached_the_end = False
    async with (
        AsyncLeaseClient(servers.lease_address, holder="tester") as client,
        AsyncLeaseClient(servers.lease_address, holder="thief") as thief,
    ):
        with pytest.raises(LeaseLost) as lost:
            async with client.hold_many(["a", "b"], ttl=0.6) as held:
                await thief.release("b", held[1].token)  # freed behind our back
                await thief.acquire("b", ttl=10)
                await asyncio.sleep(HANG_GUARD)  # the next renewal is refused: cancelled here
                reached_the_end = True
        assert not reached_the_end
        assert isinstance(lost.value.__cause__, asyncio.CancelledError)
        assert lost.value.resource == "b"
        assert held[1].lost.is_set() and not held[0].lost.is_set()
        assert not (await client.describe("a")).held  # the live one was released on exit
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0


def test_hold_many_exit_releases_leases_it_believes_lost(
    servers: RunningServers, proxy: ThreadedFaultProxy
) -> None:
    policy = RenewalPolicy(margin_ratio=0.4)
    with (
        LeaseClient(proxy.target, rpc_timeout=0.2, policy=policy) as client,
        LeaseClient(servers.lease_address) as direct,
    ):
        with pytest.raises(LeaseLost), client.hold_many(["x", "y"], ttl=3) as held:
            proxy.blackhole()
            assert all(lease.lost.wait(10) for lease in held)
            proxy.heal()
        # Released on exit, well before the 3 s ttl would have freed them.
        assert not direct.describe("x").held and not direct.describe("y").held


async def test_async_hold_many_exit_releases_leases_it_believes_lost(
    servers: RunningServers, proxy: ThreadedFaultProxy
) -> None:
    """The asyncio twin of the test above: lost locally while the server still holds
    both, the exit sends their Release anyway (the body is cancelled at the loss)."""
    policy = RenewalPolicy(margin_ratio=0.4)
    async with (
        AsyncLeaseClient(proxy.target, rpc_timeout=0.2, policy=policy) as client,
        AsyncLeaseClient(servers.lease_address) as direct,
    ):
        with pytest.raises(LeaseLost):
            async with client.hold_many(["ax", "ay"], ttl=3) as held:
                proxy.blackhole()
                try:  # about 1.8 s after the grant: 1.2 s before their expiry
                    await asyncio.wait_for(held[0].lost.wait(), 10)
                finally:
                    proxy.heal()
        assert any(lease.lost.is_set() for lease in held)
        # Released on exit, well before the 3 s ttl would have freed them.
        assert not (await direct.describe("ax")).held
        assert not (await direct.describe("ay")).held


# -- async-native twins of the convoy and the long wait --------------------------------------


async def test_async_convoy_all_finish_in_order(servers: RunningServers) -> None:
    n, ttl, body = 4, 0.6, 1.0
    entered: list[int] = []
    first_in = asyncio.Event()
    clients = [AsyncLeaseClient(servers.lease_address, holder=f"w{i}") for i in range(n)]

    async def worker(i: int) -> None:
        async with clients[i].hold("aconvoy", ttl=ttl, timeout=60) as lease:
            entered.append(i)
            first_in.set()
            await asyncio.sleep(body)  # cancelled (LeaseLost) if the lease were lost
            lease.check()

    start = time.monotonic()
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(worker(i)))
        if i == 0:
            await first_in.wait()
        else:  # each next one queues behind the ones before
            await asyncio.to_thread(wait_until_waiting, servers, "aconvoy", i)
    await asyncio.gather(*tasks)
    total = time.monotonic() - start
    for client in clients:
        await client.aclose()
    assert entered == list(range(n))
    assert total < n * body * 1.5
