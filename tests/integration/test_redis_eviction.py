"""A Redis that may evict is refused like a Redis that may forget.

Each test runs a throwaway ``redis-server`` with AOF on (``appendfsync always``, so
persistence is not what is judged) and a small ``maxmemory`` under one policy. The
controls fill that Redis with unrelated keys and show what eviction does to us
under a bad policy: the fence of a resource disappears and a stale token is accepted
(``allkeys-*``), the lease disappears and a second holder is granted while the
first's lease is unexpired (``volatile-*``). Under ``noeviction`` the same filling
ends in OOM errors and nothing of ours is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError

from fencing.errors import BackendUnavailableError, InvalidArgumentError, StaleTokenError
from fencing.types import Put
from guard.stores.redis import RedisStore
from lease_server.backends.redis import RedisBackend
from lease_server.leases import Grant, Held
from tests.redis_server import REDIS_SERVER, RedisProcess, unavailable

pytestmark = pytest.mark.redis

POLICIES = [
    "noeviction",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
]
MAXMEMORY = 4 * 1024 * 1024
#: Far more than MAXMEMORY in all, so eviction (or OOM) is certain, not likely.
JUNK_KEYS, JUNK_BYTES = 4000, 8 * 1024


def durable_redis(policy: str, maxmemory: int = MAXMEMORY) -> RedisProcess:
    if not Path(REDIS_SERVER).exists():
        unavailable("redis-server is not installed")
    return RedisProcess(
        extra=(
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--maxmemory",
            str(maxmemory),
            "--maxmemory-policy",
            policy,
        )
    )


@pytest.fixture
def redis_with(request: pytest.FixtureRequest) -> Iterator[RedisProcess]:
    with durable_redis(request.param) as server:
        yield server


async def fill(url: str, *, ttl: bool = False, until: str | None = None) -> bool:
    """Write unrelated keys far past maxmemory, stopping early once ``until`` is gone or
    Redis answers OOM; True if it did (it refused rather than evicted)."""
    client = Redis.from_url(url)
    oom = False
    try:
        for start in range(0, JUNK_KEYS, 100):
            pipe = client.pipeline(transaction=False)
            for n in range(start, start + 100):
                pipe.set(f"junk:{n}", b"x" * JUNK_BYTES, ex=3600 if ttl else None)
            replies = await pipe.execute(raise_on_error=False)
            oom = oom or any(isinstance(r, OutOfMemoryError) for r in replies)
            if oom or (until is not None and not await client.exists(until)):
                break  # Redis refuses now (and under volatile-* has evicted all it may)
    finally:
        await client.aclose()
    return oom


@pytest.mark.parametrize("redis_with", POLICIES, indirect=True)
async def test_eviction_is_judged_at_open_and_refused_with_require_durable(
    redis_with: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    policy = redis_with.extra[-1]
    caplog.set_level(logging.WARNING, logger="serving.redis_db")
    for make in (RedisBackend, RedisStore):
        lenient = make(redis_with.url)
        await lenient.open()
        try:
            if policy == "noeviction":
                assert lenient.durability_warning is None
            else:
                assert lenient.durability_warning is not None
                assert f"maxmemory-policy is {policy!r}" in lenient.durability_warning
                assert f"maxmemory {MAXMEMORY}" in lenient.durability_warning
        finally:
            await lenient.close()
        strict = make(redis_with.url + "?require_durable=1")
        if policy == "noeviction":
            await strict.open()
            await strict.close()
        else:
            with pytest.raises(InvalidArgumentError) as refused:
                await strict.open()
            assert refused.value.field == "require_durable"
            assert "maxmemory-policy" in str(refused.value)
    # Opening says it in durability_warning and logs nothing itself: the server logs that
    # warning once for every component (tests/e2e/test_redis_durability_log.py).
    warned = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert warned == [], warned


async def test_a_policy_without_a_memory_limit_never_evicts() -> None:
    with durable_redis("allkeys-lru", maxmemory=0) as server:
        store = RedisStore(server.url + "?require_durable=1")
        await store.open()  # maxmemory 0: no limit, nothing is evicted
        assert store.durability_warning is None
        await store.close()


@pytest.mark.parametrize(
    "redis_with", ["allkeys-lru", "allkeys-random", "noeviction"], indirect=True
)
async def test_allkeys_eviction_loses_a_fence_and_a_stale_token_writes(
    redis_with: RedisProcess,
) -> None:
    policy = redis_with.extra[-1]
    store = RedisStore(redis_with.url, prefix="ev")
    await store.open()
    try:
        assert (store.durability_warning is None) == (policy == "noeviction")
        await store.write("orders", 5, [Put("k", b"from 5")])
        oom = await fill(redis_with.url, until="ev:{orders}:fence")
        if policy == "noeviction":
            # Redis refused the junk instead of evicting: the fence held.
            assert oom
            with pytest.raises(StaleTokenError) as stale:
                await store.write("orders", 3, [Put("k", b"from 3")])
            assert stale.value.current_token == 5
        else:
            # The control: the fence was evicted, and the stale holder of token 3
            # writes over the newer holder's data.
            result = await store.write("orders", 3, [Put("k", b"from 3")])
            assert result.fence == 3
    finally:
        await store.close()


@pytest.mark.parametrize(
    "redis_with", ["volatile-lru", "volatile-ttl", "noeviction"], indirect=True
)
async def test_volatile_eviction_loses_a_lease_and_grants_a_second_holder(
    redis_with: RedisProcess,
) -> None:
    policy = redis_with.extra[-1]
    backend = RedisBackend(redis_with.url, prefix="ev")
    await backend.open()
    try:
        first = await backend.acquire("orders", "first", 600_000, "req-first")
        assert isinstance(first, Grant)
        oom = await fill(redis_with.url, until="ev:{orders}:lease")
        second = await backend.acquire("orders", "second", 600_000, "req-second")
        if policy == "noeviction":
            assert oom
            assert isinstance(second, Held) and second.holder == "first"
        else:
            # The control: the first lease (10 minutes left) was evicted with its TTL,
            # and a second holder is granted: two holders at once.
            assert isinstance(second, Grant), second
            assert second.holder == "second" and second.token > first.token
    finally:
        await backend.close()


@pytest.mark.parametrize("make", [RedisBackend, RedisStore], ids=["backend", "store"])
async def test_the_health_probe_reads_the_policy_again(
    make: type[RedisBackend] | type[RedisStore], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="serving.redis_db")
    with durable_redis("noeviction") as server:
        lenient, strict = make(server.url), make(server.url + "?require_durable=1")
        await lenient.open()
        await strict.open()
        admin = Redis.from_url(server.url)
        try:
            assert await lenient.healthy() and await strict.healthy()
            assert lenient.durability_warning is None
            await admin.config_set("maxmemory-policy", "volatile-lru")
            # Still serving, but the new setting is named in the log.
            assert await lenient.healthy()
            assert "'volatile-lru'" in (lenient.durability_warning or "")
            # require_durable: a Redis that may now evict is not served.
            assert not await strict.healthy()
            warned = [r.getMessage() for r in caplog.records if "volatile-lru" in r.getMessage()]
            assert len(warned) == 2, warned
            assert await lenient.healthy()  # an unchanged setting is not logged again
            assert len([r for r in caplog.records if "volatile-lru" in r.getMessage()]) == 2
            await admin.config_set("maxmemory-policy", "noeviction")
            assert await lenient.healthy() and await strict.healthy()
            assert lenient.durability_warning is None
        finally:
            await admin.aclose()
            await lenient.close()
            await strict.close()


async def test_a_full_redis_under_noeviction_refuses_a_write_as_unavailable() -> None:
    """noeviction: a write Redis has no room for is BACKEND_UNAVAILABLE (safe to retry),
    and nothing of it, nor of what was there, is lost."""
    with durable_redis("noeviction") as server:
        store = RedisStore(server.url, prefix="ev")
        backend = RedisBackend(server.url, prefix="ev")
        await store.open()
        await backend.open()
        try:
            await store.write("orders", 5, [Put("k", b"from 5")])
            assert await fill(server.url)
            with pytest.raises(BackendUnavailableError, match="out of memory"):
                await store.write("orders", 6, [Put("big", b"y" * (1024 * 1024))])
            with pytest.raises(BackendUnavailableError, match="out of memory"):
                await backend.acquire("jobs", "h", 10_000, "req")
            record = await store.read("orders", "k")
            assert record is not None and record.value == b"from 5"
            with pytest.raises(StaleTokenError):
                await store.write("orders", 4, [Put("k", b"late")])
        finally:
            await backend.close()
            await store.close()


async def test_a_require_durable_guard_stops_serving_when_redis_may_evict() -> None:
    """Over real gRPC: the guard's health turns NOT_SERVING once its Redis is switched
    to an evicting policy at runtime, and SERVING again once it is switched back."""
    import grpc.aio
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from guard.server import start_guard
    from serving.server import ServerOptions
    from tests.waiting import HANG_GUARD, eventually

    with durable_redis("noeviction") as server:
        guard = await start_guard(
            server.url + "?require_durable=1",
            "127.0.0.1:0",
            options=ServerOptions(health_interval=0.05),
            require_durable=True,
        )
        admin = Redis.from_url(server.url)
        try:
            async with grpc.aio.insecure_channel(guard.address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)

                async def status() -> int:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=HANG_GUARD)
                    return int(reply.status)

                serving = health_pb2.HealthCheckResponse.SERVING
                assert await status() == serving
                await admin.config_set("maxmemory-policy", "allkeys-lru")
                await eventually(lambda: _is(status(), lambda s: s != serving), "NOT_SERVING")
                await admin.config_set("maxmemory-policy", "noeviction")
                await eventually(lambda: _is(status(), lambda s: s == serving), "SERVING")
        finally:
            await admin.aclose()
            await guard.stop(0)


async def _is(value: Any, test: Any) -> bool:
    return bool(test(await value))
