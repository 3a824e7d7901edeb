"""The store seam: the public, versioned interface a fenced store implements.

This module is public API (:data:`STORE_API_VERSION`): a store may live in its own
package, registered by URL scheme through the ``fencing.guard_stores`` entry-point group
(:mod:`guard.stores`), and prove itself with the shipped contract suite
(:mod:`fencing.testing.stores`). A store built on it imports only this module,
:mod:`guard.fence` (the rule), :mod:`fencing.types` and :mod:`fencing.errors`.

A fenced store keeps, per resource, a fence (the highest token applied or promised) and
the resource's key/value data, in the same durable store. What every implementation
must guarantee:

1. **The fence check and the write are one atomic step.** ``write`` locks (or reads
   inside one transaction, one script, one statement) the resource's fence, judges the
   token with :func:`guard.fence.judge`, applies every op in order, advances the fence,
   and commits, all or nothing. Never read the fence in one call and write in another:
   a concurrent writer with a higher token must not slip in between (the suite's
   concurrent-writer cases catch a store that does). A rejection applies nothing (G3).
2. **The idempotency-key rule** (G6): a key is recorded, with the fence and the token
   that applied it, in the same transaction as the write it names, and judged *after*
   the token: a token below the fence is refused whether or not its key is known (the
   error says whether the key was applied, and by which token); a known key with an
   admissible token is a replay that applies nothing and names the token that applied
   it. A refused write records no key. Keys are per resource.
3. **Durable before acknowledged**: a write returns only once its fence and data
   survive a crash of the store's process (a committed, synced transaction). A store
   that cannot promise it says so in ``durability_warning`` (None when durable), which
   the guard logs and ``--require-durable`` refuses.
4. Equal tokens write again (one holder writes many times under one lease); the fence
   never goes down except by ``reset_fence``; fences are per resource.

To add a store in this repository, add a file beside this one and a line in
:data:`guard.stores.BUILTIN`; outside it, register an entry point.

Two more shapes of write, both one transaction:

* ``write_many``: several resources, each with its own token, judged together and
  applied all or nothing (:func:`guard.fence.admit_all`). Stores that lock rows lock
  them in sorted order, so two multi-writes over overlapping sets never deadlock.
* ``write_batch``: many *independent* writes packed into one transaction (group
  commit), each with its own verdict exactly as if it had been sent alone, in order:
  a stale write applies nothing and the others still land. The guard uses it to
  coalesce concurrent writes (:mod:`guard.commit`); strict mode is never batched.

Optional members: ``async def list_records(resource, prefix, after, limit)`` (the
:class:`RecordLister` protocol: up to ``limit`` ``(key, Record)`` of ``resource`` whose
key starts with ``prefix`` and sorts after ``after``, in code point order; the guard's
``ListRecords`` answers NOT_FOUND for a store without it, and the suite skips its case);
``durability_warning`` (above); ``api_version`` (default
:data:`STORE_API_VERSION`; the guard refuses a store declaring another); and, expected
of every networked store, ``async def healthy(self) -> bool``
(:class:`serving.storage.HealthProbe`); see :mod:`lease_server.backends.base` for what
the server does with it and for the deadline on every other call.

Versioning: a change that breaks an existing store (a new required member, a changed
guarantee) bumps :data:`STORE_API_VERSION`; new optional members do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from fencing.errors import LeaseLost, StaleTokenError
from fencing.types import Op, Record
from guard.fence import FenceMode


@dataclass(frozen=True, slots=True)
class StoreWriteResult:
    """A store's verdict on one write (the SDK's ``WriteResult`` is what the client
    makes of the reply): the fence after the write; ``replayed_by_token`` (non-zero,
    then ``replayed``) when an idempotency key matched: the token that applied the
    recorded write."""

    fence: int
    replayed_by_token: int = 0

    @property
    def replayed(self) -> bool:
        return self.replayed_by_token != 0


@dataclass(frozen=True, slots=True)
class ResourceWrite:
    """One resource's part of a multi-resource write (no ops: check and advance only)."""

    resource: str
    token: int
    ops: Sequence[Op] = ()


@dataclass(frozen=True, slots=True)
class StoreManyResult:
    """The fences after a multi-resource write, in the order of its resources; for a
    replay, ``replayed_by_tokens``: per resource the token that applied the recorded
    key (0 where it was pruned)."""

    fences: tuple[int, ...]
    replayed: bool = False
    replayed_by_tokens: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchedWrite:
    """One independent write of a batch: what a single ``write`` call would carry."""

    resource: str
    token: int
    ops: Sequence[Op]
    idempotency_key: str = ""


