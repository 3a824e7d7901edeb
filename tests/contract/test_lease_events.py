"""The event-log contract of lease backends (rules in lease_server/backends/base.py).

Runs on every backend of tests/backends.py that keeps one event log for all
resources, and skips, naming it and why, each one that does not: a Redis Cluster
keeps one per resource (tests/contract/test_resource_events.py). Tokens are
compared to what was granted, never to 1, 2, ...: some backends hand out sparse
tokens.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, cast

import pytest

from fencing.errors import LeaseLost
from lease_server.backends.base import (
    EventLog,
    LeaseBackend,
    LeaseBatches,
    event_log_of,
    resource_log_of,
)
from lease_server.leases import Grant, LoggedEvent, RenewItem, Scope, TransitionKind
from tests.backends import LEASE_BACKENDS, TimeControl


class Logged(LeaseBackend, EventLog, Protocol):
    """A lease backend that keeps an event log (for typing the tests below)."""


Pair = tuple[Logged, TimeControl]
ALL = Scope()


@pytest.fixture
def logged(lease_backend: tuple[LeaseBackend, TimeControl]) -> Pair:
    backend, time = lease_backend
    if resource_log_of(backend) is not None:
        pytest.skip(
            f"the {backend.name} lease backend keeps one log per resource here (Redis "
            "Cluster: no global log can be appended atomically with every slot's keys); "
            "tests/contract/test_resource_events.py holds it to the rules per resource"
        )
    if event_log_of(backend) is None:
        pytest.skip(f"the {backend.name} lease backend keeps no event log")
    return cast(Any, backend), time


A, L, X = TransitionKind.ACQUIRED, TransitionKind.RELEASED, TransitionKind.EXPIRED


async def grant(
    backend: LeaseBackend, resource: str, holder: str = "a", ttl_ms: int = 1000
) -> Grant:
    outcome = await backend.acquire(resource, holder, ttl_ms, "")
    assert isinstance(outcome, Grant), outcome
    return outcome


async def log(backend: Logged, after: int = 0, scope: Scope = ALL) -> list[LoggedEvent]:
    return list((await backend.events_after(after, scope, 10_000)).events)


def kinds(events: list[LoggedEvent]) -> list[tuple[TransitionKind, str, int]]:
    return [(e.kind, e.resource, e.token) for e in events]


async def test_an_empty_log(logged: Pair) -> None:
    backend, _ = logged
    assert await backend.head_revision() == 0
    page = await backend.events_after(0, ALL, 10)
    assert page.events == () and page.head == 0 and page.compacted_through == 0
    assert not page.gap(0)


async def test_the_log_keeps_one_identity_and_another_log_has_another(
    logged: Pair, request: pytest.FixtureRequest
) -> None:
    """Rule 5: a resume cursor is checked against the log it came from."""
    backend, _ = logged
    identity = await backend.log_id()
    assert identity
    g = await grant(backend, "r")
    await backend.release("r", g.token, "a")
    await backend.prune_events(keep=0)
    assert await backend.log_id() == identity  # appends and pruning keep the log's id
    async with LEASE_BACKENDS[request.node.callspec.params["lease_backend"]]() as (other, _):
        assert await cast(Logged, other).log_id() not in ("", identity)


async def test_acquire_and_release_append_in_order_and_a_renewal_appends_nothing(
    logged: Pair,
) -> None:
    backend, time = logged
    heard: list[int] = []
    backend.on_events(heard.append)
    g = await grant(backend, "r", "a", ttl_ms=1000)
    await time.sleep(100)
    await backend.renew("r", g.token, "a", 2000)
    # A renewal is not an event: the head (a follower's fence) does not move.
    assert await backend.head_revision() == 1 and heard == [1]
    assert isinstance(backend, LeaseBatches)
    assert await backend.renew_many([RenewItem("r", g.token, "a", 2000)]) == [
        Grant("r", "a", g.token, 2000)
    ]
    assert await backend.head_revision() == 1 and heard == [1]
    await backend.release("r", g.token, "a")
    events = await log(backend)
    assert kinds(events) == [(A, "r", g.token), (L, "r", g.token)]
    assert [e.revision for e in events] == [1, 2]
    assert [e.holder for e in events] == ["a", "a"]
    assert events[0].ttl_ms == 1000 and events[1].ttl_ms == 0
    assert await backend.head_revision() == 2 and heard == [1, 2]


async def test_refusals_and_replays_append_nothing(logged: Pair) -> None:
    backend, _ = logged
    first = await backend.acquire("r", "a", 1000, "req")
    assert isinstance(first, Grant)
    await backend.acquire("r", "b", 1000, "")  # held
    await backend.acquire("r", "a", 1000, "req")  # replayed
    with pytest.raises(LeaseLost):
        await backend.renew("r", first.token + 1, "a", 1000)
    with pytest.raises(LeaseLost):
        await backend.release("r", first.token, "b")
    assert kinds(await log(backend)) == [(A, "r", first.token)]
    assert await backend.head_revision() == 1


async def test_takeover_of_an_expired_lease_appends_expired_then_acquired(
    logged: Pair,
) -> None:
    backend, time = logged
    old = await grant(backend, "r", "a", ttl_ms=200)
    await time.sleep(250)
    new = await grant(backend, "r", "b")
    events = await log(backend)
    assert kinds(events) == [(A, "r", old.token), (X, "r", old.token), (A, "r", new.token)]
    assert events[1].holder == "a" and events[2].holder == "b"
    # The takeover already ended token 1: the sweeper finds nothing more to expire.
    assert await backend.expire_due(100) == []


async def test_sweeper_expires_each_lease_exactly_once(logged: Pair) -> None:
    backend, time = logged
    x = await grant(backend, "x", ttl_ms=200)
    y = await grant(backend, "y", ttl_ms=5000)
    await time.sleep(250)
    first, second = await asyncio.gather(backend.expire_due(100), backend.expire_due(100))
    swept = first + second
    assert kinds(swept) == [(X, "x", x.token)]
    assert await backend.expire_due(100) == []
    info = await backend.describe("x")
    assert not info.held and info.last_token == x.token
    assert (await backend.describe("y")).held
    # After the sweep a takeover appends only its ACQUIRED, and tokens still grow.
    x2 = await grant(backend, "x", "b")
    assert x2.token > x.token
    assert kinds(await log(backend)) == [
        (A, "x", x.token),
        (A, "y", y.token),
        (X, "x", x.token),
        (A, "x", x2.token),
    ]


async def test_expire_due_respects_its_limit(logged: Pair) -> None:
    backend, time = logged
    for name in ("a", "b", "c"):
        await grant(backend, name, ttl_ms=100)
    await time.sleep(150)
    assert len(await backend.expire_due(2)) == 2
    assert len(await backend.expire_due(2)) == 1
    assert await backend.expire_due(2) == []


async def test_scope_selects_a_resource_or_a_prefix(logged: Pair) -> None:
    backend, _ = logged
    for name in ("jobs/1", "jobs/2", "jobsx", "other", "jobs%"):
        await grant(backend, name)
    assert [e.resource for e in await log(backend, scope=Scope(resource="jobs/2"))] == ["jobs/2"]
    by_prefix = await log(backend, scope=Scope(prefix="jobs/"))
    assert [e.resource for e in by_prefix] == ["jobs/1", "jobs/2"]
    # No wildcards: "%" and "_" are plain characters.
    assert [e.resource for e in await log(backend, scope=Scope(prefix="jobs%"))] == ["jobs%"]
    assert [e.resource for e in await log(backend, scope=Scope(prefix="job_"))] == []
    assert len(await log(backend, scope=Scope(prefix=""))) == 5


async def test_pages_follow_the_cursor(logged: Pair) -> None:
    backend, _ = logged
    for i in range(5):
        await grant(backend, f"r{i}")
    page = await backend.events_after(0, ALL, 2)
    assert [e.revision for e in page.events] == [1, 2] and page.head == 5
    page = await backend.events_after(2, ALL, 2)
    assert [e.revision for e in page.events] == [3, 4]
    page = await backend.events_after(4, ALL, 2)
    assert [e.revision for e in page.events] == [5]
    # A filtered page shorter than the limit covers everything up to head.
    page = await backend.events_after(0, Scope(resource="r1"), 2)
    assert [e.revision for e in page.events] == [2] and page.head == 5


async def test_pruning_keeps_the_newest_and_reports_the_gap(logged: Pair) -> None:
    backend, _ = logged
    for i in range(6):
        await grant(backend, f"r{i}")
    assert await backend.prune_events(keep=4) == 2
    assert await backend.prune_events(keep=4) == 0
    page = await backend.events_after(0, ALL, 100)
    assert [e.revision for e in page.events] == [3, 4, 5, 6]
    assert page.compacted_through == 2
    assert page.gap(0) and page.gap(1) and not page.gap(2) and not page.gap(6)
    assert page.gap(7)  # a cursor from the future: another or a reset backend
    # Revisions are never reused, even when everything was pruned.
    assert await backend.prune_events(keep=0) == 4
    await grant(backend, "later")
    page = await backend.events_after(6, ALL, 100)
    assert [e.revision for e in page.events] == [7] and page.compacted_through == 6


async def test_listeners_hear_each_append(logged: Pair) -> None:
    backend, time = logged
    heard: list[int] = []
    backend.on_events(heard.append)
    g = await grant(backend, "r", ttl_ms=200)
    await backend.acquire("r", "b", 1000, "")  # refused: nothing to hear
    await time.sleep(250)
    await backend.expire_due(10)
    await grant(backend, "r", "b")
    with pytest.raises(LeaseLost):
        await backend.release("r", g.token, "a")
    assert heard == [1, 2, 3]


async def test_sqlite_servers_sharing_a_file_share_one_log(tmp_path: object) -> None:
    """Two backend objects on one file stand for two lease-server processes."""
    from pathlib import Path

    from lease_server.backends.sqlite import SQLiteBackend
    from lease_server.clock import ManualClock

    assert isinstance(tmp_path, Path)
    clock = ManualClock()
    one, two = (SQLiteBackend(tmp_path / "leases.db", clock) for _ in range(2))
    await one.open()
    await two.open()
    try:
        await grant(one, "r", "a", ttl_ms=200)
        await grant(two, "s", "b", ttl_ms=200)
        clock.advance(250)
        swept = await asyncio.gather(*(b.expire_due(100) for b in (one, two, one, two)))
        assert sorted(kinds([e for batch in swept for e in batch])) == [(X, "r", 1), (X, "s", 1)]
        assert await log(one) == await log(two)
        assert [e.revision for e in await log(one)] == [1, 2, 3, 4]
        identity = await one.log_id()
        assert await two.log_id() == identity
    finally:
        await one.close()
        await two.close()
    # The log and its revisions survive a restart.
    again = SQLiteBackend(tmp_path / "leases.db", clock)
    await again.open()
    try:
        assert await again.head_revision() == 4
        assert await again.log_id() == identity
        await grant(again, "r", "c")
        assert [e.revision for e in await log(again, after=4)] == [5]
    finally:
        await again.close()
