"""Many leases per call for a backend that cannot do them in one step: one call per lease.

:func:`batches_of` gives the service a :class:`~lease_server.backends.base.LeaseBatches`
for any backend: the backend itself when it implements one (every backend shipped
here does, in one transaction), else :class:`OneByOne`, which keeps the meaning of
each call but not its cost or its atomicity: AcquireMany takes the resources one by
one in sorted order and, when one is held, releases what it took (others may see
those leases for that moment, and a crash in between leaves them to expire).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from fencing.errors import LeaseLost
from lease_server.backends.base import LeaseBackend, LeaseBatches, LeaseSteps
from lease_server.leases import (
    AcquireItem,
    Grant,
    Held,
    LeaseStep,
    ReleaseItem,
    RenewItem,
    StepOutcome,
)


class OneByOne:
    """:class:`LeaseBatches` and :class:`LeaseSteps` over the single-lease calls of
    ``backend``."""

    #: One call at a time: each step is its own round trip.
    step_concurrency = 1

    def __init__(self, backend: LeaseBackend) -> None:
        self.backend = backend

    async def lease_steps(self, steps: Sequence[LeaseStep]) -> list[StepOutcome]:
        return [await one_step(self.backend, op) for op in steps]

    async def acquire_many(
        self, resources: Sequence[str], holder: str, ttl_ms: int, request_id: str
    ) -> list[Grant] | Held:
        grants: list[Grant] = []
        for resource in resources:
            outcome = await self.backend.acquire(resource, holder, ttl_ms, request_id)
            if isinstance(outcome, Held):
                for grant in grants:
                    if not grant.replayed:
                        with contextlib.suppress(LeaseLost):
                            await self.backend.release(grant.resource, grant.token, holder)
                return outcome
            grants.append(outcome)
        return grants

    async def renew_many(self, items: Sequence[RenewItem]) -> list[Grant | LeaseLost]:
        outcomes: list[Grant | LeaseLost] = []
        for item in items:
            try:
                outcomes.append(
                    await self.backend.renew(item.resource, item.token, item.holder, item.ttl_ms)
                )
            except LeaseLost as exc:
                outcomes.append(exc)
        return outcomes

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[LeaseLost | None]:
        outcomes: list[LeaseLost | None] = []
        for item in items:
            try:
                await self.backend.release(item.resource, item.token, item.holder)
            except LeaseLost as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)
        return outcomes


async def one_step(backend: LeaseBackend, op: LeaseStep) -> StepOutcome:
    """One lease step through the backend's single call, a refusal as the verdict."""
    if isinstance(op, AcquireItem):
        return await backend.acquire(op.resource, op.holder, op.ttl_ms, op.request_id)
    try:
        if isinstance(op, RenewItem):
            return await backend.renew(op.resource, op.token, op.holder, op.ttl_ms)
        await backend.release(op.resource, op.token, op.holder)
    except LeaseLost as exc:
        return exc
    return None


def steps_of(backend: LeaseBackend) -> LeaseSteps:
    """The backend's own :class:`LeaseSteps`, or :class:`OneByOne` over it."""
    return backend if isinstance(backend, LeaseSteps) else OneByOne(backend)


def batches_of(backend: LeaseBackend) -> LeaseBatches:
    """The backend's own :class:`LeaseBatches`, or :class:`OneByOne` over it."""
    return backend if isinstance(backend, LeaseBatches) else OneByOne(backend)
