"""The asyncio lease stream's deadlines: one timer for every call's, each caller still
stopped at its own deadline (an earlier one added later is not kept waiting behind the
armed one), and a call done by then left alone."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf.message import Message

from fencing.client.async_lease_stream import _Deadlines
from fencing.errors import DeadlineExceededError
from fencing.v1 import lease_pb2


async def test_each_call_fails_at_its_own_deadline_in_deadline_order() -> None:
    loop = asyncio.get_running_loop()
    deadlines = _Deadlines()
    late, early, answered = (loop.create_future() for _ in range(3))
    futures: list[asyncio.Future[Message]] = [late, early, answered]
    now = loop.time()
    deadlines.add(loop, now + 30.0, late, 30.0)
    deadlines.add(loop, now + 0.05, early, 0.05)  # arms the timer earlier
    deadlines.add(loop, now + 0.01, answered, 0.01)
    answered.set_result(lease_pb2.ReleaseResponse())
    with pytest.raises(DeadlineExceededError, match=r"0\.050 s"):
        await early
    assert answered.result() == lease_pb2.ReleaseResponse()  # its reply came first: kept
    assert not late.done()  # its deadline has not come: still waiting
    deadlines.close()
    await asyncio.sleep(0)
    assert not late.done()  # a closed stub's timer is gone
    for future in futures:
        future.cancel()


async def test_a_cancelled_caller_is_passed_over_and_the_next_deadline_armed() -> None:
    loop = asyncio.get_running_loop()
    deadlines = _Deadlines()
    gone, waiting = loop.create_future(), loop.create_future()
    now = loop.time()
    deadlines.add(loop, now + 0.01, gone, 0.01)
    deadlines.add(loop, now + 0.03, waiting, 0.03)
    gone.cancel()
    with pytest.raises(DeadlineExceededError):
        await waiting
    assert gone.cancelled()
    deadlines.close()
