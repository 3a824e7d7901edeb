"""Lease calls that arrive together share one backend step (group commit for leases).

:class:`GroupedLeases` is the :class:`~lease_server.backends.base.LeaseBackend` the
service calls: its ``acquire``, ``renew`` and ``release`` are queued in a
:class:`serving.group_commit.GroupCommit`, and whatever is queued when a slot frees up
goes to the backend's :meth:`~lease_server.backends.base.LeaseSteps.lease_steps` as
one transaction (PostgreSQL: one round trip; SQLite: one commit; Redis: one pipeline),
each call keeping its own verdict. A call waits only for the step in flight, never
for a timer: a lone call goes at once, through the backend's single call, as before.
It sits below the service handlers, so unary calls and calls of a lease stream batch
alike without knowing. An acquire here is one attempt: a waiting Acquire waits in the
service's queues (:mod:`lease_server.waiters`) holding no transaction, and every
attempt it makes is one step like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fencing.errors import LeaseLost
from fencing.types import LeaseState
from lease_server.backends.base import LeaseBackend, LeaseSteps
from lease_server.batches import one_step
from lease_server.leases import (
    AcquireItem,
    Grant,
    Held,
    LeaseStep,
    ReleaseItem,
    RenewItem,
    StepOutcome,
)
from serving.group_commit import GroupCommit

#: Most lease calls one step carries.
MAX_STEPS = 1000


class GroupedLeases:
    """``backend``'s lease calls, grouped; everything else passes through.

    ``group.batches`` and ``group.batched`` count the steps committed and the calls
    they carried (see :class:`~serving.group_commit.GroupCommit`).
    """

    def __init__(
        self,
        backend: LeaseBackend,
        *,
        max_steps: int = MAX_STEPS,
        on_step: Callable[[int], None] = lambda calls: None,
    ) -> None:
        self.backend = backend
        self._on_step = on_step
        self.name = backend.name
        self._steps: LeaseSteps | None = backend if isinstance(backend, LeaseSteps) else None
        concurrency = self._steps.step_concurrency if self._steps is not None else 1
        self.group: GroupCommit[LeaseStep, StepOutcome] = GroupCommit(
            self._commit, concurrency=concurrency, max_items=max_steps, inline_alone=True
        )

    async def _commit(self, steps: list[LeaseStep]) -> list[StepOutcome]:
        if len(steps) == 1 or self._steps is None:
            # Alone: the single call, exactly what an ungrouped server does.
            outcomes = [await one_step(self.backend, op) for op in steps]
        else:
            outcomes = await self._steps.lease_steps(steps)
        self._on_step(len(steps))
        return outcomes

    async def _run(self, op: LeaseStep) -> StepOutcome:
        if self._steps is None:
            outcome = await one_step(self.backend, op)  # nothing to group into
            self._on_step(1)
            return outcome
        return await self.group.submit_one(op)

    async def steps(self, ops: Sequence[LeaseStep]) -> list[StepOutcome]:
        """The verdicts of ``ops``, in order, decided together: one step with what else
        is queued, as single calls would be decided one by one (a lease stream's
        message of several calls submits them at once)."""
        if self._steps is None:
            outcomes = [await one_step(self.backend, op) for op in ops]
            self._on_step(len(ops))
            return outcomes
        return await self.group.submit(ops)

    async def open(self) -> None:
        await self.backend.open()

    async def close(self) -> None:
        await self.backend.close()

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, request_id: str
    ) -> Grant | Held:
        outcome = await self._run(AcquireItem(resource, holder, ttl_ms, request_id))
        assert isinstance(outcome, Grant | Held)
        return outcome

    async def renew(self, resource: str, token: int, holder: str, ttl_ms: int) -> Grant:
        outcome = await self._run(RenewItem(resource, token, holder, ttl_ms))
        if isinstance(outcome, LeaseLost):
            raise outcome
        assert isinstance(outcome, Grant)
        return outcome

    async def release(self, resource: str, token: int, holder: str) -> None:
        outcome = await self._run(ReleaseItem(resource, token, holder))
        if isinstance(outcome, LeaseLost):
            raise outcome

    async def describe(self, resource: str) -> LeaseState:
        return await self.backend.describe(resource)

    async def list_held(self, prefix: str, after: str, limit: int) -> list[LeaseState]:
        return await self.backend.list_held(prefix, after, limit)

    def on_release(self, callback: Callable[[str], None]) -> None:
        self.backend.on_release(callback)


def grouped(
    backend: LeaseBackend, on_step: Callable[[int], None] = lambda calls: None
) -> LeaseBackend:
    """``backend`` with its lease calls grouped (:class:`GroupedLeases`); ``on_step(n)``
    after each backend step, with the number of calls it carried."""
    return GroupedLeases(backend, on_step=on_step)


__all__ = ["GroupedLeases", "grouped"]
