"""Scripts pipelined on one Redis: one round trip, and a lost script cache costs nothing;
our clients speak RESP2.

The lease backend's steps (``lease_steps``) and the guard store's batched writes
(``write_batch``) send many script calls in one pipeline. redis-py asks ``SCRIPT
EXISTS`` before every pipeline that carries scripts, a second round trip each time;
:func:`serving.redis_db.run_pipelined` sends the ``EVALSHA`` calls as they are and, when
the server lost the scripts (a restart, ``SCRIPT FLUSH``), loads them and sends again the
calls that answered ``NOSCRIPT``, which did not run: each call runs exactly once.

A private Redis, so that its command counts are these tests' alone.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from fencing.types import Put
from guard.stores.base import BatchedWrite
from guard.stores.redis import RedisStore
from lease_server.backends.redis import RedisBackend
from lease_server.leases import AcquireItem, Grant, ReleaseItem, Scope
from serving.redis_db import run_pipelined, standalone_client
from tests.redis_server import RedisProcess
from tests.waiting import eventually

pytestmark = pytest.mark.redis


async def _calls(url: str) -> dict[str, int]:
    """Calls per command so far (``INFO commandstats``)."""
    client = Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


@pytest.fixture
def url(throwaway_redis: RedisProcess) -> str:
    return throwaway_redis.url


async def _flush_scripts(url: str) -> None:
    client = Redis.from_url(url)
    try:
        await client.script_flush()
    finally:
        await client.aclose()


async def test_lease_steps_go_in_one_round_trip_without_asking_for_the_scripts(url: str) -> None:
    backend = RedisBackend(url, prefix="p")
    await backend.open()
    try:
        await backend.lease_steps([AcquireItem("warm", "h", 60_000, "")])  # scripts loaded
        before = await _calls(url)
        outcomes = await backend.lease_steps(
            [AcquireItem(f"r{i}", "h", 60_000, "") for i in range(5)]
        )
        after = await _calls(url)
    finally:
        await backend.close()
    assert all(isinstance(o, Grant) for o in outcomes)
    assert after.get("evalsha", 0) - before.get("evalsha", 0) == 5
    assert after.get("script|exists", 0) == before.get("script|exists", 0)


async def test_control_redis_py_asks_for_the_scripts_before_each_pipeline(url: str) -> None:
    # What run_pipelined saves: the same pipeline of scripts through redis-py's own path.
    client = Redis.from_url(url)
    try:
        script = client.register_script("return 1")
        before = await _calls(url)
        pipe = client.pipeline(transaction=False)
        for _ in range(5):
            await script(keys=[], args=[], client=pipe)
        assert await pipe.execute() == [1] * 5
        after = await _calls(url)
    finally:
        await client.aclose()
    assert after["script|exists"] - before.get("script|exists", 0) == 1


async def test_after_the_scripts_are_lost_each_lease_step_runs_once(url: str) -> None:
    backend = RedisBackend(url, prefix="p")
    await backend.open()
    try:
        first = await backend.lease_steps([AcquireItem("a", "h", 60_000, "")])
        assert isinstance(first[0], Grant)
        await _flush_scripts(url)
        before = await _calls(url)
        outcomes = await backend.lease_steps(
            [
                ReleaseItem("a", first[0].token, "h"),
                AcquireItem("a", "other", 60_000, ""),
                AcquireItem("b", "h", 60_000, ""),
            ]
        )
        after = await _calls(url)
        state = await backend.describe("a")
        page = await backend.events_after(0, Scope(), 100)
    finally:
        await backend.close()
    released, granted, other = outcomes
    assert released is None
    # In order: the release, then the other holder's acquire of the freed resource.
    assert isinstance(granted, Grant) and granted.holder == "other"
    assert state.token == state.last_token == granted.token
    assert isinstance(other, Grant)
    # Once each: one event per call in the log (a second run would have logged again).
    assert [(e.kind.value, e.resource) for e in page.events] == [
        ("acquired", "a"),
        ("released", "a"),
        ("acquired", "a"),
        ("acquired", "b"),
    ]
    assert after["script|load"] > before.get("script|load", 0)


async def test_after_the_scripts_are_lost_each_batched_write_runs_once(url: str) -> None:
    store = RedisStore(url, prefix="g")
    await store.open()
    try:
        await _flush_scripts(url)
        verdicts = await store.write_batch(
            [
                BatchedWrite("w", 1, [Put("k", b"1")], idempotency_key="once"),
                BatchedWrite("w", 2, [Put("k", b"2")]),
            ]
        )
        record = await store.read("w", "k")
        again = await store.write_batch(
            [BatchedWrite("w", 2, [Put("k", b"3")], idempotency_key="once")]
        )
    finally:
        await store.close()
    assert [type(v).__name__ for v in verdicts] == ["StoreWriteResult", "StoreWriteResult"]
    assert record is not None and record.value == b"2" and record.written_by_token == 2
    # The key was applied once, by token 1: a replay names it, nothing is written again.
    assert getattr(again[0], "replayed", False)


async def test_an_error_reply_is_raised_as_it_was(url: str) -> None:
    client = Redis.from_url(url)
    try:
        good = client.register_script("return 1")
        bad = client.register_script("return redis.error_reply('nope')")
        with pytest.raises(Exception, match="nope"):
            await run_pipelined(client, [(good, [], []), (bad, [], [])])
    finally:
        await client.aclose()


def test_clients_speak_resp2_unless_the_url_asks(url: str) -> None:
    # RESP2 delivers pub/sub messages as plain replies; redis-py formats a debug line of
    # every RESP3 push, logged or not (the release and event listeners hear one per change).
    assert standalone_client(url).connection_pool.connection_kwargs["protocol"] == 2
    asked = standalone_client(f"{url}?protocol=3")
    assert asked.connection_pool.connection_kwargs["protocol"] == 3


async def test_the_release_listener_hears_releases_over_resp2(url: str) -> None:
    backend = RedisBackend(url, prefix="p")
    other = RedisBackend(url, prefix="p")
    await backend.open()
    await other.open()
    heard: list[str] = []
    try:
        other.on_release(heard.append)
        (grant,) = await backend.lease_steps([AcquireItem("x", "h", 60_000, "")])
        assert isinstance(grant, Grant)
        await backend.lease_steps([ReleaseItem("x", grant.token, "h")])
        await eventually(lambda: heard == ["x"], "the other backend heard the release")
    finally:
        await other.close()
        await backend.close()
