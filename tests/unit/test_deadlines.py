"""``serving.deadlines.within`` keeps ``asyncio.timeout``'s contract with one timer per
loop: every case runs on both, and both must answer alike."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from serving import deadlines


@contextlib.asynccontextmanager
async def ours(seconds: float) -> AsyncIterator[Any]:
    with deadlines.within(seconds) as deadline:
        yield deadline


@contextlib.asynccontextmanager
async def stdlib(seconds: float) -> AsyncIterator[Any]:
    async with asyncio.timeout(seconds) as timeout:
        yield timeout


Within = Callable[[float], contextlib.AbstractAsyncContextManager[Any]]
BOTH = pytest.mark.parametrize("bounded", [ours, stdlib], ids=["deadlines", "asyncio.timeout"])


async def _outcome(bounded: Within, seconds: float, work: Awaitable[object]) -> tuple[str, bool]:
    window: Any = None
    try:
        async with bounded(seconds) as window:
            await work
    except TimeoutError:
        return "timeout", window.expired()
    return "done", window.expired()


@BOTH
async def test_a_block_that_ends_in_time_is_left_alone(bounded: Within) -> None:
    assert await _outcome(bounded, 1.0, asyncio.sleep(0.01)) == ("done", False)


@BOTH
async def test_a_block_past_its_deadline_raises_timeout(bounded: Within) -> None:
    assert await _outcome(bounded, 0.02, asyncio.sleep(5)) == ("timeout", True)


@BOTH
async def test_a_zero_deadline_expires_at_the_first_await(bounded: Within) -> None:
    assert await _outcome(bounded, 0, asyncio.sleep(1)) == ("timeout", True)


@BOTH
async def test_the_blocks_own_timeout_error_is_not_the_deadline(bounded: Within) -> None:
    async def fails() -> None:
        raise TimeoutError("the backend's own")

    assert await _outcome(bounded, 1.0, fails()) == ("timeout", False)


@BOTH
async def test_many_open_blocks_expire_each_at_its_own_deadline(bounded: Within) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def one(seconds: float) -> float:
        with contextlib.suppress(TimeoutError):
            async with bounded(seconds):
                await asyncio.sleep(5)
        return loop.time() - started

    # Out of order, and a later one enters with an earlier deadline than the first.
    ended = await asyncio.gather(*(one(s) for s in (0.15, 0.05, 0.1, 0.02, 0.2)))
    for seconds, took in zip((0.15, 0.05, 0.1, 0.02, 0.2), ended, strict=True):
        assert seconds <= took + 0.005 < seconds + 1.0


@BOTH
async def test_blocks_that_ended_leave_no_cancellation_behind(bounded: Within) -> None:
    for _ in range(200):
        async with bounded(0.05):
            await asyncio.sleep(0)
    await asyncio.sleep(0.1)  # past every deadline: nothing fires at this task
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


@BOTH
async def test_an_outer_cancel_during_the_block_stays_a_cancel(bounded: Within) -> None:
    async def body() -> None:
        async with bounded(5):
            await asyncio.sleep(5)

    task = asyncio.create_task(body())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@BOTH
async def test_a_cancel_together_with_the_deadline_stays_a_cancel(bounded: Within) -> None:
    async def body() -> None:
        async with bounded(0.02):
            try:
                await asyncio.sleep(5)
            finally:
                # The deadline fired; somebody cancels the task too before the exit.
                asyncio.current_task().cancel()  # type: ignore[union-attr]
                await asyncio.sleep(0)

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(body())


@BOTH
async def test_nested_blocks_the_inner_expires_first(bounded: Within) -> None:
    inner_expired = outer_expired = None
    async with bounded(1.0) as outer:
        try:
            async with bounded(0.02) as inner:
                await asyncio.sleep(5)
        except TimeoutError:
            pass
        inner_expired, outer_expired = inner.expired(), outer.expired()
    assert (inner_expired, outer_expired) == (True, False)


@BOTH
async def test_nested_blocks_the_outer_expires_first(bounded: Within) -> None:
    with pytest.raises(TimeoutError):
        async with bounded(0.02) as outer, bounded(1.0) as inner:
            await asyncio.sleep(5)
    assert outer.expired() and not inner.expired()


def test_outside_a_task_is_an_error() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        failed = loop.create_future()

        def outside() -> None:
            try:
                deadlines.within(1).__enter__()
            except RuntimeError as exc:
                failed.set_result(str(exc))

        loop.call_soon(outside)
        assert "inside a task" in await failed

    asyncio.run(main())


def test_each_loop_has_its_own_clock() -> None:
    async def main() -> tuple[str, bool]:
        return await _outcome(ours, 0.02, asyncio.sleep(5))

    assert asyncio.run(main()) == ("timeout", True)
    assert asyncio.run(main()) == ("timeout", True)


async def test_one_timer_for_many_open_blocks() -> None:
    """The point of it: a thousand blocks open at once add one timer to the loop, where
    asyncio.timeout adds one each (the control)."""
    loop = asyncio.get_running_loop()
    scheduled: list[Any] = loop._scheduled  # type: ignore[attr-defined]

    async def count_timers(bounded: Within) -> int:
        before = len(scheduled)
        gate = asyncio.Event()
        all_in = asyncio.Event()
        entered = 0

        async def one() -> None:
            nonlocal entered
            async with bounded(30):
                entered += 1
                if entered == 1000:
                    all_in.set()
                await gate.wait()

        tasks = [asyncio.create_task(one()) for _ in range(1000)]
        await all_in.wait()
        timers = len(scheduled) - before
        gate.set()
        await asyncio.gather(*tasks)
        return timers

    assert await count_timers(ours) <= 1
    assert await count_timers(stdlib) >= 1000
