"""Per-call deadlines that cost a heap entry, not a timer each.

``asyncio.timeout`` arms a timer per use: a ``TimerHandle`` pushed on the loop's
heap, cancelled at the exit, plus an async context manager's two awaits. On a server
whose every call is bounded (a session call's ``deadline_ms``, each backend call's
deadline) that was a tenth of the Python run per call. :func:`within` keeps the same
contract (the task is cancelled when the deadline passes, and the cancellation
becomes ``TimeoutError`` at the block's exit unless somebody else cancelled the task
too) with one timer per event loop, at the earliest deadline of every block still
open: entering a block pushes an entry on a heap, leaving it marks the entry done,
and when the timer fires it drops the done entries at the top and cancels the tasks
whose deadlines passed. Calls end long before their deadlines, so the timer rarely
fires and then mostly drops entries.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import weakref
from types import TracebackType

_ARMED, _EXITED, _FIRED = 0, 1, 2


class Deadline:
    """One open block of :func:`within`: a synchronous context manager around awaits."""

    __slots__ = ("_cancelling", "_clock", "_state", "_task", "when")

    def __init__(self, clock: _Clock, when: float) -> None:
        self._clock = clock
        self.when = when
        self._state = _ARMED
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0

    def expired(self) -> bool:
        """Whether the deadline passed (the task was cancelled for it)."""
        return self._state == _FIRED

    def __enter__(self) -> Deadline:
        task = asyncio.current_task(self._clock.loop)
        if task is None:
            raise RuntimeError("a deadline must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._clock.add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state == _FIRED:
            assert self._task is not None
            # As asyncio.timeout: ours to handle only if nobody else cancelled since.
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
        else:
            self._state = _EXITED
        self._task = None

    def _fire(self) -> None:
        if self._state == _ARMED and self._task is not None:
            self._state = _FIRED
            self._task.cancel()


class _Clock:
    """The open deadlines of one loop, on one timer at the earliest."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()  # ties on the time: never compare deadlines
        self._timer: asyncio.TimerHandle | None = None

    def add(self, deadline: Deadline) -> None:
        heapq.heappush(self._heap, (deadline.when, next(self._order), deadline))
        timer = self._timer
        if timer is None or deadline.when < timer.when():
            if timer is not None:
                timer.cancel()
            self._timer = self.loop.call_at(deadline.when, self._expire)

    def _expire(self) -> None:
        # Everything due when this timer was (the loop may run it a clock tick early).
        timer, self._timer = self._timer, None
        due = self.loop.time() if timer is None else max(self.loop.time(), timer.when())
        heap = self._heap
        while heap and (heap[0][0] <= due or heap[0][2]._state != _ARMED):
            heapq.heappop(heap)[2]._fire()
        if heap:
            self._timer = self.loop.call_at(heap[0][0], self._expire)


_clocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Clock] = weakref.WeakKeyDictionary()


def within(seconds: float) -> Deadline:
    """A block bounded by ``seconds`` from now, as ``async with asyncio.timeout(seconds)``
    but entered with ``with``: the task is cancelled when they pass, and the block
    raises ``TimeoutError`` (``expired()`` tells it from one of the block's own)."""
    loop = asyncio.get_running_loop()
    clock = _clocks.get(loop)
    if clock is None:
        clock = _clocks[loop] = _Clock(loop)
    return Deadline(clock, loop.time() + seconds)


__all__ = ["Deadline", "within"]
