"""Waiters queue per resource in arrival order; a release wakes the head only."""

from __future__ import annotations

import asyncio

import pytest

from lease_server.waiters import WaitQueues


async def test_only_the_head_gets_a_turn_and_leaving_passes_it_on() -> None:
    queues = WaitQueues(poll_interval=10)
    order: list[str] = []

    async def waiter(name: str, release: asyncio.Event) -> None:
        with queues.join("r") as ticket:
            assert await queues.wait_turn(ticket, 5)
            order.append(name)
            await release.wait()

    gates = [asyncio.Event() for _ in range(3)]
    tasks = []
    for i, name in enumerate("abc"):
        tasks.append(asyncio.create_task(waiter(name, gates[i])))
        await asyncio.sleep(0)  # arrival order a, b, c
    await asyncio.sleep(0.01)
    assert order == ["a"]
    assert queues.waiting("r") == 3
    gates[0].set()
    await asyncio.sleep(0.01)
    assert order == ["a", "b"]
    gates[1].set()
    gates[2].set()
    await asyncio.gather(*tasks)
    assert order == ["a", "b", "c"]
    assert queues.total_waiting == 0


async def test_notify_cuts_the_heads_nap_short() -> None:
    queues = WaitQueues(poll_interval=30)
    with queues.join("r") as ticket:
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, queues.notify, "r")
        started = loop.time()
        await queues.nap(ticket, 20)
        assert loop.time() - started < 20  # woke by the nudge, not the nap's length


async def test_wait_turn_times_out_behind_a_head_that_never_leaves() -> None:
    queues = WaitQueues()
    with queues.join("r"), queues.join("r") as second:
        assert not await queues.wait_turn(second, 0.01)


async def test_a_waiter_cancelled_as_it_is_woken_stays_cancelled() -> None:
    """A wake-up and a cancellation in the same turn of the loop: the cancellation wins
    (the caller went away; its acquire must not go on and take the lease). Python 3.11's
    ``asyncio.wait_for`` returned the wake-up's result then and dropped the cancel."""
    queues = WaitQueues(poll_interval=5.0)
    with queues.join("r") as head, queues.join("r") as second:
        napping = asyncio.create_task(queues.nap(head, 5.0))
        waiting = asyncio.create_task(queues.wait_turn(second, 5.0))
        await asyncio.sleep(0.01)  # both asleep on their events
        head.wake.set()
        napping.cancel()
        second.wake.set()
        waiting.cancel()
        for task in (napping, waiting):
            with pytest.raises(asyncio.CancelledError):
                await task
