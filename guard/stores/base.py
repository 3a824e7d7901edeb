"""The seam between the guard service and storage: one small Protocol.

A fenced store keeps, per resource, a fence (the highest token applied or
promised) and the resource's key/value data, in the same durable store. ``write``
is one transaction: lock the fence, judge the token with :func:`guard.fence.admit`,
apply every op, advance the fence, commit; a rejection applies nothing (G3).
Idempotency keys are remembered in the same transaction as the write they name (G6).
To add a store, add a file beside this one and a branch in ``open_store``.

Optional, and expected of every networked store: ``async def healthy(self) -> bool``
(:class:`fencing._storage.HealthProbe`); see :mod:`lease_server.backends.base` for
what the server does with it and for the deadline on every other call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from fencing.types import Op, Record
from guard.fence import FenceMode


@dataclass(frozen=True, slots=True)
class WriteResult:
    """The fence after the write; ``replayed`` when an idempotency key matched."""

    fence: int
    replayed: bool = False


class GuardStore(Protocol):
    name: str
    #: True if ``write(..., mode=FenceMode.STRICT)`` can check the live lease in the
    #: write's own transaction (the lease backend lives in the same database).
    supports_strict: bool

    async def open(self) -> None:
        """Connect and create or upgrade the schema. Idempotent."""

    async def close(self) -> None:
        """Release connections. Idempotent."""

    async def write(
        self,
        resource: str,
        token: int,
        ops: Sequence[Op],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> WriteResult:
        """Apply ``ops`` atomically iff the fence rule admits ``token``; else ``StaleTokenError``.

        With a non-empty ``idempotency_key`` already recorded for ``resource``, apply
        nothing and return the recorded outcome with ``replayed=True``.
        """

    async def read(self, resource: str, key: str) -> Record | None:
        """The value under ``key`` and the token that wrote it, or None."""

    async def fence(self, resource: str, token: int) -> int:
        """Advance the fence to ``token`` (see :func:`guard.fence.advance`); return it."""

    async def describe_fence(self, resource: str) -> int:
        """The resource's fence, 0 if it was never written or fenced."""

    async def prune_idempotency(self, older_than_ms: int) -> int:
        """Forget idempotency keys recorded before ``older_than_ms`` (wall clock); count them."""
