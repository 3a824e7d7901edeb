"""Group commit: concurrent writes packed into one store transaction, one verdict each.

Writes that arrive while the store is busy wait in a queue; as soon as one of the
``concurrency`` transaction slots frees up, everything queued (up to ``max_writes``
writes and ``max_ops`` ops) goes to :meth:`GuardStore.write_batch` as one transaction.
An idle guard sends a lone write at once, alone, through :meth:`GuardStore.write`: no
timer, no added latency. Under load, batches grow by themselves to what arrives during
one commit, so one round trip and one fsync serve many writes. Each write keeps the
verdict it would have had alone at its place in the batch (see ``write_batch``).

Strict mode is never batched (the service sends strict writes straight to the store):
a strict write checks the live lease as close to its own commit as it can.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence

from fencing.errors import LeaseLost, StaleTokenError
from guard.fence import FenceMode
from guard.stores.base import BatchedWrite, GuardStore, Verdict

log = logging.getLogger(__name__)

#: Most writes, and ops, one batch may carry (one store transaction).
MAX_BATCH_WRITES = 1000
MAX_BATCH_OPS = 10_000


class _Ticket:
    """One ``submit`` call's writes: their verdicts, filled in as their batches commit
    (a call's writes may span batches), and one future for the caller."""

    __slots__ = ("done", "left", "verdicts")

    def __init__(self, count: int, done: asyncio.Future[list[Verdict]]) -> None:
        self.verdicts: list[Verdict | None] = [None] * count
        self.left = count
        self.done = done

    def settle(self, i: int, verdict: Verdict) -> None:
        self.verdicts[i] = verdict
        self.left -= 1
        if self.left == 0 and not self.done.done():  # its caller may have gone away
            self.done.set_result([v for v in self.verdicts if v is not None])

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


class GroupCommit:
    """Packs writes submitted concurrently into ``store.write_batch`` transactions.

    ``concurrency`` batches run at once (1 for SQLite, whose writes are serial
    anyway; a few for a pooled PostgreSQL). ``batches`` and ``batched_writes`` count
    what was committed, for metrics and benchmarks.
    """

    def __init__(
        self,
        store: GuardStore,
        mode: FenceMode,
        *,
        concurrency: int = 1,
        max_writes: int = MAX_BATCH_WRITES,
        max_ops: int = MAX_BATCH_OPS,
    ) -> None:
        if mode is FenceMode.STRICT:
            raise ValueError("strict writes are not batched")
        self.store = store
        self.mode = mode
        self.concurrency = max(1, concurrency)
        self.max_writes = max_writes
        self.max_ops = max_ops
        self.batches = 0
        self.batched_writes = 0
        self._queue: deque[tuple[BatchedWrite, _Ticket, int]] = deque()
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, writes: Sequence[BatchedWrite]) -> list[Verdict]:
        """Queue ``writes`` and wait for their verdicts (in order).

        A store failure (``BackendUnavailableError``) is raised for every write of the
        batches it hit; a stale token is a verdict, not an exception.
        """
        if not writes:
            return []
        ticket = _Ticket(len(writes), asyncio.get_running_loop().create_future())
        self._queue.extend((w, ticket, i) for i, w in enumerate(writes))
        self._kick()
        return await ticket.done

    def _kick(self) -> None:
        while self._queue and self._running < self.concurrency:
            batch = [self._queue.popleft()]
            ops = len(batch[0][0].ops)
            while self._queue and len(batch) < self.max_writes:
                more = len(self._queue[0][0].ops)
                if ops + more > self.max_ops:
                    break
                batch.append(self._queue.popleft())
                ops += more
            self._running += 1
            task = asyncio.get_running_loop().create_task(self._commit(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _commit(self, batch: list[tuple[BatchedWrite, _Ticket, int]]) -> None:
        try:
            try:
                verdicts = await self._write([w for w, _, _ in batch])
            except BaseException as exc:
                for _, ticket, _ in batch:
                    ticket.fail(exc)
                if not isinstance(exc, Exception):
                    raise
                return
            self.batches += 1
            self.batched_writes += len(batch)
            for (_, ticket, i), verdict in zip(batch, verdicts, strict=True):
                ticket.settle(i, verdict)
        finally:
            self._running -= 1
            self._kick()

    async def _write(self, writes: list[BatchedWrite]) -> list[Verdict]:
        if len(writes) > 1:
            return await self.store.write_batch(writes, self.mode)
        w = writes[0]
        try:
            result = await self.store.write(
                w.resource, w.token, w.ops, w.idempotency_key, self.mode
            )
        except (StaleTokenError, LeaseLost) as exc:  # a verdict, not a store failure
            return [exc]
        return [result]
