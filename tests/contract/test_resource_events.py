"""The per-resource event-log contract (``ResourceEventLog``, lease_server/backends/base.py).

A Redis Cluster cannot append one global log atomically with keys in every hash
slot, so it keeps one log per resource, in the resource's slot. The rules of the
global log hold per resource: same atomic step, revisions 1, 2, 3 ... of that
resource, in order, each expiry logged exactly once (by the takeover or by the
first read of the log), bounded retention reported as ``compacted_through``.
Runs on every backend of tests/backends.py that keeps per-resource logs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol, cast

import pytest

from fencing.errors import LeaseLost
from lease_server.backends.base import LeaseBackend, ResourceEventLog, resource_log_of
from lease_server.backends.redis import RedisBackend
from lease_server.leases import Grant, LoggedEvent, TransitionKind
from tests import redis_server
from tests.backends import LEASE_BACKENDS, TimeControl

PER_RESOURCE = ["redis-cluster"]


class Logged(LeaseBackend, ResourceEventLog, Protocol):
    """A lease backend that keeps one event log per resource."""


Pair = tuple[Logged, TimeControl]
A, L, X = TransitionKind.ACQUIRED, TransitionKind.RELEASED, TransitionKind.EXPIRED


@pytest.fixture(params=PER_RESOURCE)
async def logged(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    async with LEASE_BACKENDS[request.param]() as (backend, time):
        assert resource_log_of(backend) is not None, f"{request.param} keeps per-resource logs"
        yield cast(Any, backend), time


async def grant(
    backend: LeaseBackend, resource: str, holder: str = "a", ttl_ms: int = 1000
) -> Grant:
    outcome = await backend.acquire(resource, holder, ttl_ms, "")
    assert isinstance(outcome, Grant), outcome
    return outcome


async def log(backend: Logged, resource: str, after: int = 0) -> list[LoggedEvent]:
    return list((await backend.resource_events_after(resource, after, 10_000)).events)


def kinds(events: list[LoggedEvent]) -> list[tuple[TransitionKind, str, int]]:
    return [(e.kind, e.resource, e.token) for e in events]


async def test_an_empty_log(logged: Pair) -> None:
    backend, _ = logged
    assert await backend.resource_head("r") == 0
    page = await backend.resource_events_after("r", 0, 10)
    assert page.events == () and page.head == 0 and page.compacted_through == 0


async def test_each_resource_numbers_its_own_events(logged: Pair) -> None:
    backend, time = logged
    g = await grant(backend, "r", "a", ttl_ms=1000)
    other = await grant(backend, "s", "b")
    await time.sleep(50)
    await backend.renew("r", g.token, "a", 2000)
    assert await backend.resource_head("r") == 1  # a renewal is not an event
    await backend.release("r", g.token, "")
    events = await log(backend, "r")
    assert kinds(events) == [(A, "r", g.token), (L, "r", g.token)]
    assert [e.revision for e in events] == [1, 2]
    assert [e.holder for e in events] == ["a", "a"]
    assert [e.ttl_ms for e in events] == [1000, 0]
    assert await backend.resource_head("r") == 2
    assert kinds(await log(backend, "s")) == [(A, "s", other.token)]
    assert [e.revision for e in await log(backend, "s")] == [1]


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
    assert kinds(await log(backend, "r")) == [(A, "r", first.token)]


async def test_takeover_of_an_expired_lease_appends_expired_then_acquired(logged: Pair) -> None:
    backend, time = logged
    old = await grant(backend, "r", "a", ttl_ms=200)
    await time.sleep(250)
    new = await grant(backend, "r", "b")
    events = await log(backend, "r")
    assert kinds(events) == [(A, "r", old.token), (X, "r", old.token), (A, "r", new.token)]
    assert events[1].holder == "a" and events[2].holder == "b"


async def test_reading_the_log_settles_an_expiry_exactly_once(logged: Pair) -> None:
    backend, time = logged
    x = await grant(backend, "x", ttl_ms=200)
    live = await grant(backend, "y", ttl_ms=5000)
    before = await backend.resource_events_after("x", 0, 10)
    assert kinds(list(before.events)) == [(A, "x", x.token)]  # not expired yet: nothing owed
    await time.sleep(250)
    pages = await asyncio.gather(*(backend.resource_events_after("x", 1, 10) for _ in range(4)))
    # Every reader sees the expiry (whoever logged it): no one sees the log without it.
    for page in pages:
        assert kinds(list(page.events)) == [(X, "x", x.token)] and page.head == 2
    assert kinds(await log(backend, "y")) == [(A, "y", live.token)]
    x2 = await grant(backend, "x", "b")
    assert x2.token > x.token
    assert kinds(await log(backend, "x")) == [
        (A, "x", x.token),
        (X, "x", x.token),
        (A, "x", x2.token),
    ]


async def test_a_released_lease_owes_no_expiry(logged: Pair) -> None:
    backend, time = logged
    g = await grant(backend, "r", ttl_ms=200)
    await backend.release("r", g.token, "a")
    await time.sleep(250)
    assert kinds(await log(backend, "r")) == [(A, "r", g.token), (L, "r", g.token)]


async def test_pages_follow_the_cursor(logged: Pair) -> None:
    backend, _ = logged
    g = await grant(backend, "r", ttl_ms=5000)
    for _ in range(2):  # five events: a renewal would append none
        await backend.release("r", g.token, "a")
        g = await grant(backend, "r", ttl_ms=5000)
    page = await backend.resource_events_after("r", 0, 2)
    assert [e.revision for e in page.events] == [1, 2] and page.head == 5
    page = await backend.resource_events_after("r", 2, 2)
    assert [e.revision for e in page.events] == [3, 4]
    page = await backend.resource_events_after("r", 4, 2)
    assert [e.revision for e in page.events] == [5]
    assert not page.gap(4) and page.gap(6)  # a cursor from the future: resync


async def test_listeners_hear_each_append(logged: Pair) -> None:
    backend, time = logged
    heard: list[tuple[str, int]] = []
    backend.on_resource_events(lambda resource, head: heard.append((resource, head)))
    g = await grant(backend, "r", ttl_ms=200)
    await backend.acquire("r", "b", 1000, "")  # refused: nothing to hear
    await time.sleep(250)
    await backend.resource_events_after("r", 0, 10)  # logs the expiry
    await grant(backend, "s")
    with pytest.raises(LeaseLost):
        await backend.release("r", g.token, "a")
    # Own appends are heard at once and in order; a backend that also hears them back
    # from other processes' channel (pub/sub) may repeat one: callers keep the highest.
    assert list(dict.fromkeys(heard)) == [("r", 1), ("r", 2), ("s", 1)]


@pytest.fixture
async def small_logs() -> AsyncIterator[RedisBackend]:
    """A cluster backend whose per-resource logs keep only their newest 3 events."""
    url = redis_server.SERVERS.cluster_url()
    prefix = redis_server.unique_prefix()
    backend = RedisBackend(url, prefix=prefix, events_per_resource=3)
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()
        await redis_server.drop_prefix(url, prefix)


@pytest.mark.redis
async def test_each_log_keeps_its_newest_events_and_reports_the_gap(
    small_logs: RedisBackend,
) -> None:
    backend = small_logs
    g = await grant(backend, "r", ttl_ms=5000)
    for _ in range(2):  # five events
        await backend.release("r", g.token, "a")
        g = await grant(backend, "r", ttl_ms=5000)
    page = await backend.resource_events_after("r", 0, 100)
    assert [e.revision for e in page.events] == [3, 4, 5]
    assert page.compacted_through == 2 and page.head == 5
    assert page.gap(0) and page.gap(1) and not page.gap(2)
    other = await grant(backend, "s")  # another resource's log is untouched by r's trims
    page = await backend.resource_events_after("s", 0, 100)
    assert kinds(list(page.events)) == [(A, "s", other.token)] and page.compacted_through == 0


@pytest.mark.redis
async def test_the_global_log_api_is_refused(small_logs: RedisBackend) -> None:
    """On a cluster the backend is not an EventLog: its global calls say why."""
    from lease_server.backends.base import event_log_of
    from lease_server.leases import Scope

    assert event_log_of(small_logs) is None and small_logs.event_log_scope == "resource"
    with pytest.raises(RuntimeError, match="each resource keeps its own event log"):
        await small_logs.head_revision()
    with pytest.raises(RuntimeError, match="each resource keeps its own event log"):
        await small_logs.events_after(0, Scope(), 10)
    assert await small_logs.expire_due(10) == [] and await small_logs.prune_events(0) == 0
