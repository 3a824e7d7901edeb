"""The semaphore (sync and asyncio twins) against a real lease server and guard.

At most ``limit`` holders, each on its own slot lease with its own token; a waiter
gets the slot a holder leaves; a slot taken over behind its holder's back fences the
old holder's writes at the guard while the other slots' holders write on. The control
runs the same history against a guard with fencing off and shows the late write land.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import (
    AcquireTimeoutError,
    AsyncGuardClient,
    AsyncLeaseClient,
    AsyncSemaphore,
    GuardClient,
    InvalidArgumentError,
    LeaseClient,
    LeaseHeldError,
    LeaseLost,
    Semaphore,
    StaleTokenError,
    propagation,
)
from fencing.testing import RunningServers, running_servers
from guard.fence import FenceMode
from tests.waiting import HANG_GUARD


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(f"sqlite:{tmp_path / 'l.db'}", f"sqlite:{tmp_path / 'g.db'}") as s:
        yield s


def test_at_most_limit_holders_and_a_waiter_gets_the_freed_slot(servers: RunningServers) -> None:
    with (
        LeaseClient(servers.lease_address, holder="a") as la,
        LeaseClient(servers.lease_address, holder="b") as lb,
        LeaseClient(servers.lease_address, holder="c") as lc,
        GuardClient(servers.guard_address) as guard,
    ):
        sa, sb, sc = (Semaphore(x, "crawl", limit=2, ttl=5, fence=[guard]) for x in (la, lb, lc))
        a, b = sa.acquire(), sb.acquire()
        assert {a.resource, b.resource} == {"crawl/slot-0", "crawl/slot-1"}
        assert guard.describe_fence(a.resource) == a.token  # promised before returned
        with pytest.raises(LeaseHeldError):
            sc.acquire_nowait()
        with pytest.raises(AcquireTimeoutError):
            sc.acquire(timeout=0.2)
        assert [(s.resource, s.holder) for s in sc.holders()] == sorted(
            [(a.resource, "a"), (b.resource, "b")]
        )
        got: list[object] = []
        waiter = threading.Thread(target=lambda: got.append(sc.acquire(timeout=HANG_GUARD)))
        waiter.start()
        a.release()  # the watch event wakes the waiter
        waiter.join(HANG_GUARD)
        (c,) = got
        assert c.resource == a.resource and c.token > a.token  # type: ignore[attr-defined]
        assert {s.holder for s in sc.holders()} == {"b", "c"}


def test_hold_keeps_binds_and_releases_the_slot(servers: RunningServers) -> None:
    with LeaseClient(servers.lease_address) as leases:
        sem = Semaphore(leases, "jobs", limit=3, ttl=5)
        with sem.hold() as slot:
            assert propagation.current() is slot  # as leases.hold binds its lease
            (held,) = sem.holders()
            assert (held.resource, held.token) == (slot.resource, slot.token)
        assert sem.holders() == []  # released on exit
        assert leases.describe(slot.resource).last_token == slot.token


def test_a_taken_over_slot_fences_its_old_holder_only(servers: RunningServers) -> None:
    old_value, other_ok = slot_takeover_history(servers)
    assert isinstance(old_value, StaleTokenError)
    assert other_ok


def test_control_fencing_off_lets_the_old_slot_holder_write() -> None:
    with running_servers(mode=FenceMode.OFF) as servers:
        old_value, _ = slot_takeover_history(servers)
    assert old_value == "from-old"  # the damage: the former holder overwrote the new one's


def slot_takeover_history(servers: RunningServers) -> tuple[object, bool]:
    """Holders a and b; a's slot is released behind its back (as an expiry during a pause
    would be) and taken by c, who writes; then a writes late, b writes on. Returns what
    a's late write did (the error, or the value left in the slot) and b's success."""
    with (
        LeaseClient(servers.lease_address, holder="a") as la,
        LeaseClient(servers.lease_address, holder="b") as lb,
        LeaseClient(servers.lease_address, holder="c") as lc,
        GuardClient(servers.guard_address) as guard,
    ):
        sa, sb, sc = (Semaphore(x, "pool", limit=2, ttl=5, fence=[guard]) for x in (la, lb, lc))
        a, b = sa.acquire(), sb.acquire()
        lc.release(a.resource, a.token)  # an operator (or an expiry) takes a's slot away
        c = sc.acquire(timeout=HANG_GUARD)
        assert c.resource == a.resource
        guard.put(c, "state", b"from-new")
        outcome: object
        try:
            guard.put(a, "state", b"from-old")
        except StaleTokenError as exc:
            outcome = exc
        else:
            record = guard.read(a.resource, "state")
            outcome = record.value.decode() if record else None
        guard.put(b, "state", b"b-goes-on")  # the other slot is fenced apart
        return outcome, guard.read(b.resource, "state") is not None


def test_limit_is_checked_at_the_edge() -> None:
    leases = LeaseClient("127.0.0.1:1")
    try:
        for bad in (0, -1, 1001, 1.5, True):
            with pytest.raises(InvalidArgumentError) as info:
                Semaphore(leases, "x", limit=bad, ttl=5)  # type: ignore[arg-type]
            assert info.value.field == "limit"
    finally:
        leases.close()


async def test_async_twin_waits_holds_and_cancels_on_loss(servers: RunningServers) -> None:
    async with (
        AsyncLeaseClient(servers.lease_address, holder="a") as la,
        AsyncLeaseClient(servers.lease_address, holder="b") as lb,
        AsyncGuardClient(servers.guard_address) as guard,
    ):
        sa = AsyncSemaphore(la, "crawl", limit=1, ttl=5, fence=[guard])
        sb = AsyncSemaphore(lb, "crawl", limit=1, ttl=5, fence=[guard])
        first = await sa.acquire()
        assert first.resource == "crawl/slot-0"
        with pytest.raises(AcquireTimeoutError):
            await sb.acquire(timeout=0.2)
        waiting = asyncio.create_task(sb.acquire(timeout=HANG_GUARD))
        await asyncio.sleep(0.1)
        await first.release()
        second = await asyncio.wait_for(waiting, HANG_GUARD)
        assert second.token > first.token
        with pytest.raises(StaleTokenError):
            await guard.put(first, "k", b"late")
        await second.release()

        with pytest.raises(LeaseLost):
            async with sa.hold() as slot:
                assert [s.holder for s in await sa.holders()] == ["a"]
                await lb.release(slot.resource, slot.token)  # taken away behind its back
                await asyncio.sleep(HANG_GUARD)  # cancelled by the loss, not slept out
        assert await sa.holders() == []
