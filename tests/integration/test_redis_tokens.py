"""Tokens on Redis never go backwards, even when Redis forgets; durability is reported.

The never-backwards test kills a throwaway Redis (persistence off) with SIGKILL and
starts it again, empty, on the same port. With the clock floor the next token is
larger than every earlier one; the control, the same run with the floor off, gets
token 1 again: the failure the floor prevents.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import HealthCheck, settings
from redis.asyncio import Redis

from fencing.errors import BackendUnavailableError, InvalidArgumentError
from fencing.limits import MAX_TOKEN
from guard.stores.redis import RedisStore
from lease_server.backends.redis import RedisBackend
from lease_server.leases import Grant
from tests.backends import redis_backend_at
from tests.contract.test_lease_model import machine_for
from tests.redis_server import RedisProcess, drop_prefix, unique_prefix

pytestmark = pytest.mark.redis


async def grant(backend: RedisBackend, resource: str, holder: str = "a") -> Grant:
    """Acquire, retrying while Redis comes back (as the SDK would, with a request id)."""
    for _ in range(50):
        try:
            outcome = await backend.acquire(resource, holder, 10_000, f"req-{holder}")
        except BackendUnavailableError:
            await asyncio.sleep(0.1)
            continue
        assert isinstance(outcome, Grant), outcome
        return outcome
    raise AssertionError("Redis did not come back")


async def issue(backend: RedisBackend, resource: str, n: int) -> list[int]:
    tokens = []
    for i in range(n):
        g = await grant(backend, resource, f"h{i}")
        tokens.append(g.token)
        await backend.release(resource, g.token, g.holder)
    return tokens


async def redis_time_us(url: str) -> int:
    client = Redis.from_url(url)
    try:
        seconds, micros = await client.time()
        return int(seconds) * 1_000_000 + int(micros)
    finally:
        await client.aclose()


async def test_tokens_follow_the_redis_clock_and_strictly_increase(redis_url: str) -> None:
    prefix = unique_prefix()
    backend = RedisBackend(redis_url, prefix=prefix)
    await backend.open()
    try:
        before = await redis_time_us(redis_url)
        tokens = await issue(backend, "r", 200)
        after = await redis_time_us(redis_url)
        assert all(a < b for a, b in itertools.pairwise(tokens))
        assert before <= tokens[0] and tokens[-1] <= after < MAX_TOKEN
        info = await backend.describe("r")
        assert info.last_token == tokens[-1]
        # Tokens per resource: another resource starts at the clock too, not at 1.
        assert (await grant(backend, "other")).token > tokens[0]
    finally:
        await backend.close()
        await drop_prefix(redis_url, prefix)


async def test_counter_ahead_of_the_clock_still_increments(redis_url: str) -> None:
    """A counter above the clock (a clock stepped back) keeps growing by one."""
    prefix = unique_prefix()
    backend = RedisBackend(redis_url, prefix=prefix)
    await backend.open()
    client = Redis.from_url(redis_url)
    try:
        ahead = await redis_time_us(redis_url) + 3_600_000_000  # an hour ahead
        await client.set(f"{prefix}:{{r}}:counter", ahead)
        assert await issue(backend, "r", 3) == [ahead + 1, ahead + 2, ahead + 3]
        # Near the top of the token space: exact decimal arithmetic, no double rounding.
        await client.set(f"{prefix}:{{s}}:counter", MAX_TOKEN - 2)
        assert await issue(backend, "s", 2) == [MAX_TOKEN - 1, MAX_TOKEN]
    finally:
        await client.aclose()
        await backend.close()
        await drop_prefix(redis_url, prefix)


def test_stateful_model_with_the_clock_floor_on(redis_url: str) -> None:
    """The contract's stateful model (strictly increasing tokens, Describe agrees) with
    the production setting; the contract suite itself runs with dense tokens."""
    machine = machine_for(lambda: redis_backend_at(redis_url, clock_floor=True))
    machine.TestCase.settings = settings(
        max_examples=10,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    machine.TestCase().runTest()


@pytest.mark.parametrize("clock_floor", [True, False], ids=["floor", "control-no-floor"])
async def test_tokens_after_redis_forgets(throwaway_redis: RedisProcess, clock_floor: bool) -> None:
    backend = RedisBackend(throwaway_redis.url, clock_floor=clock_floor)
    await backend.open()
    try:
        assert backend.durability_warning is not None  # persistence is off
        earlier = await issue(backend, "orders", 20)
        throwaway_redis.kill()  # kill -9: nothing was persisted
        throwaway_redis.start()  # same port, empty
        after = (await grant(backend, "orders", "new")).token
        if clock_floor:
            assert after > max(earlier), (after, earlier)
        else:
            # The control: without the floor the counter is gone and tokens restart.
            assert earlier == list(range(1, 21))
            assert after == 1
    finally:
        await backend.close()


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        ((), "persistence is off"),
        (("--save", "3600 1"), "only RDB snapshots"),
        (("--appendonly", "yes", "--appendfsync", "no"), "appendfsync is 'no'"),
        (("--rename-command", "CONFIG", ""), "cannot read the persistence settings"),
        (("--appendonly", "yes", "--appendfsync", "everysec"), None),
        (("--appendonly", "yes", "--appendfsync", "always"), None),
    ],
    ids=["none", "rdb", "aof-fsync-no", "config-disabled", "aof-everysec", "aof-always"],
)
async def test_durability_is_read_at_open_and_can_be_required(
    extra: tuple[str, ...], expect: str | None
) -> None:
    with RedisProcess(extra=extra) as server:
        # "save" after "--save ''" in RedisProcess.start: the later option wins.
        for make in (RedisBackend, RedisStore):
            lenient = make(server.url)
            await lenient.open()
            try:
                if expect is None:
                    assert lenient.durability_warning is None
                else:
                    assert lenient.durability_warning is not None
                    assert expect in lenient.durability_warning
            finally:
                await lenient.close()
            strict = make(server.url + "?require_durable=1")
            if expect is None:
                await strict.open()
                await strict.close()
            else:
                with pytest.raises(InvalidArgumentError) as refused:
                    await strict.open()
                assert refused.value.field == "require_durable"
                assert expect in str(refused.value)
                await strict.close()  # idempotent on a backend that never opened
