"""The Redis benchmark helpers run and return sane results (no timing is asserted)."""

from __future__ import annotations

import pytest

from bench import redis as redis_bench

pytestmark = pytest.mark.redis


async def test_redis_bench_helpers_run(redis_url: str) -> None:
    results = await redis_bench.run([2], 0.05, redis_url, depth=4)
    names = [r.name for r in results]
    assert names == [
        redis_bench.FLOOR,
        redis_bench.LOCK,
        "RedisBackend acquire+release (Lua)",
        "write.lua EVALSHA (1 op)",
        "write.lua EVALSHA pipelined x4",
    ]
    assert all(r.ops > 0 and r.rate > 0 and r.percentile(0.99) > 0 for r in results)
    assert results[-1].per_call == 4 and results[-1].ops % 4 == 0
