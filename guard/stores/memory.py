"""In-memory fenced store: the honest fake for unit tests (no durability)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from fencing.errors import LeaseLost, StaleTokenError
from fencing.types import Op, Put, Record
from guard import fence as fence_rule
from guard.fence import FenceMode, Recorded
from guard.stores.base import (
    BatchedWrite,
    ResourceWrite,
    StoreManyResult,
    StoreWriteResult,
    Verdict,
)


class MemoryStore:
    name = "memory"
    #: Nothing here survives a restart: tokens would start over at 1.
    durability_warning = "in-memory state is lost on restart"
    supports_strict = False
    commit_concurrency = 1

    def __init__(self) -> None:
        self._fences: dict[str, int] = {}
        self._data: dict[tuple[str, str], Record] = {}
        # (resource, key) -> (what the write left, recorded_at_ms)
        self._keys: dict[tuple[str, str], tuple[Recorded, int]] = {}

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
    ) -> StoreWriteResult:
        # No await inside: the whole write is atomic with respect to other calls.
        judged = fence_rule.judge(
            resource,
            token,
            self._fences.get(resource, 0),
            mode,
            has_key=bool(idempotency_key),
            recorded=self._recorded(resource, idempotency_key),
            live=False,  # strict mode: no lease backend here, fail closed
        )
        if judged.replayed:
            return StoreWriteResult(judged.fence, judged.replayed_by_token)
        self._apply(resource, token, ops, judged.fence)
        if idempotency_key:
            self._keys[(resource, idempotency_key)] = (
                Recorded(judged.fence, token),
                time.time_ns() // 1_000_000,
            )
        return StoreWriteResult(judged.fence)

    def _recorded(self, resource: str, key: str) -> Recorded | None:
        seen = self._keys.get((resource, key)) if key else None
        return seen[0] if seen else None

    def _apply(self, resource: str, token: int, ops: Sequence[Op], new_fence: int) -> None:
        for op in ops:
            if isinstance(op, Put):
                self._data[(resource, op.key)] = Record(op.value, token)
            else:
                self._data.pop((resource, op.key), None)
        self._fences[resource] = new_fence

    async def write_many(
        self,
        writes: Sequence[ResourceWrite],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> StoreManyResult:
        claims = [(w.resource, w.token, self._fences.get(w.resource, 0)) for w in writes]
        replay = fence_rule.judge_all(
            claims,
            mode,
            has_key=bool(idempotency_key),
            recorded=[self._recorded(w.resource, idempotency_key) for w in writes],
            live=[False] * len(writes),  # strict mode: no lease backend here, fail closed
        )
        if replay is not None:
            return StoreManyResult(tuple(replay[0]), True, tuple(replay[1]))
        fences = fence_rule.admit_all(claims, mode)
        now_ms = time.time_ns() // 1_000_000
        for w, new_fence in zip(writes, fences, strict=True):
            self._apply(w.resource, w.token, w.ops, new_fence)
            if idempotency_key:
                self._keys[(w.resource, idempotency_key)] = (Recorded(new_fence, w.token), now_ms)
        return StoreManyResult(tuple(fences))

    async def write_batch(
        self, writes: Sequence[BatchedWrite], mode: FenceMode = FenceMode.MONOTONIC
    ) -> list[Verdict]:
        verdicts: list[Verdict] = []
        for w in writes:  # no await inside: the batch is atomic like one write
            try:
                verdicts.append(
                    await self.write(w.resource, w.token, w.ops, w.idempotency_key, mode)
                )
            except (StaleTokenError, LeaseLost) as exc:
                verdicts.append(exc)
        return verdicts

    async def read(self, resource: str, key: str) -> Record | None:
        return self._data.get((resource, key))

    async def list_records(
        self, resource: str, prefix: str, after: str, limit: int
    ) -> list[tuple[str, Record]]:
        keys = sorted(
            k for r, k in self._data if r == resource and k.startswith(prefix) and k > after
        )
        return [(k, self._data[(resource, k)]) for k in keys[:limit]]

    async def fence(self, resource: str, token: int, mode: FenceMode = FenceMode.MONOTONIC) -> int:
        new = fence_rule.advance(resource, token, self._fences.get(resource, 0))
        fence_rule.may_fence(resource, token, mode, live=False)
        self._fences[resource] = new
        return new

    async def reset_fence(self, resource: str, to_token: int) -> int:
        before = self._fences.get(resource, 0)
        self._fences[resource] = fence_rule.reset_to(resource, to_token, before)
        return before

    async def describe_fence(self, resource: str) -> int:
        return self._fences.get(resource, 0)

    async def prune_idempotency(self, older_than_ms: int) -> int:
        old = [k for k, (_, at) in self._keys.items() if at < older_than_ms]
        for k in old:
            del self._keys[k]
        return len(old)
