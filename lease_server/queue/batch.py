"""Batched completes: Completes that arrive together share one backend transaction.

Every Complete (the RPC, and the completes a Claim carries) is a *group*: its jobs
and the queue it names, judged all or none. Groups submitted while the backend is
busy wait in a queue; as soon as one of ``concurrency`` transaction slots frees up,
everything queued (up to ``max_jobs`` jobs) goes to
:meth:`~lease_server.queue.backends.base.QueueBackend.complete_batch` as one
transaction, where each group keeps the verdict it would have had alone. An idle
server sends a lone Complete at once: no timer, no added latency; under load a
batch grows by itself to what arrived during one commit, so one round trip and one
commit serve many workers (:mod:`serving.group_commit`, the mechanism the guard shares).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fencing.errors import LeaseLost
from lease_server.queue.backends.base import CompleteGroup, QueueBackend
from serving.group_commit import GroupCommit

#: Most jobs one batch may carry (one backend transaction).
MAX_BATCH_JOBS = 1000

Verdict = LeaseLost | None


class CompleteBatcher:
    """Packs Completes submitted concurrently into ``backend.complete_batch`` calls
    (:class:`serving.group_commit.GroupCommit` over the backend).

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
        self._woke = woke
        self._group: GroupCommit[CompleteGroup, Verdict] = GroupCommit(
            self._complete,
            concurrency=concurrency,
            max_items=max_jobs,
            weight=lambda group: len(group[0]),
            max_weight=max_jobs,
        )

    @property
    def batches(self) -> int:
        return self._group.batches

    @property
    def batched(self) -> int:
        return self._group.batched

    @property
    def idle(self) -> bool:
        """No batch is committing nor waiting: a complete now would go alone."""
        return self._group.idle

    async def submit(self, groups: Sequence[CompleteGroup]) -> list[Verdict]:
        """Queue ``groups`` and wait for their verdicts (in order).

        A backend failure (``BackendUnavailableError``) is raised for every group of the
        batches it hit; a stale token is a verdict (``LeaseLost``), not an exception.
        """
        return await self._group.submit(groups)

    async def _complete(self, groups: list[CompleteGroup]) -> list[Verdict]:
        verdicts, woken = await self.backend.complete_batch(groups)
        for queue in woken:
            self._woke(queue)
        return list(verdicts)
