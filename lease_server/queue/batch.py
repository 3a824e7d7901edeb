"""Batched completes: Completes that arrive together share one backend transaction.

Every Complete (the RPC, and the completes a Claim carries) is a *group*: its jobs
and the queue it names, judged all or none. Groups submitted while the backend is
busy wait in a queue; as soon as one of ``concurrency`` transaction slots frees up,
everything queued (up to ``max_jobs`` jobs) goes to
:meth:`~lease_server.queue.backends.base.QueueBackend.complete_batch` as one
transaction, where each group keeps the verdict it would have had alone. An idle
server sends a lone Complete at once: no timer, no added latency; under load a
batch grows by itself to what arrived during one commit, so one round trip and one
commit serve many workers (the group commit of :mod:`guard.commit`, for jobs).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence

from fencing.errors import LeaseLost
from lease_server.queue.backends.base import CompleteGroup, QueueBackend

#: Most jobs one batch may carry (one backend transaction).
MAX_BATCH_JOBS = 1000

Verdict = LeaseLost | None


class _Ticket:
    """One ``submit`` call's groups: their verdicts, filled in as their batches commit."""

    __slots__ = ("done", "left", "verdicts")

    def __init__(self, count: int, done: asyncio.Future[list[Verdict]]) -> None:
        self.verdicts: list[Verdict] = [None] * count
        self.left = count
        self.done = done

    def settle(self, i: int, verdict: Verdict) -> None:
        self.verdicts[i] = verdict
        self.left -= 1
        if self.left == 0 and not self.done.done():  # its caller may have gone away
            self.done.set_result(self.verdicts)

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


class CompleteBatcher:
    """Packs Completes submitted concurrently into ``backend.complete_batch`` calls.

    ``woke(queue)`` is called for each queue where a finished job's ordering key let
    the next job become ready. ``batches`` and ``batched`` count the transactions and
    the groups they carried (for tests and benchmarks).
    """

    def __init__(
        self,
        backend: QueueBackend,
        woke: Callable[[str], None],
        *,
        concurrency: int = 1,
        max_jobs: int = MAX_BATCH_JOBS,
    ) -> None:
        self.backend = backend
        self.concurrency = max(1, concurrency)
        self.max_jobs = max_jobs
        self.batches = 0
        self.batched = 0
        self._woke = woke
        self._queue: deque[tuple[CompleteGroup, _Ticket, int]] = deque()
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def idle(self) -> bool:
        """No batch is committing nor waiting: a complete now would go alone."""
        return self._running == 0 and not self._queue

    async def submit(self, groups: Sequence[CompleteGroup]) -> list[Verdict]:
        """Queue ``groups`` and wait for their verdicts (in order).

        A backend failure (``BackendUnavailableError``) is raised for every group of the
        batches it hit; a stale token is a verdict (``LeaseLost``), not an exception.
        """
        if not groups:
            return []
        ticket = _Ticket(len(groups), asyncio.get_running_loop().create_future())
        self._queue.extend((g, ticket, i) for i, g in enumerate(groups))
        self._kick()
        return await ticket.done

    def _kick(self) -> None:
        while self._queue and self._running < self.concurrency:
            batch = [self._queue.popleft()]
            jobs = len(batch[0][0][0])
            while self._queue and jobs + len(self._queue[0][0][0]) <= self.max_jobs:
                group = self._queue.popleft()
                batch.append(group)
                jobs += len(group[0][0])
            self._running += 1
            task = asyncio.get_running_loop().create_task(self._commit(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _commit(self, batch: list[tuple[CompleteGroup, _Ticket, int]]) -> None:
        try:
            try:
                verdicts, woken = await self.backend.complete_batch([g for g, _, _ in batch])
            except BaseException as exc:
                for _, ticket, _ in batch:
                    ticket.fail(exc)
                if not isinstance(exc, Exception):
                    raise
                return
            self.batches += 1
            self.batched += len(batch)
            for queue in woken:
                self._woke(queue)
            for (_, ticket, i), verdict in zip(batch, verdicts, strict=True):
                ticket.settle(i, verdict)
        finally:
            self._running -= 1
            self._kick()
