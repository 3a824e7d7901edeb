"""The book of a stream that carries many calls at once, shared by the client's two such
streams: the lease stream (:class:`fencing.client._lease_stream.SessionBook`) and the
guard's write stream (:class:`fencing.client._writes.WriteBook`), each in a sync and an
asyncio twin.

Each call gets an id, counted up from 1; its item (what the call puts in a message)
waits in a queue until the sender takes everything queued, up to a message's worth,
into the next message; its waiter (what its caller waits on) waits under that id until
the reader finds it by the id of its reply. When the stream ends, every waiter left is
handed back to be failed. I/O-free and not thread-safe: the sync twins guard a book
with a lock, the asyncio ones use it from one loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar

Item = TypeVar("Item")  # what one call puts in a message (a request)
W = TypeVar("W")  # what its caller waits on (a Future)


class Reply(Protocol):
    """A reply on the stream, answering the call of its ``id``."""

    @property
    def id(self) -> int: ...


R = TypeVar("R", bound=Reply)


class Waiter(Protocol):
    """What the twins wake a caller with: a ``concurrent.futures.Future`` or an
    ``asyncio.Future`` (both have these)."""

    def done(self) -> bool: ...

    def set_result(self, result: Any, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


def settle(waiter: Waiter, result: object) -> bool:
    """Hand ``result`` (an exception is raised to the caller) to ``waiter``; False if its
    caller already gave up waiting (it cancelled the future, even while this ran: a
    thread's future can be cancelled from another thread between the two steps)."""
    if waiter.done():
        return False
    try:
        if isinstance(result, BaseException):
            waiter.set_exception(result)
        else:
            waiter.set_result(result)
    except (concurrent.futures.InvalidStateError, asyncio.InvalidStateError):
        return False
    return True


class StreamBook(Generic[Item, W]):
    """The calls of one open stream: queued to be sent, and sent and waiting for a reply.

    A call is in flight from :meth:`add` until its reply (:meth:`settle`), its return
    (:meth:`unsent`) or the stream's end (:meth:`abandon`): a caller that gives up
    waiting leaves it in flight, since the server still has it.
    """

    __slots__ = ("_next_id", "_queued", "_waiting")

    def __init__(self) -> None:
        self._next_id = 1
        self._queued: deque[tuple[int, Item]] = deque()
        self._waiting: dict[int, W] = {}

    @property
    def queued(self) -> int:
        """Calls not sent yet."""
        return len(self._queued)

    @property
    def in_flight(self) -> int:
        """Calls without a reply yet, queued or sent."""
        return len(self._waiting)

    def add(self, item: Item, waiter: W) -> int:
        """Queue ``item``; ``waiter`` is handed back with its reply. Returns its id."""
        call_id = self._next_id
        self._next_id = call_id + 1
        self._queued.append((call_id, item))
        self._waiting[call_id] = waiter
        return call_id

    def take(self, limit: int) -> list[tuple[int, Item]]:
        """The calls of the next message: the oldest queued, up to ``limit``, with their
        ids (empty if none is queued)."""
        queued = self._queued
        if len(queued) <= limit:
            taken = list(queued)
            queued.clear()
            return taken
        return [queued.popleft() for _ in range(limit)]

    def settle(self, replies: Iterable[R]) -> list[tuple[W, R]]:
        """Each of ``replies`` with the waiter of its call (a reply to no call of this
        book is left out)."""
        waiting = self._waiting
        settled = []
        for reply in replies:
            waiter = waiting.pop(reply.id, None)
            if waiter is not None:
                settled.append((waiter, reply))
        return settled

    def unsent(self) -> list[tuple[int, Item, W]]:
        """Every call not sent yet, with its id and waiter, taken out of the book (to
        send elsewhere, or to fail)."""
        calls = [(call_id, item, self._waiting.pop(call_id)) for call_id, item in self._queued]
        self._queued.clear()
        return calls

    def abandon(self) -> list[W]:
        """The stream ended: every waiter still without a reply (queued or sent)."""
        waiters = list(self._waiting.values())
        self._waiting.clear()
        self._queued.clear()
        return waiters
