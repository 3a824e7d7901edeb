"""Group commit: items submitted concurrently share one backend step, one verdict each.

The one mechanism behind the guard's batched writes (:mod:`guard.commit`), the queue's
batched completes (:mod:`lease_server.queue.batch`) and the lease calls that arrive
together (:mod:`lease_server.grouped`). Items submitted while the backend is busy wait
in a queue; as soon as one of ``concurrency`` slots frees up (after a step of several
callers, on the loop's next turn, so that those it answered may queue again first),
everything
queued (up to ``max_items`` items and ``max_weight`` weight) goes to ``commit`` as one
step, which returns one verdict per item, in order. An idle backend gets a lone item at once,
alone: no timer, so a lone caller pays nothing; under load a batch grows by itself to
what arrived during one step, so one round trip (and one commit) serves many callers.

Rules the ``commit`` function keeps: each item's verdict is the one it would have had
alone at its place in the batch, a verdict is a value (never an exception that would
fail the others), and an exception means the whole step failed: it is raised to every
caller whose items were in it (for a database, a failure before or during the commit:
what a lone call's caller would have seen too). An item whose caller went away before
its step was sent is dropped; once sent, a step runs to its end.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741 (an item)
V = TypeVar("V")

#: Most items one step carries, unless told otherwise.
MAX_BATCH_ITEMS = 1000


class _Ticket(Generic[V]):
    """One ``submit`` call's items: their verdicts, filled in as their batches commit
    (a call's items may span batches), and one future for the caller."""

    __slots__ = ("done", "left", "verdicts")

    def __init__(self, count: int, done: asyncio.Future[list[V]]) -> None:
        self.verdicts: list[V | None] = [None] * count
        self.left = count
        self.done = done

    def settle(self, i: int, verdict: V) -> None:
        self.verdicts[i] = verdict
        self.left -= 1
        if self.left == 0 and not self.done.done():  # its caller may have gone away
            self.done.set_result(self.verdicts)  # type: ignore[arg-type]

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


def _one(item: object) -> int:
    return 1


class GroupCommit(Generic[I, V]):
    """Packs items submitted concurrently into ``commit(items)`` calls.

    ``weight(item)`` counts toward ``max_weight`` (the ops of a guarded write, the
    jobs of a complete); a single item heavier than the limit still goes, alone.
    ``inline_alone``: the items of one ``submit`` while nothing is running nor queued
    (a lone call, or the calls of one message) run as a step in their caller's task (no
    task, no future: what an ungrouped call costs), so it is cancelled with its caller,
    as an ungrouped call is; otherwise every step runs in a task of its own and
    finishes even if its callers went away.
    ``batches`` and ``batched`` count the steps committed and the items they carried
    (for metrics, tests and benchmarks).
    """

    def __init__(
        self,
        commit: Callable[[list[I]], Awaitable[list[V]]],
        *,
        concurrency: int = 1,
        max_items: int = MAX_BATCH_ITEMS,
        weight: Callable[[I], int] = _one,
        max_weight: int | None = None,
        inline_alone: bool = False,
    ) -> None:
        self._commit_fn = commit
        self._inline_alone = inline_alone
        self.concurrency = max(1, concurrency)
        self.max_items = max(1, max_items)
        self._weight = weight
        self.max_weight = max_weight
        self.batches = 0
        self.batched = 0
        self._queue: deque[tuple[I, _Ticket[V], int]] = deque()
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def idle(self) -> bool:
        """No step is running nor waiting: an item submitted now would go alone."""
        return self._running == 0 and not self._queue

    async def submit(self, items: Sequence[I]) -> list[V]:
        """Queue ``items`` and wait for their verdicts (in order); the step's exception
        if one of the steps that carried them failed."""
        if not items:
            return []
        if self._inline_alone and self._running == 0 and not self._queue and self._fits(items):
            return await self._inline(list(items))
        ticket: _Ticket[V] = _Ticket(len(items), asyncio.get_running_loop().create_future())
        self._queue.extend((item, ticket, i) for i, item in enumerate(items))
        self._kick()
        return await ticket.done

    async def submit_one(self, item: I) -> V:
        """:meth:`submit` of one item."""
        (verdict,) = await self.submit((item,))
        return verdict

    def _fits(self, items: Sequence[I]) -> bool:
        """Whether ``items`` make one step within the limits."""
        if len(items) > self.max_items:
            return False
        return self.max_weight is None or sum(map(self._weight, items)) <= self.max_weight

    async def _inline(self, items: list[I]) -> list[V]:
        """An idle backend's step of one caller's items, run in the caller's task."""
        self._running += 1
        try:
            verdicts = await self._commit_fn(items)
            self.batches += 1
            self.batched += len(items)
        finally:
            self._free_slot(answered=len(items))  # what queued up meanwhile goes next
        return verdicts

    def _drop_abandoned(self) -> None:
        """Forget queued items whose caller went away (cancelled) before they were sent:
        nobody waits for their verdict, and an ungrouped call cancelled this early would
        not have reached the backend either."""
        while self._queue and self._queue[0][1].done.done():
            self._queue.popleft()

    def _kick(self) -> None:
        self._drop_abandoned()
        while self._queue and self._running < self.concurrency:
            first = self._queue.popleft()
            batch = [first]
            weight = self._weight(first[0])
            self._drop_abandoned()
            while self._queue and len(batch) < self.max_items:
                more = self._weight(self._queue[0][0])
                if self.max_weight is not None and weight + more > self.max_weight:
                    break
                batch.append(self._queue.popleft())
                weight += more
                self._drop_abandoned()
            self._running += 1
            task = asyncio.get_running_loop().create_task(self._commit(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _commit(self, batch: list[tuple[I, _Ticket[V], int]]) -> None:
        try:
            try:
                verdicts = await self._commit_fn([item for item, _, _ in batch])
            except BaseException as exc:
                for _, ticket, _ in batch:
                    ticket.fail(exc)
                if not isinstance(exc, Exception):
                    raise
                return
            self.batches += 1
            self.batched += len(batch)
            for (_, ticket, i), verdict in zip(batch, verdicts, strict=True):
                ticket.settle(i, verdict)
        finally:
            self._free_slot(answered=len(batch))

    def _free_slot(self, answered: int) -> None:
        """A step that ``answered`` items ended: its slot frees up. If it answered
        several, or others wait, the next step forms on the loop's next turn: the step's
        callers were woken first (their futures were just settled), so those that call
        again at once (a server's handlers, a client's loop) queue up before it forms
        and share it, instead of the first of them going alone and the others in a step
        after it (with one slot, half as many steps). A lone caller with no one waiting
        frees it at once: its next call goes alone, inline if asked, as before."""
        if answered > 1 or self._queue:
            asyncio.get_running_loop().call_soon(self._release_slot)
        else:
            self._release_slot()

    def _release_slot(self) -> None:
        self._running -= 1
        self._kick()
