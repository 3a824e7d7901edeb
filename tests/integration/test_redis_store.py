"""The Redis store beyond the contract: strict mode, idempotency TTL, odd resource names,
on one Redis and on a 3-master cluster."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from fencing.errors import InvalidArgumentError, LeaseLost, StaleTokenError
from fencing.types import Put, Record
from guard.fence import FenceMode
from guard.stores.redis import RedisStore
from lease_server.backends.redis import RedisBackend
from lease_server.leases import Grant
from serving import redis_db
from tests.redis_server import SERVERS, drop_prefix, unique_prefix

pytestmark = pytest.mark.redis

Pair = tuple[RedisBackend, RedisStore]


@pytest.fixture(params=["redis", "redis-cluster"])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    """A lease backend and a guard store on the same Redis and key prefix."""
    url = SERVERS.standalone_url() if request.param == "redis" else SERVERS.cluster_url()
    prefix = unique_prefix()
    backend = RedisBackend(url, prefix=prefix)
    store = RedisStore(url, prefix=prefix, idempotency_ttl_s=0.3)
    await backend.open()
    await store.open()
    try:
        assert backend.cluster == store.cluster == (request.param == "redis-cluster")
        yield backend, store
    finally:
        await store.close()
        await backend.close()
        await drop_prefix(url, prefix)


async def test_strict_rejects_an_expired_holder_and_monotonic_does_not(pair: Pair) -> None:
    backend, store = pair
    lease = await backend.acquire("orders", "a", 200, "")
    assert isinstance(lease, Grant)
    result = await store.write("orders", lease.token, [Put("k", b"live")], mode=FenceMode.STRICT)
    assert result.fence == lease.token
    await asyncio.sleep(0.3)  # the lease expires; nobody takes it over
    assert not (await backend.describe("orders")).held
    # Not below the fence but dead: LEASE_LOST (nobody newer owns it), not STALE_TOKEN.
    with pytest.raises(LeaseLost, match="not the live lease") as lost:
        await store.write("orders", lease.token, [Put("k", b"late")], mode=FenceMode.STRICT)
    assert lost.value.resource == "orders" and lost.value.token == lease.token
    assert await store.read("orders", "k") == Record(b"live", lease.token)
    # The control: monotonic mode accepts the same late write (its token is still the
    # highest the guard has seen): the window strict mode closes.
    late = await store.write("orders", lease.token, [Put("k", b"late")], mode=FenceMode.MONOTONIC)
    assert late.fence == lease.token
    assert await store.read("orders", "k") == Record(b"late", lease.token)


async def test_strict_needs_the_current_token_not_just_a_live_lease(pair: Pair) -> None:
    backend, store = pair
    first = await backend.acquire("r", "a", 10_000, "")
    assert isinstance(first, Grant)
    await backend.release("r", first.token, "a")
    second = await backend.acquire("r", "b", 10_000, "")
    assert isinstance(second, Grant)
    with pytest.raises(LeaseLost):  # released, and nobody newer wrote yet
        await store.write("r", first.token, [Put("k", b"old")], mode=FenceMode.STRICT)
    assert (await store.write("r", second.token, [Put("k", b"new")], mode=FenceMode.STRICT)).fence
    with pytest.raises(StaleTokenError):  # now below the fence
        await store.write("r", first.token, [Put("k", b"old")], mode=FenceMode.STRICT)
    # A fence promised beyond the live lease also stops it (G3 holds in strict mode).
    await store.fence("r", second.token + 1)
    with pytest.raises(StaleTokenError) as stale:
        await store.write("r", second.token, [Put("k", b"x")], mode=FenceMode.STRICT)
    assert stale.value.current_token == second.token + 1


async def test_strict_refuses_a_token_nobody_was_granted(pair: Pair) -> None:
    """2**63 - 1 was never granted: a strict write and a strict Fence with it are
    LEASE_LOST and leave the fence alone, so the real holder keeps writing. The control:
    a monotonic Fence with it wedges the resource."""
    backend, store = pair
    lease = await backend.acquire("w", "a", 10_000, "")
    assert isinstance(lease, Grant)
    with pytest.raises(LeaseLost):
        await store.write("w", 2**63 - 1, [Put("k", b"wedge")], mode=FenceMode.STRICT)
    with pytest.raises(LeaseLost):
        await store.fence("w", 2**63 - 1, FenceMode.STRICT)
    assert await store.describe_fence("w") == 0
    assert await store.fence("w", lease.token, FenceMode.STRICT) == lease.token
    assert (await store.write("w", lease.token, [Put("k", b"v")], mode=FenceMode.STRICT)).fence
    await store.fence("w", 2**63 - 1)
    with pytest.raises(StaleTokenError):
        await store.write("w", lease.token, [Put("k", b"real")], mode=FenceMode.STRICT)


async def test_reset_never_goes_below_a_granted_token(pair: Pair) -> None:
    backend, store = pair
    for _ in range(3):
        g = await backend.acquire("g", "a", 10_000, "")
        assert isinstance(g, Grant)
        await backend.release("g", g.token, "a")
    await store.fence("g", 2**63 - 1)
    with pytest.raises(InvalidArgumentError) as below:
        await store.reset_fence("g", g.token - 1)
    assert below.value.field == "to_token"
    assert await store.describe_fence("g") == 2**63 - 1
    assert await store.reset_fence("g", g.token) == 2**63 - 1
    assert await store.describe_fence("g") == g.token


async def test_idempotency_keys_expire_with_their_ttl(pair: Pair) -> None:
    _, store = pair
    assert not (await store.write("r", 1, [Put("k", b"1")], "op")).replayed
    assert (await store.write("r", 1, [Put("k", b"2")], "op")).replayed
    await asyncio.sleep(0.4)  # the store was built with a 0.3 s idempotency ttl
    assert not (await store.write("r", 1, [Put("k", b"3")], "op")).replayed
    assert await store.read("r", "k") == Record(b"3", 1)


async def test_prune_before_the_ttl_horizon_does_not_touch_redis(pair: Pair) -> None:
    _, store = pair
    await store.write("r", 1, [Put("k", b"v")], "op")
    await store.close()  # a prune that needed Redis would fail now
    assert await store.prune_idempotency(0) == 0
    await store.open()


NAMES = ["{", "}", "{}", "a{b}c", "}{", "%7B", "%", "{orders}", "x:{y}:lease", "é{ü}"]


async def test_resource_names_with_braces_are_distinct_and_single_slot(pair: Pair) -> None:
    backend, store = pair
    for i, name in enumerate(NAMES):
        g = await backend.acquire(name, "a", 10_000, "")
        assert isinstance(g, Grant)
        await store.write(name, g.token, [Put("i", str(i).encode())], "idem{}", FenceMode.STRICT)
    for i, name in enumerate(NAMES):
        record = await store.read(name, "i")
        assert record is not None and record.value == str(i).encode()
        assert (await backend.describe(name)).held
        keys = redis_db.ResourceKeys(store.prefix, name)
        slots = {_slot(k) for k in (keys.lease, keys.counter, keys.fence, keys.data)}
        assert len(slots) == 1


def _slot(key: str) -> int:
    from redis.crc import key_slot

    return int(key_slot(key.encode()))


async def test_keys_land_in_the_slot_redis_computes(redis_cluster_url: str) -> None:
    """Our hash-tag reasoning agrees with the cluster's own CLUSTER KEYSLOT."""
    target = redis_db.parse_url(redis_cluster_url)
    node = Redis.from_url(target.url)
    try:
        for name in NAMES:
            keys = redis_db.ResourceKeys("fencing", name)
            slots = {await node.cluster("KEYSLOT", k) for k in (keys.lease, keys.idempotency("{"))}
            assert slots == {_slot(keys.fence)}
    finally:
        await node.aclose()


