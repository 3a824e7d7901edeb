"""The event log on one Redis beyond the contract suite: commit order under concurrency,
several servers on one prefix, the scan bound, leases from before the log, and a Redis
that forgets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from fencing.errors import BackendUnavailableError
from lease_server.backends import redis as redis_backend
from lease_server.backends.redis import RedisBackend
from lease_server.leases import Grant, Scope, TransitionKind
from serving.redis_db import EventLogKeys, ResourceKeys, connect, parse_url
from tests.redis_server import RedisProcess, drop_prefix, unique_prefix

pytestmark = pytest.mark.redis

A, L, X = TransitionKind.ACQUIRED, TransitionKind.RELEASED, TransitionKind.EXPIRED


@pytest.fixture
async def two(redis_url: str) -> AsyncIterator[tuple[RedisBackend, RedisBackend]]:
    """Two backends on one key prefix: two lease-server processes."""
    prefix = unique_prefix()
    a, b = RedisBackend(redis_url, prefix=prefix), RedisBackend(redis_url, prefix=prefix)
    await a.open()
    await b.open()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()
        await drop_prefix(redis_url, prefix)


async def test_revisions_become_visible_in_order_under_concurrent_appends(
    two: tuple[RedisBackend, RedisBackend],
) -> None:
    """Rule 3: every page continues exactly at its cursor, and every reader sees 1..N."""
    a, b = two
    rounds, workers = 15, 8
    stop = asyncio.Event()

    async def churn(i: int) -> None:
        backend = (a, b)[i % 2]
        for _ in range(rounds):
            g = await backend.acquire(f"r{i}", f"w{i}", 5000, "")
            assert isinstance(g, Grant)
            await backend.renew(f"r{i}", g.token, "", 5000)
            await backend.release(f"r{i}", g.token, "")

    async def read(backend: RedisBackend) -> list[int]:
        seen: list[int] = []
        cursor = 0
        while True:
            done = stop.is_set()
            page = await backend.events_after(cursor, Scope(), 7)
            revisions = [e.revision for e in page.events]
            assert revisions == list(range(cursor + 1, cursor + 1 + len(revisions)))
            seen += revisions
            cursor = revisions[-1] if len(revisions) == 7 else max(cursor, page.head)
            if done and len(revisions) < 7:
                return seen
            await asyncio.sleep(0)

    readers = [asyncio.create_task(read(x)) for x in (a, b, a)]
    await asyncio.gather(*(churn(i) for i in range(workers)))
    stop.set()
    total = rounds * workers * 2  # acquire and release: a renewal is not an event
    assert await a.head_revision() == total
    for seen in await asyncio.gather(*readers):
        assert seen == list(range(1, total + 1))


async def test_another_servers_appends_are_heard_through_pubsub(
    two: tuple[RedisBackend, RedisBackend],
) -> None:
    a, b = two
    heard: asyncio.Queue[int] = asyncio.Queue()
    b.on_events(heard.put_nowait)
    g = await a.acquire("r", "a", 5000, "")
    assert isinstance(g, Grant)
    # Through pub/sub, or from the head b's listener reports once subscribed.
    assert await asyncio.wait_for(heard.get(), 5) == 1
    await a.release("r", g.token, "a")
    assert await asyncio.wait_for(heard.get(), 5) == 2
    await b.acquire("s", "b", 5000, "")
    assert heard.get_nowait() == 3  # own appends at once; the echo is not reported again
    await asyncio.sleep(0.3)
    assert heard.empty()


async def test_a_narrow_scope_stops_at_the_scan_bound_and_says_where(
    two: tuple[RedisBackend, RedisBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = two
    monkeypatch.setattr(redis_backend, "EVENTS_SCAN", 20)
    for i in range(50):
        await a.acquire(f"noise/{i}", "n", 5000, "")
    await a.acquire("jobs/1", "j", 5000, "")
    cursor, found = 0, []
    for _ in range(10):
        page = await a.events_after(cursor, Scope(prefix="jobs/"), 10)
        found += [(e.kind, e.resource, e.revision) for e in page.events]
        # Short of the limit: nothing else matches up to page.head, the next cursor.
        assert page.head >= cursor and not page.gap(cursor)
        cursor = page.head
        if cursor == 51:
            break
    assert found == [(A, "jobs/1", 51)]
    assert cursor == 51


async def test_a_lease_from_before_the_log_is_logged_once_renewed(
    two: tuple[RedisBackend, RedisBackend], redis_url: str
) -> None:
    """A lease granted by code without the log owes nothing until it is renewed; from
    then on its expiry is logged like any other."""
    a, _ = two
    client = await connect(parse_url(redis_url))
    try:
        keys = ResourceKeys(a.prefix, "old")
        await client.hset(keys.lease, mapping={"holder": "h", "token": "7", "request_id": ""})
        await client.pexpire(keys.lease, 5000)
        await client.set(keys.counter, "7")
        await a.renew("old", 7, "h", 150)
        await asyncio.sleep(0.2)
        swept = await a.expire_due(10)
        assert [(e.kind, e.resource, e.token, e.holder) for e in swept] == [(X, "old", 7, "h")]
        owed = EventLogKeys.shared(a.prefix).owed
        assert not await client.hexists(owed, "old")
    finally:
        await client.aclose()
    events = (await a.events_after(0, Scope(), 10)).events
    assert [(e.kind, e.token) for e in events] == [(X, 7)]  # the renewal itself is no event


async def test_a_redis_that_forgets_restarts_the_log_and_readers_resync(
    throwaway_redis: RedisProcess,
) -> None:
    """Without persistence a restart loses the log with everything else: a cursor from
    before is ahead of the new log, which the reader is told (RESYNC on the wire)."""
    backend = RedisBackend(throwaway_redis.url)
    await backend.open()
    heard: list[int] = []
    backend.on_events(heard.append)
    try:
        for i in range(3):
            await backend.acquire(f"r{i}", "a", 5000, "")
        assert await backend.head_revision() == 3
        forgotten = await backend.log_id()
        throwaway_redis.kill()
        await asyncio.to_thread(throwaway_redis.start)
        for _ in range(50):  # the pooled connection died with the server: nothing re-sends
            try:
                page = await backend.events_after(3, Scope(), 10)
                break
            except BackendUnavailableError:
                await asyncio.sleep(0.05)
        assert page.head == 0 and page.gap(3)
        # The feed's poll reads the head: from then on the new log's appends are news.
        assert await backend.head_revision() == 0
        await backend.acquire("r0", "b", 5000, "")
        assert heard[:3] == [1, 2, 3] and heard[-1] == 1
        # Once the new log passes the old cursor the head no longer tells them apart;
        # its identity does: a reader resuming with the old log's id gets RESYNC.
        for i in range(3):
            await backend.acquire(f"s{i}", "b", 5000, "")
        assert await backend.head_revision() > 3
        assert await backend.log_id() not in ("", forgotten)
    finally:
        await backend.close()