#: The version of this interface; a store may declare it as ``api_version``.
STORE_API_VERSION: Final = 1


#: A batched write's verdict: its result, or the error it alone was refused with.
Verdict = StoreWriteResult | StaleTokenError | LeaseLost


class GuardStore(Protocol):
    """A fenced store (module doc for what each member must guarantee).

    ``name`` is what logs and metrics call it (``"mysql"``); ``open`` is called once
    before any other call, ``close`` once at the end; every call may run concurrently
    with every other, from one event loop.
    """

    name: str
    #: True if ``write(..., mode=FenceMode.STRICT)`` can check the live lease in the
    #: write's own transaction (the lease backend lives in the same database).
    supports_strict: bool
    #: How many batched-write transactions the guard runs at once (:mod:`guard.commit`):
    #: 1 where writes are serial anyway (SQLite), a few for a connection pool.
    commit_concurrency: int

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
    ) -> StoreWriteResult:
        """Apply ``ops`` atomically iff :func:`guard.fence.judge` admits ``token``.

        ``StaleTokenError`` below the fence, ``LeaseLost`` in strict mode for a token
        that is not the live lease or job claim; both whether or not the key is known,
        saying whether it was applied and by which token. Then, with a non-empty
        ``idempotency_key`` already recorded for ``resource``, apply nothing and return
        the recorded fence with ``replayed_by_token`` = the token that applied it.
        """

    async def read(self, resource: str, key: str) -> Record | None:
        """The value under ``key`` and the token that wrote it, or None."""

    async def fence(self, resource: str, token: int, mode: FenceMode = FenceMode.MONOTONIC) -> int:
        """Advance the fence to ``token`` (see :func:`guard.fence.advance`); return it.

        In strict mode the token must also be the live lease or job claim
        (:func:`guard.fence.may_fence`, ``LeaseLost`` otherwise)."""

    async def reset_fence(self, resource: str, to_token: int) -> int:
        """Set the fence to ``to_token``, lower or higher; return the fence it replaced.

        The operator's recovery from a fence a token nobody was granted wedged (see
        :func:`guard.fence.reset_to`); the service authorises and audits it."""

    async def describe_fence(self, resource: str) -> int:
        """The resource's fence, 0 if it was never written or fenced."""

    async def prune_idempotency(self, older_than_ms: int) -> int:
        """Forget idempotency keys recorded before ``older_than_ms`` (wall clock); count them."""

    async def write_many(
        self,
        writes: Sequence[ResourceWrite],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> StoreManyResult:
        """Judge every resource's token, then apply every op, in one transaction.

        Resources are distinct (the service checks). Judged by
        :func:`guard.fence.judge_all`: one stale token raises ``StaleTokenError`` for
        the first stale resource in sorted order (strict: then ``LeaseLost`` for the
        first not live) and applies nothing, whether or not the key is known. The
        ``idempotency_key`` is recorded under every resource with its fence and token;
        a repeat (the key found under the first resource) applies nothing and returns
        the recorded fences and tokens with ``replayed=True``.
        """

    async def write_batch(
        self, writes: Sequence[BatchedWrite], mode: FenceMode = FenceMode.MONOTONIC
    ) -> list[Verdict]:
        """Apply independent writes in one transaction, in order, one verdict each.

        Each write is judged as ``write`` would judge it at its place in the batch
        (a later write sees the fences and idempotency keys earlier ones left). A
        store failure fails the whole batch (nothing applied). ``mode`` is never
        ``strict``: strict writes check the live lease as close to their own commit
        as they can, so the guard sends them one by one.
        """


#: Every member a store must have (attributes and methods), for :func:`missing_members`.
REQUIRED_MEMBERS: Final = (
    "name",
    "supports_strict",
    "commit_concurrency",
    "open",
    "close",
    "write",
    "read",
    "fence",
    "reset_fence",
    "describe_fence",
    "prune_idempotency",
    "write_many",
    "write_batch",
)


def missing_members(store: object) -> list[str]:
    """The members of :class:`GuardStore` that ``store`` lacks (empty: it has them all)."""
    return [m for m in REQUIRED_MEMBERS if not hasattr(store, m)]


class RecordLister(Protocol):
    """The optional member a store lists its records with (``ListRecords``)."""

    async def list_records(
        self, resource: str, prefix: str, after: str, limit: int
    ) -> list[tuple[str, Record]]:
        """Up to ``limit`` records of ``resource`` whose key starts with ``prefix`` and
        sorts after ``after`` ('': from the first), in key order by code point (the
        order of their UTF-8 bytes)."""
        ...
