"""Waiters for a held resource: a FIFO per resource, inside one server process.

Only the head of a resource's queue asks the backend again; the others sleep.
A release through this process wakes the head alone (no thundering herd); the
head also re-checks at the lease's expiry and at least every ``poll_interval``
(releases through another server process on the same backend are seen that way).
When the head leaves, granted or timed out, the next waiter becomes head at once.
On shutdown :meth:`WaitQueues.close` wakes every waiter and ends its wait, so the
server can answer it at once instead of cancelling it at the end of the drain.
A waiter cancelled in the same turn as it is woken stays cancelled (its caller went
away: the acquire must not go on).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from serving import deadlines


class Ticket:
    """One waiter's place in a resource's queue."""

    __slots__ = ("resource", "wake")

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.wake = asyncio.Event()


class WaitQueues:
    def __init__(self, poll_interval: float = 0.1) -> None:
        self.poll_interval = poll_interval
        self._queues: dict[str, deque[Ticket]] = {}
        self.closed = False

    def waiting(self, resource: str) -> int:
        return len(self._queues.get(resource, ()))

    @property
    def total_waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())

    @contextmanager
    def join(self, resource: str) -> Iterator[Ticket]:
        """Stand in line for ``resource`` until the block exits (granted, timed out, cancelled)."""
        ticket = Ticket(resource)
        queue = self._queues.setdefault(resource, deque())
        queue.append(ticket)
        if queue[0] is ticket:
            ticket.wake.set()
        try:
            yield ticket
        finally:
            was_head = queue[0] is ticket
            queue.remove(ticket)
            if not queue:
                del self._queues[resource]
            elif was_head:
                queue[0].wake.set()

    def is_head(self, ticket: Ticket) -> bool:
        queue = self._queues.get(ticket.resource)
        return queue is not None and len(queue) > 0 and queue[0] is ticket

    async def wait_turn(self, ticket: Ticket, limit: float) -> bool:
        """Sleep until ``ticket`` heads its queue; False if ``limit`` seconds pass first
        or the queues are closed."""
        while not self.is_head(ticket):
            if self.closed:
                return False
            ticket.wake.clear()
            try:
                with deadlines.within(limit):
                    await ticket.wake.wait()
            except TimeoutError:
                return self.is_head(ticket) and not self.closed
        return not self.closed

    def asking(self, ticket: Ticket) -> None:
        """The head asks the backend now: a release nudged from here on cuts its next
        :meth:`nap` short. (Cleared as the nap began, a release landing while the
        attempt was in flight was lost: the head slept on with the resource free.)"""
        ticket.wake.clear()

    async def nap(self, ticket: Ticket, seconds: float) -> None:
        """Head's sleep before asking the backend again: a release nudged since
        :meth:`asking` cuts it short, or ends it at once."""
        if self.closed:
            return
        with suppress(TimeoutError), deadlines.within(max(0.0, min(seconds, self.poll_interval))):
            await ticket.wake.wait()

    def close(self) -> None:
        """Stop every wait now (shutdown): waiting calls return at once."""
        self.closed = True
        for queue in self._queues.values():
            for ticket in queue:
                ticket.wake.set()

    def notify(self, resource: str) -> None:
        """The resource was released here: wake its head waiter, if any."""
        queue = self._queues.get(resource)
        if queue:
            queue[0].wake.set()
