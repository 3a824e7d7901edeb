"""Waiters queue per resource in arrival order; a release wakes the head only."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fencing.v1 import lease_pb2
from lease_server.backends.memory import MemoryBackend
from lease_server.service import LeaseService
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
        queues.asking(ticket)  # the head's attempt: joining's wake-up is spent
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
        queues.asking(head)
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


class _GatedSecondAttempt:
    """The service's backend, but the second acquire attempt (the head's first ask from
    the line) holds its answer, decided, until ``gate`` opens: a release can then land
    while that attempt is in flight."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.attempts = 0
        self.gate = asyncio.Event()
        self.at_gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def acquire(self, *args: Any) -> Any:
        outcome = await self.inner.acquire(*args)
        self.attempts += 1
        if self.attempts == 2:
            self.at_gate.set()
            await self.gate.wait()
        return outcome


async def test_a_release_during_the_heads_attempt_is_not_lost() -> None:
    """The head asks the backend, finds the resource held, and the holder releases
    before that answer is back: the release's nudge must cut the head's next nap short
    (cleared as the nap began, the head slept a whole poll interval while the resource
    was free, and a newcomer's first try took it ahead of the line)."""
    service = LeaseService(MemoryBackend(), WaitQueues(poll_interval=30))
    holder = await service.acquire(
        lease_pb2.AcquireRequest(resource="r", holder="a", ttl_ms=60_000)
    )
    gated = _GatedSecondAttempt(service.backend)
    service.backend = gated
    waiting = asyncio.create_task(
        service.acquire(
            lease_pb2.AcquireRequest(resource="r", holder="c", ttl_ms=60_000, wait_ms=20_000)
        )
    )
    await gated.at_gate.wait()  # in line, its attempt decided "held"
    await service.release(lease_pb2.ReleaseRequest(resource="r", token=holder.token, holder="a"))
    gated.gate.set()
    # Under the poll interval (30 s) and the wait (20 s): only the nudge can grant it.
    granted = await asyncio.wait_for(waiting, 10)
    assert granted.holder == "c" and granted.token > holder.token
