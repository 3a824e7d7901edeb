"""Group commit of lease calls (lease_server/grouped.py) over the memory backend: what
arrives while a step is in flight shares the next one, a lone call goes alone, and a
failed step fails exactly the calls it carried."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from fencing.errors import BackendUnavailableError, LeaseLost
from lease_server.backends.memory import MemoryBackend
from lease_server.clock import ManualClock
from lease_server.grouped import GroupedLeases
from lease_server.leases import Grant, Held, LeaseStep, StepOutcome


class CountingMemory(MemoryBackend):
    """The memory backend, recording each ``lease_steps`` batch; ``fail`` makes the next
    one raise (as a database that went away would), and every call yields to the loop
    once, as a real round trip does."""

    def __init__(self) -> None:
        super().__init__(ManualClock())
        self.sizes: list[int] = []
        self.fail = False

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, request_id: str
    ) -> Grant | Held:
        await asyncio.sleep(0)
        return await super().acquire(resource, holder, ttl_ms, request_id)

    async def lease_steps(self, steps: Sequence[LeaseStep]) -> list[StepOutcome]:
        await asyncio.sleep(0)
        self.sizes.append(len(steps))
        if self.fail:
            self.fail = False
            raise BackendUnavailableError("the database went away")
        return await super().lease_steps(steps)


async def test_a_lone_call_goes_alone_through_the_single_call() -> None:
    backend = CountingMemory()
    leases = GroupedLeases(backend)
    grant = await leases.acquire("r", "h", 5000, "")
    assert isinstance(grant, Grant)
    await leases.renew("r", grant.token, "h", 5000)
    await leases.release("r", grant.token, "h")
    assert backend.sizes == []
    assert (leases.group.batches, leases.group.batched) == (3, 3)


async def test_calls_that_arrive_together_share_one_step_with_their_own_verdicts() -> None:
    backend = CountingMemory()
    carried: list[int] = []
    leases = GroupedLeases(backend, on_step=carried.append)
    held = await leases.acquire("taken", "other", 5000, "")
    assert isinstance(held, Grant)
    outcomes = await asyncio.gather(
        *(leases.acquire(f"r{i}", f"h{i}", 5000, "") for i in range(20)),
        leases.acquire("taken", "me", 5000, ""),
        leases.renew("taken", held.token + 1, "", 5000),
        return_exceptions=True,
    )
    grants, refused, lost = outcomes[:20], outcomes[20], outcomes[21]
    assert all(isinstance(g, Grant) and g.holder == f"h{i}" for i, g in enumerate(grants))
    assert isinstance(refused, Held) and refused.holder == "other"
    assert isinstance(lost, LeaseLost)
    # The first went alone (nothing was in flight); the 21 behind it in one step.
    assert backend.sizes == [21]
    assert (leases.group.batches, leases.group.batched) == (3, 23)
    assert carried == [1, 1, 21]  # what the step metrics count


async def test_a_failed_step_fails_the_calls_it_carried_and_no_later_ones() -> None:
    backend = CountingMemory()
    leases = GroupedLeases(backend)
    backend.fail = True
    outcomes = await asyncio.gather(
        *(leases.acquire(f"r{i}", "h", 5000, "") for i in range(5)), return_exceptions=True
    )
    assert isinstance(outcomes[0], Grant)  # alone, before the failure
    assert all(isinstance(o, BackendUnavailableError) for o in outcomes[1:])
    assert not (await backend.describe("r1")).held
    again = await asyncio.gather(*(leases.acquire(f"r{i}", "h", 5000, "") for i in range(1, 5)))
    assert all(isinstance(g, Grant) for g in again)


async def test_a_backend_without_lease_steps_serves_every_call_alone() -> None:
    class Plain:
        """Only the single calls (a third-party backend): nothing to group into."""

        name = "plain"

        def __init__(self) -> None:
            self.inner = MemoryBackend(ManualClock())

        def __getattr__(self, name: str) -> object:
            if name in ("lease_steps", "step_concurrency"):
                raise AttributeError(name)
            return getattr(self.inner, name)

    leases = GroupedLeases(Plain())  # type: ignore[arg-type]
    grants = await asyncio.gather(*(leases.acquire(f"r{i}", "h", 5000, "") for i in range(3)))
    assert all(isinstance(g, Grant) for g in grants)
    assert leases.group.batches == 0
    with pytest.raises(LeaseLost):
        await leases.release("r0", 999, "h")
