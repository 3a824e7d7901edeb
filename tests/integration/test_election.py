"""Leader election (sync and asyncio twins) against a real lease server and guard.

The safety test deposes a leader behind its back (an operator releases its lease,
as an expiry during a pause would), elects another, and shows the deposed leader's
writes and proclamation refused at the guard; its control runs the same history
against a guard with fencing off and shows the new leader's address overwritten.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import (
    AcquireTimeoutError,
    AsyncGuardClient,
    AsyncLeaseClient,
    GuardClient,
    LeaseClient,
    LeaseLost,
    StaleTokenError,
)
from fencing.async_election import AsyncElection
from fencing.election import LEADER_KEY, Election, Leader
from fencing.testing import RunningServers, running_servers
from guard.fence import FenceMode
from tests.waiting import HANG_GUARD


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(f"sqlite:{tmp_path / 'l.db'}", f"sqlite:{tmp_path / 'g.db'}") as s:
        yield s


def clients(servers: RunningServers, holder: str) -> tuple[LeaseClient, GuardClient]:
    return LeaseClient(servers.lease_address, holder=holder), GuardClient(servers.guard_address)


def test_campaign_proclaim_resign_and_the_next_term(servers: RunningServers) -> None:
    (la, ga), (lb, gb) = clients(servers, "a"), clients(servers, "b")
    with la, ga, lb, gb:
        a, b = Election(la, ga, "sched", ttl=5), Election(lb, gb, "sched", ttl=5)
        assert a.leader() is None
        first = a.campaign("10.0.0.1:80")
        assert first.term == la.describe("sched").token
        assert b.leader() == Leader("sched", first.term, "a", "10.0.0.1:80")
        assert gb.describe_fence("sched") == first.term  # promised at campaign
        with pytest.raises(AcquireTimeoutError):
            b.campaign("10.0.0.2:80", timeout=0.2)
        first.proclaim("10.0.0.1:81")
        assert b.leader() == Leader("sched", first.term, "a", "10.0.0.1:81")
        ga.put(first, "plan", b"v1")  # the term fences the leader's own writes
        first.resign()
        assert a.leader() is None
        with b.campaign() as second:
            assert second.term > first.term
            # Elected, not yet proclaimed: the old term's value is not the leader's.
            assert a.leader() == Leader("sched", second.term, "b", None)
        assert a.leader() is None


def test_observe_yields_the_current_leader_then_each_change(servers: RunningServers) -> None:
    (la, ga), (lo, go) = clients(servers, "a"), clients(servers, "observer")
    with la, ga, lo, go:
        seen: queue.Queue[Leader | None] = queue.Queue()
        stream = Election(lo, go, "sched").observe()

        def follow() -> None:
            for leader in stream:
                seen.put(leader)
                if leader is not None and leader.value == "addr-3":  # the last change
                    stream.close()
                    return

        leader = Election(la, ga, "sched", ttl=5).campaign("addr-1")
        threading.Thread(target=follow, daemon=True).start()
        assert seen.get(timeout=HANG_GUARD) == Leader("sched", leader.term, "a", "addr-1")
        leader.proclaim("addr-2")
        assert seen.get(timeout=HANG_GUARD) == Leader("sched", leader.term, "a", "addr-2")
        leader.resign()
        assert seen.get(timeout=HANG_GUARD) is None
        again = Election(la, ga, "sched", ttl=5).campaign("addr-3")
        now = seen.get(timeout=HANG_GUARD)
        while now is not None and now.value is None:  # elected, then proclaimed
            now = seen.get(timeout=HANG_GUARD)
        assert now == Leader("sched", again.term, "a", "addr-3")
        again.resign()


def deposed_history(servers: RunningServers) -> tuple[list[str], Leader | None, bytes]:
    """A leads; its lease is released behind its back; B is elected and proclaims.
    A, still believing it leads, writes and proclaims. Returns what A's attempts
    raised, the leader B's observers then see, and the stored value."""
    (la, ga), (lb, gb) = clients(servers, "a"), clients(servers, "b")
    with la, ga, lb, gb:
        old = Election(la, ga, "sched", ttl=30).campaign("addr-A")
        lb.release("sched", old.term)  # what an expiry during a pause does
        new = Election(lb, gb, "sched", ttl=30).campaign("addr-B")
        refused: list[str] = []
        try:
            ga.put(old, LEADER_KEY, b"addr-A-late")  # the deposed leader's write
        except StaleTokenError as exc:
            refused.append(exc.reason)
        try:
            old.proclaim("addr-A-again")
        except (StaleTokenError, LeaseLost) as exc:
            refused.append(exc.reason)
        seen = Election(lb, gb, "sched").leader()
        record = gb.read("sched", LEADER_KEY)
        assert record is not None
        new.resign()
        old.resign()
    return refused, seen, record.value


