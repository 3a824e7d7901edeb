"""In-memory fenced store: the honest fake for unit tests (no durability)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from fencing.types import Op, Put, Record
from guard import fence as fence_rule
from guard.fence import FenceMode
from guard.stores.base import WriteResult


class MemoryStore:
    name = "memory"
    #: Nothing here survives a restart: tokens would start over at 1.
    durability_warning = "in-memory state is lost on restart"
    supports_strict = False

    def __init__(self) -> None:
        self._fences: dict[str, int] = {}
        self._data: dict[tuple[str, str], Record] = {}
        self._keys: dict[tuple[str, str], tuple[int, int]] = {}  # -> (fence, recorded_at_ms)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def healthy(self) -> bool:
        """Always: memory does not go away (see ``HealthProbe``)."""
        return True

    async def write(
        self,
        resource: str,
        token: int,
        ops: Sequence[Op],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> WriteResult:
        # No await inside: the whole write is atomic with respect to other calls.
        if idempotency_key and (resource, idempotency_key) in self._keys:
            return WriteResult(self._keys[(resource, idempotency_key)][0], replayed=True)
        new_fence = fence_rule.admit(resource, token, self._fences.get(resource, 0), mode)
        for op in ops:
            if isinstance(op, Put):
                self._data[(resource, op.key)] = Record(op.value, token)
            else:
                self._data.pop((resource, op.key), None)
        self._fences[resource] = new_fence
        if idempotency_key:
            self._keys[(resource, idempotency_key)] = (new_fence, time.time_ns() // 1_000_000)
        return WriteResult(new_fence)

    async def read(self, resource: str, key: str) -> Record | None:
        return self._data.get((resource, key))

    async def fence(self, resource: str, token: int) -> int:
        new = fence_rule.advance(resource, token, self._fences.get(resource, 0))
        self._fences[resource] = new
        return new

    async def describe_fence(self, resource: str) -> int:
        return self._fences.get(resource, 0)

    async def prune_idempotency(self, older_than_ms: int) -> int:
        old = [k for k, (_, at) in self._keys.items() if at < older_than_ms]
        for k in old:
            del self._keys[k]
        return len(old)
