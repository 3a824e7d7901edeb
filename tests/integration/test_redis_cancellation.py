"""A server's background task cancelled in the middle of a Redis call ends.

Servers stop their background tasks (the guard's watch follower, which writes fences
and its cursor to the store between events; the lease server's release listener;
health probes) by cancelling them. On Python 3.11 redis-py can swallow a cancellation:
it writes each command through ``asyncio.wait_for``, which returns the write's result
instead of raising when both finish in the same loop turn (serving.tasks). The task
then carries on, and a shutdown that waits for it never ends: a guard in watch mode on
Redis hung in ``stop`` about one time in eight. Re-cancelling alone
(``serving.tasks.cancel_and_wait``) did not always end it either: on a loaded machine
each re-cancel tends to land in the same window of the next command's write, so a task
swallowed one after another for the whole hang guard. Our connections
(``serving.redis_db``) raise a swallowed cancellation again, so with our store and
backend one cancellation ends the task; the control cancels once a task calling
redis-py's own client and shows that the driver still swallows one here, which is what
the other tests are up against.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from redis.asyncio import Redis

from guard.stores.redis import RedisStore
from lease_server.backends.redis import RedisBackend
from serving.server import BuiltServer
from serving.tasks import cancel_and_wait
from tests import redis_server
from tests.waiting import HANG_GUARD

pytestmark = pytest.mark.redis

Call = Callable[[], Awaitable[object]]
#: Cancellations per test, each at another point of a call (0 to 1.2 ms after it began);
#: about half are swallowed once here, and each of those costs a RECANCEL_S.
TRIALS = 12


@pytest.fixture(params=["guard-store", "lease-backend"])
async def call(request: pytest.FixtureRequest) -> AsyncIterator[Call]:
    """A call of our Redis store or backend, as a background task makes it."""
    url = redis_server.SERVERS.standalone_url()
    prefix = redis_server.unique_prefix()
    if request.param == "guard-store":
        store = RedisStore(url, prefix=prefix)
        await store.open()
        try:
            yield lambda: store.fence("cursor", 7)
        finally:
            await store.close()
    else:
        backend = RedisBackend(url, prefix=prefix)
        await backend.open()
        try:
            yield lambda: backend.describe("r")
        finally:
            await backend.close()
    await redis_server.drop_prefix(url, prefix)


def _calling(call: Call) -> asyncio.Task[None]:
    async def forever() -> None:
        while True:
            await call()

    return asyncio.ensure_future(forever())


async def test_a_task_in_a_redis_call_ends_when_cancelled_until_it_does(call: Call) -> None:
    for trial in range(TRIALS):
        task = _calling(call)
        await asyncio.sleep((trial % 41) * 0.0001)
        await asyncio.wait_for(cancel_and_wait(task), HANG_GUARD)
        assert task.cancelled(), f"trial {trial}"
    await asyncio.wait_for(call(), HANG_GUARD)  # and the client still answers


async def test_a_server_shutdown_ends_its_tasks_in_redis_calls(call: Call) -> None:
    """BuiltServer.enter_shutdown, which stops every server's background tasks."""
    for trial in range(TRIALS):
        built = BuiltServer(server=None, port=0, health=_Health())  # type: ignore[arg-type]
        built.tasks.append(_calling(call))
        await asyncio.sleep((trial % 41) * 0.0001)
        await asyncio.wait_for(built.enter_shutdown(), HANG_GUARD)


async def test_one_cancellation_ends_a_task_in_our_redis_call(call: Call) -> None:
    """As servers cancelled before cancel_and_wait: once, and the task ends every time."""
    for trial in range(TRIALS):
        task = _calling(call)
        await asyncio.sleep((trial % 41) * 0.0001)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=HANG_GUARD)
        if not done:
            await cancel_and_wait(task)
        assert task.cancelled(), f"trial {trial}: the cancellation was swallowed"


async def test_control_one_cancellation_can_be_swallowed_by_redis_py() -> None:
    """redis-py's own client, one cancel: some task goes on calling Redis as if never
    cancelled (the driver, on this Python, still swallows a cancellation)."""
    url = redis_server.SERVERS.standalone_url()
    prefix = redis_server.unique_prefix()
    client = Redis.from_url(url, socket_timeout=2.0)
    stop = asyncio.Event()

    async def forever() -> None:
        # Also ends on ``stop``: re-cancelling a task that swallows cancellations may
        # take as long as the bug this shows.
        while not stop.is_set():
            await client.set(f"{prefix}:cursor", 7)

    try:
        for trial in range(TRIALS):
            task = asyncio.ensure_future(forever())
            await asyncio.sleep((trial % 41) * 0.0001)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=1.0)
            if not done:
                stop.set()
                await asyncio.wait_for(task, HANG_GUARD)
                return  # swallowed: what our connections raise again
    finally:
        await client.aclose()
        await redis_server.drop_prefix(url, prefix)
    pytest.fail(
        f"{TRIALS} single cancellations all ended their task: this redis-py and Python no "
        "longer swallow one, and the control has nothing left to show"
    )


class _Health:
    async def enter_graceful_shutdown(self) -> None:
        return None