async def test_keys_recorded_in_the_older_format_still_replay(pair: Pair) -> None:
    """Records written before the token was kept ('<fence>:<recorded_at_ms>'): the fence
    stands in for the token (equal in every mode but off), and prune still reads them."""
    _, store = pair
    keys = redis_db.ResourceKeys(store.prefix, "old")
    await store.client.set(keys.idempotency("op"), "4:1700000000000", px=60_000)
    again = await store.write("old", 4, [Put("k", b"x")], "op")
    assert again.replayed and again.replayed_by_token == 4 and again.fence == 4
    await store.fence("old", 5)
    with pytest.raises(StaleTokenError) as stale:
        await store.write("old", 4, [Put("k", b"x")], "op")
    assert (stale.value.key_applied, stale.value.applied_by_token) == (True, 4)
    assert await store.read("old", "k") is None


async def test_strict_judges_the_lease_before_a_replay(pair: Pair) -> None:
    backend, short_lived = pair
    # The pair's store forgets keys after 0.3 s: this one remembers them past the lease.
    store = RedisStore(short_lived.target.url, prefix=short_lived.prefix)
    await store.open()
    try:
        await _strict_replay(backend, store)
    finally:
        await store.close()


async def _strict_replay(backend: RedisBackend, store: RedisStore) -> None:
    lease = await backend.acquire("rp", "a", 200, "")
    assert isinstance(lease, Grant)
    await store.write("rp", lease.token, [Put("k", b"v")], "op", FenceMode.STRICT)
    again = await store.write("rp", lease.token, [Put("k", b"w")], "op", FenceMode.STRICT)
    assert again.replayed and again.replayed_by_token == lease.token
    await asyncio.sleep(0.3)  # expired: a repeat is no longer a replay
    with pytest.raises(LeaseLost) as lost:
        await store.write("rp", lease.token, [Put("k", b"w")], "op", FenceMode.STRICT)
    assert (lost.value.key_applied, lost.value.applied_by_token) == (True, lease.token)
