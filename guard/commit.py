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

import logging
from collections.abc import Sequence

from fencing.errors import LeaseLost, StaleTokenError
from guard.fence import FenceMode
from guard.stores.base import BatchedWrite, GuardStore, Verdict
from serving.group_commit import GroupCommit as _Group

log = logging.getLogger(__name__)

#: Most writes, and ops, one batch may carry (one store transaction).
MAX_BATCH_WRITES = 1000
MAX_BATCH_OPS = 10_000


class GroupCommit:
    """Packs writes submitted concurrently into ``store.write_batch`` transactions
    (:class:`serving.group_commit.GroupCommit` over the store).

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
        self._group: _Group[BatchedWrite, Verdict] = _Group(
            self._write,
            concurrency=concurrency,
            max_items=max_writes,
            weight=lambda w: len(w.ops),
            max_weight=max_ops,
        )

    @property
    def concurrency(self) -> int:
        return self._group.concurrency

    @property
    def batches(self) -> int:
        return self._group.batches

    @property
    def batched_writes(self) -> int:
        return self._group.batched

    async def submit(self, writes: Sequence[BatchedWrite]) -> list[Verdict]:
        """Queue ``writes`` and wait for their verdicts (in order).

        A store failure (``BackendUnavailableError``) is raised for every write of the
        batches it hit; a stale token is a verdict, not an exception.
        """
        return await self._group.submit(writes)

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
