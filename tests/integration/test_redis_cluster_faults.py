"""A Redis Cluster master dies and comes back empty: BACKEND_UNAVAILABLE, then recovery,
and the resource's next token is still larger than the last (the clock floor).

Runs on a private 3-master cluster (no replicas, so losing a master takes its slots,
and soon the whole cluster, down); the session's shared cluster is left alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from fencing.errors import BackendUnavailableError
from lease_server.backends.redis import RedisBackend
from lease_server.leases import Grant
from serving import redis_db
from tests.redis_server import REDIS_CLI, REDIS_SERVER, RedisCluster3, unavailable

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def private_cluster() -> Iterator[RedisCluster3]:
    if not (Path(REDIS_SERVER).exists() and Path(REDIS_CLI).exists()):
        unavailable("redis-server / redis-cli not installed")
    with RedisCluster3() as cluster:
        yield cluster


async def test_a_master_restart_is_unavailable_then_recovers_with_larger_tokens(
    private_cluster: RedisCluster3,
) -> None:
    backend = RedisBackend(private_cluster.url, prefix="faults")
    await backend.open()
    try:
        first = await backend.acquire("r", "a", 10_000, "")
        assert isinstance(first, Grant) and backend.cluster
        client = backend._client
        assert isinstance(client, RedisCluster)
        slot = key_slot(redis_db.ResourceKeys("faults", "r").lease.encode())
        owner = client.nodes_manager.get_node_from_slot(slot)
        victim = next(n for n in private_cluster.nodes if n.port == owner.port)

        await asyncio.to_thread(victim.kill)
        errors = 0
        for _ in range(10):
            with pytest.raises(BackendUnavailableError):
                await backend.acquire("r", "b", 10_000, "")
            errors += 1
            await asyncio.sleep(0.1)

        # Same port and nodes.conf: it rejoins with its slots, and no data.
        await asyncio.to_thread(victim.start)
        deadline = time.monotonic() + 30  # hang guard
        while True:
            try:
                second = await backend.acquire("r", "b", 10_000, "")
                break
            except BackendUnavailableError:
                assert time.monotonic() < deadline, "the cluster did not recover"
                await asyncio.sleep(0.2)
        assert isinstance(second, Grant)
        assert second.token > first.token, "the token went back after the data loss"
        print(
            f"\ncluster master restart: {errors} unavailable, token {first.token} -> {second.token}"
        )
    finally:
        await backend.close()
