"""fencing.redis: fenced writes to a user's own Redis keys, no guard in between.

The takeover: a holder's lease expires while it is paused, a new holder takes over and
writes its own keys through ``FencedKeys``; the paused holder's late write is refused
with the guard's error and the new holder's value stays. The control writes the same
late value with a plain ``SET`` (what a redis-py Lock user does today): it lands over
the new holder's. Run on one Redis and on a Redis Cluster, blocking and asyncio.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from fencing import LeaseClient
from fencing.errors import InvalidArgumentError, StaleTokenError
from fencing.redis import AsyncFencedKeys, FencedKeys, fence_key, own_key
from fencing.testing import RunningServers, running_servers
from fencing.types import Claim, Delete, Put
from tests import redis_server

pytestmark = pytest.mark.redis


@pytest.fixture
def servers() -> Iterator[RunningServers]:
    with running_servers() as running:
        yield running


@pytest.fixture(params=["standalone", "cluster"])
def client(request: pytest.FixtureRequest) -> Iterator[tuple[object, str]]:
    """A blocking client and a key prefix of this test's own, dropped afterwards."""
    if request.param == "standalone":
        url = redis_server.SERVERS.standalone_url()
        c: object = redis.Redis.from_url(url)
    else:
        url = redis_server.SERVERS.cluster_url()
        c = redis.RedisCluster.from_url(url.replace("redis+cluster://", "redis://"))
    prefix = redis_server.unique_prefix()
    try:
        yield c, prefix
    finally:
        for key in c.scan_iter(match=f"*{prefix}*"):  # type: ignore[attr-defined]
            c.delete(key)  # type: ignore[attr-defined]
        c.close()  # type: ignore[attr-defined]


def _takeover(servers: RunningServers, resource: str) -> tuple[Claim, Claim]:
    """A holder whose lease expired while it was paused, and the holder after it."""
    with LeaseClient(servers.lease_address, holder="a") as leases:
        former = leases.acquire(resource, ttl=0.2)
        time.sleep(0.3)  # paused past its lease
        newer = leases.acquire(resource, ttl=30, timeout=10)
    assert newer.token > former.token
    return Claim(resource, former.token), Claim(resource, newer.token)


def test_a_paused_holder_cannot_overwrite_the_new_holders_keys(
    servers: RunningServers, client: tuple[object, str]
) -> None:
    c, prefix = client
    resource = f"{prefix}-ledger"
    keys = FencedKeys(c, prefix=prefix)
    former, newer = _takeover(servers, resource)
    balance, audit = own_key(resource, "balance"), own_key(resource, "audit")
    assert keys.write(newer, [Put(balance, b"200"), Put(audit, b"by newer")]) == newer.token
    with pytest.raises(StaleTokenError) as stale:
        keys.write(former, [Put(balance, b"late"), Delete(audit)])
    assert (stale.value.token, stale.value.current_token) == (former.token, newer.token)
    assert stale.value.resource == resource
    assert c.get(balance) == b"200" and c.get(audit) == b"by newer"  # type: ignore[attr-defined]
    assert keys.set(newer, balance, b"201") == newer.token  # equal tokens write again
    assert keys.fence(resource) == newer.token
    # The control: the same late write without the fence lands over the new holder's.
    c.set(balance, b"late")  # type: ignore[attr-defined]
    assert c.get(balance) == b"late"  # type: ignore[attr-defined]


def test_the_asyncio_twin_refuses_the_same_write(
    servers: RunningServers, client: tuple[object, str]
) -> None:
    c, prefix = client
    resource = f"{prefix}-ledger"
    former, newer = _takeover(servers, resource)
    balance = own_key(resource, "balance")
    cluster = isinstance(c, redis.RedisCluster)
    url = redis_server.SERVERS.cluster_url() if cluster else redis_server.SERVERS.standalone_url()

    async def run() -> None:
        ac: object = (
            redis.asyncio.RedisCluster.from_url(url.replace("redis+cluster://", "redis://"))
            if cluster
            else redis.asyncio.Redis.from_url(url)
        )
        try:
            keys = AsyncFencedKeys(ac, prefix=prefix)
            assert await keys.set(newer, balance, b"200") == newer.token
            with pytest.raises(StaleTokenError):
                await keys.set(former, balance, b"late")
            assert await keys.fence(resource) == newer.token
        finally:
            await ac.aclose()  # type: ignore[attr-defined]

    asyncio.run(run())
    assert c.get(balance) == b"200"  # type: ignore[attr-defined]


def test_a_key_outside_the_resources_slot_is_refused_before_anything_is_sent(
    client: tuple[object, str],
) -> None:
    c, prefix = client
    keys = FencedKeys(c, prefix=prefix)
    with pytest.raises(InvalidArgumentError) as err:
        keys.write(Claim("ledger", 3), [Put(own_key("ledger", "ok"), b"1"), Put("plain", b"2")])
    assert err.value.field == "key" and "{ledger}:plain" in str(err.value)
    assert c.get(own_key("ledger", "ok")) is None  # type: ignore[attr-defined]
    assert c.get(fence_key("ledger", prefix)) is None  # type: ignore[attr-defined]


async def test_the_guards_redis_store_shares_the_fence(redis_url: str) -> None:
    """A write through the guard's Redis store and a direct one judge the same fence."""
    from guard.stores.redis import RedisStore

    prefix = redis_server.unique_prefix()
    store = RedisStore(redis_url, prefix=prefix)
    await store.open()
    ac = redis.asyncio.Redis.from_url(redis_url)
    try:
        await store.write("shared", 7, [Put("k", b"through the guard")])
        keys = AsyncFencedKeys(ac, prefix=prefix)
        with pytest.raises(StaleTokenError) as stale:
            await keys.set(Claim("shared", 6), own_key("shared", "mine"), b"late")
        assert stale.value.current_token == 7
        assert await keys.set(Claim("shared", 8), own_key("shared", "mine"), b"new") == 8
        assert await store.describe_fence("shared") == 8
    finally:
        await ac.delete(own_key("shared", "mine"))
        await ac.aclose()
        await store.close()
        await redis_server.drop_prefix(redis_url, prefix)