def test_a_deposed_leaders_writes_are_refused(servers: RunningServers) -> None:
    refused, seen, value = deposed_history(servers)
    assert refused[0] == "STALE_TOKEN" and len(refused) == 2
    assert seen is not None and seen.holder == "b" and seen.value == "addr-B"
    assert value == b"addr-B"


def test_control_fencing_off_lets_a_deposed_leader_overwrite() -> None:
    with running_servers(mode=FenceMode.OFF) as servers:
        refused, seen, value = deposed_history(servers)
    assert "STALE_TOKEN" not in refused
    # The damage: the new leader's address is gone, overwritten by the deposed one.
    assert value != b"addr-B"
    assert seen is not None and seen.holder == "b" and seen.value is None


async def test_async_campaign_observe_and_resign(servers: RunningServers) -> None:
    async with (
        AsyncLeaseClient(servers.lease_address, holder="a") as la,
        AsyncGuardClient(servers.guard_address) as ga,
        AsyncLeaseClient(servers.lease_address, holder="b") as lb,
        AsyncGuardClient(servers.guard_address) as gb,
    ):
        a, b = AsyncElection(la, ga, "sched", ttl=5), AsyncElection(lb, gb, "sched", ttl=5)
        stream = b.observe()
        assert await anext(stream) is None  # nobody leads: said at once
        async with await a.campaign("addr-1") as leader:
            # The election first, then (a RENEWED later) its value; one read may see both.
            seen = await anext(stream)
            while seen is not None and seen.value is None:
                seen = await anext(stream)
            assert seen == Leader("sched", leader.term, "a", "addr-1")
            assert await b.leader() == Leader("sched", leader.term, "a", "addr-1")
            with pytest.raises(AcquireTimeoutError):
                await b.campaign(timeout=0.2)
            await ga.put(leader, "plan", b"v")
        assert await b.leader() is None
        second = await b.campaign("addr-2")
        assert second.term > leader.term
        await second.resign()
        await stream.aclose()


async def test_async_loss_cancels_the_campaigning_task(servers: RunningServers) -> None:
    async with (
        AsyncLeaseClient(servers.lease_address, holder="a") as la,
        AsyncGuardClient(servers.guard_address) as ga,
    ):
        lost: list[int] = []
        leadership = await AsyncElection(la, ga, "sched", ttl=1).campaign(
            "addr", on_lost=lambda lead: lost.append(lead.term)
        )
        await la.release("sched", leadership.term)  # deposed behind its back
        with pytest.raises(LeaseLost):
            async with leadership:
                await asyncio.sleep(HANG_GUARD)  # cancelled by the loss, not this sleep
        assert lost == [leadership.term]


async def async_deposed_history(servers: RunningServers) -> tuple[list[str], bytes]:
    """The deposed-leader history of :func:`deposed_history`, through the asyncio twin."""
    async with (
        AsyncLeaseClient(servers.lease_address, holder="a") as la,
        AsyncGuardClient(servers.guard_address) as ga,
        AsyncLeaseClient(servers.lease_address, holder="b") as lb,
        AsyncGuardClient(servers.guard_address) as gb,
    ):
        old = await AsyncElection(la, ga, "sched", ttl=30).campaign("addr-A")
        await lb.release("sched", old.term)  # what an expiry during a pause does
        new = await AsyncElection(lb, gb, "sched", ttl=30).campaign("addr-B")
        refused: list[str] = []
        try:
            await ga.put(old, LEADER_KEY, b"addr-A-late")
        except StaleTokenError as exc:
            refused.append(exc.reason)
        record = await gb.read("sched", LEADER_KEY)
        assert record is not None
        await new.resign()
        await old.resign()
    return refused, record.value


async def test_async_a_deposed_leaders_write_is_refused(servers: RunningServers) -> None:
    refused, value = await async_deposed_history(servers)
    assert refused == ["STALE_TOKEN"] and value == b"addr-B"


async def test_async_control_fencing_off_lets_a_deposed_leader_overwrite() -> None:
    with running_servers(mode=FenceMode.OFF) as off:
        refused, value = await async_deposed_history(off)
    assert refused == [] and value == b"addr-A-late"
