"""The seam between the lease service and storage: two small Protocols.

A backend makes each of acquire, renew and release one atomic step on its own
clock, keeps a per-resource counter that is never deleted (so tokens only grow,
G1), and wraps its driver's errors once into ``BackendUnavailableError`` with the
cause chained. Waiting, validation and the wire live above it, in the service.
To add a backend, add a file beside this one and a branch in ``open_backend``.

Optional, and expected of every networked backend: ``async def healthy(self) ->
bool`` (:class:`serving.storage.HealthProbe`), one cheap round trip to the database.
The server calls it every ``--health-interval`` seconds and reports NOT_SERVING on
``grpc.health.v1`` while it says False. Every other coroutine method is called with
a deadline (``--backend-timeout``) that ends it with ``BackendUnavailableError``;
list methods that must not be bounded in a class attribute ``unbounded_methods``.

The event log
-------------
A backend should also keep an **event log** (:class:`EventLog`), which ``Watch``
streams and guards in ``watch`` mode follow. A backend without one still serves
leases, but ``Watch`` answers ``UNIMPLEMENTED`` and no EXPIRED events exist, so
guards in ``watch`` mode pointed at it never follow (they say so). The service
tells them apart with ``isinstance(backend, EventLog)``. The rules, which every
implementation must keep (the contract suite ``tests/contract/test_lease_events.py``
checks them, and skips backends without a log):

1. **Same transaction.** Each successful acquire, renew and release appends its
   events (:func:`lease_server.leases.transitions` says which) in the same atomic
   step as the state change: a reader never sees a grant without its event or
   an event without its grant. A refused or replayed acquire appends nothing.
2. **Revisions.** Each event gets the next revision of the backend's one
   counter (1, 2, 3 ... across all resources), stored durably with the log and
   never reused, not even after pruning or a restart.
3. **Commit order.** Appends are serialized, so revisions become visible in
   order: once a reader has seen revision N, no event with a revision <= N can
   appear later. (A PostgreSQL sequence alone does not give this, since sequence
   values commit out of order: number events only while holding one counter row,
   held to commit, as ``0013_event_sequencer.sql`` does, appending unnumbered and
   numbering whatever committed whenever the row is free. In Redis, do
   the ``INCR`` and the append in the same Lua script; on a Redis Cluster that
   script must reach the log's keys and the resource's keys in one slot, which
   per-resource hash tags do not allow: a cluster needs another shape.)
4. **Expiry exactly once.** A lease that ends by expiry gets exactly one EXPIRED
   event: appended either by :meth:`EventLog.expire_due` (the sweeper, which
   clears the expired lease in the same step), or, if a takeover comes first, by
   that acquire, immediately before its ACQUIRED. Both are conditional on the
   lease still being there, so several servers sweeping one backend never
   append it twice. (A store that expires leases by itself, such as Redis
   ``PEXPIRE``, must remember which token is owed an EXPIRED event, e.g. in a
   sorted set of expiries that release and renew update.)
5. **Identity.** The log has an id (:meth:`EventLog.log_id`), drawn at random once,
   when the log is created, and stored with it: the same log answers the same id
   after any restart, another log (another database, schema, key prefix, or one
   that was lost and started over) another id. A revision means something only in
   its log, so a reader resuming with a cursor of another log is told (RESYNC),
   never served from the same number in the wrong log.
6. **Retention.** The log is bounded: :meth:`EventLog.prune_events` drops the
   oldest events and records the highest revision dropped as
   ``compacted_through``; a reader asking for events after an older revision is
   told so (:meth:`lease_server.leases.EventPage.gap`) and must resync.

A queue backend that shares the backend's database appends the events of job
claims to the same log under the same rules (``LoggedEvent.job_id`` set; see
:mod:`lease_server.queue.backends.base` and :func:`lease_server.queue.jobs.transitions`).

A backend that cannot keep one log for all resources (a Redis Cluster, where a
script reaches one hash slot and each resource's keys have their own) may keep
one per resource instead, a :class:`ResourceEventLog`: the rules hold per
resource (revisions 1, 2, 3 ... of that resource's log; rule 4 with "a read of
the resource's log" in place of the sweeper), and ``Watch`` serves one resource
at a time; a prefix, which needs one order across resources, is refused. Such a
backend says ``event_log_scope = "resource"`` (the default is ``"global"``), so
:func:`event_log_of` and :func:`resource_log_of` tell the two apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from fencing.errors import LeaseLost
from fencing.types import LeaseState
from lease_server.leases import (
    EventPage,
    Grant,
    Held,
    LeaseStep,
    LoggedEvent,
    ReleaseItem,
    RenewItem,
    Scope,
    StepOutcome,
)


class LeaseBackend(Protocol):
    """Durable lease state for many resources."""

    #: Short name for logs and metrics ("memory", "sqlite", ...).
    name: str

    async def open(self) -> None:
        """Connect and create or upgrade the schema. Idempotent."""

    async def close(self) -> None:
        """Release connections. Idempotent."""

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, request_id: str
    ) -> Grant | Held:
        """Grant ``resource`` to ``holder`` if it is free or expired, in one atomic step.

        A retry with the current lease's non-empty ``request_id`` and holder returns
        that lease (``Grant.replayed``). Otherwise returns :class:`Held`.

        With an event log, a grant appends ACQUIRED, preceded by EXPIRED of the
        previous token when it takes over an expired lease not yet swept.
        """

    async def renew(self, resource: str, token: int, holder: str, ttl_ms: int) -> Grant:
        """Extend the current unexpired lease to now + ttl_ms, or raise ``LeaseLost``.

        With an event log, appends nothing: a renewal is not an event (the revision,
        and the fence of a guard following the log, do not move on one).
        """

    async def release(self, resource: str, token: int, holder: str) -> None:
        """Free the resource now, or raise ``LeaseLost``. With an event log, appends RELEASED."""

    async def describe(self, resource: str) -> LeaseState:
        """Current state; an unknown resource is free with ``last_token == 0``."""

    async def list_held(self, prefix: str, after: str, limit: int) -> list[LeaseState]:
        """The held (unexpired, by the backend's clock) leases whose resource starts with
        ``prefix`` (byte-wise, no wildcards) and sorts after ``after`` (empty: from the
        start), in resource order by code point, at most ``limit`` (>= 1) of them.

        One read; a lease changing under it is listed as it was or as it is, never
        twice across pages (each page starts after the previous page's last resource).
        """

    def on_release(self, callback: Callable[[str], None]) -> None:
        """Register ``callback(resource)`` for releases made through *other* processes.

        Backends that can observe them (PostgreSQL LISTEN/NOTIFY, Redis pub/sub) call
        it from the event loop so waiters wake promptly; embedded backends, which only
        see their own process, keep the callback and never call it.
        """


@runtime_checkable
class EventLog(Protocol):
    """A lease backend's event log (see the module docstring for the rules).

    Implemented by the same object as :class:`LeaseBackend`; its acquire, renew
    and release then also append their events (rules 1-4).
    """

    async def head_revision(self) -> int:
        """The revision of the newest event appended (0 if none ever was)."""

    async def log_id(self) -> str:
        """The log's identity (rule 5): stable for this log, different for any other.

        A log that is lost with its backend's data (a Redis that forgot) loses its id
        with it, and the log that starts over gets a new one.
        """

    async def events_after(self, revision: int, scope: Scope, limit: int) -> EventPage:
        """Events in ``scope`` with a revision greater than ``revision``, oldest first.

        Returns an :class:`EventPage` read so that nothing can be missed in between:

        - ``head``: the newest revision in the whole log, read *first*; every event
          with a revision <= ``head`` is committed and visible (rule 3);
        - ``events``: the matching events with ``revision < r <= head``, ascending,
          at most ``limit`` (>= 1). Fewer than ``limit`` means there is no other
          matching event up to ``head``, so the reader's next cursor is ``head``;
          a full page means "ask again after the last one";
        - ``compacted_through``: the highest revision pruned (0 if none), read
          *after* the events, so a prune racing the read is reported, never hidden.

        Matching is exact on ``scope.resource`` when set, else a byte-wise prefix
        test on ``scope.prefix`` (no LIKE wildcards; the empty prefix matches all).
        """

    async def expire_due(self, limit: int) -> list[LoggedEvent]:
        """The sweeper's step: clear up to ``limit`` leases whose expiry has passed.

        In one atomic step per lease (or for the whole batch): re-check on the
        backend's clock that the lease with that token is still there and expired
        (:func:`lease_server.leases.expire`), clear it, and append its EXPIRED
        event. Returns the events appended, in revision order: empty when none
        was due or another process cleared them first. Run by every lease server
        about every 50 ms, so an EXPIRED event is at most ~100 ms late.
        """

    async def prune_events(self, keep: int) -> int:
        """Drop all but the newest ``keep`` events; return how many were dropped.

        Raises ``compacted_through`` to the highest revision dropped, in the same
        atomic step as the delete. Never drops an event with a revision above
        ``head - keep`` and never lowers ``head``.
        """

    def on_events(self, callback: Callable[[int], None]) -> None:
        """Register ``callback(head)`` to be called, on the event loop, after events
        up to revision ``head`` were committed.

        Call it after this object's own appends; backends that can also observe
        other processes' appends (PostgreSQL LISTEN/NOTIFY, Redis pub/sub) call it
        for those too. Callers also poll :meth:`head_revision` about every 100 ms,
        so a backend that cannot observe other processes (SQLite shared by two
        servers) is still followed, only later. The callback must not block.
        """


@runtime_checkable
class LeaseBatches(Protocol):
    """Many leases in one atomic step: AcquireMany, and sessions (RenewMany, ReleaseMany).

    Implemented by the same object as :class:`LeaseBackend` (every backend here
    does). A backend without it still serves the batch RPCs, one call per lease
    (:class:`lease_server.batches.OneByOne`): correct, but N round trips instead of
    one, and an AcquireMany that backs out by releasing what it took instead of
    never taking it. With an event log, each lease's change appends its events
    exactly as the single call would, in the same transaction.
    """

    async def acquire_many(
        self, resources: Sequence[str], holder: str, ttl_ms: int, request_id: str
    ) -> list[Grant] | Held:
        """Acquire every resource (distinct, sorted by the caller) in one transaction.

        All or nothing (:func:`lease_server.leases.acquire_all`): either every
        resource is granted (or replayed), or nothing changes and the first held
        resource in sorted order is returned. Locks are taken in sorted order.
        """

    async def renew_many(self, items: Sequence[RenewItem]) -> list[Grant | LeaseLost]:
        """Renew each lease as ``renew`` would, in one transaction; one outcome each."""

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[LeaseLost | None]:
        """Release each lease as ``release`` would, in one transaction; None when released."""


@runtime_checkable
class LeaseSteps(Protocol):
    """Independent lease calls of different callers in one backend step: group commit.

    Implemented by the same object as :class:`LeaseBackend` (every backend here does);
    :class:`lease_server.grouped.GroupedLeases` gives it what arrived together. A
    backend without it serves every call alone (:class:`lease_server.batches.OneByOne`
    shows the meaning).
    """

    #: How many steps may be in flight at once (a pooled database: a few; one writer: 1).
    step_concurrency: int

    async def lease_steps(self, steps: Sequence[LeaseStep]) -> list[StepOutcome]:
        """Run each step as its single call would (acquire attempts, never waiting;
        renewals; releases) in one transaction or round trip; one verdict each, in order.

        Each step is judged alone: a refusal (Held, LeaseLost) is its verdict and fails
        no other step. Steps on the same resource apply in the order given, each seeing
        the one before (a release then an acquire of one resource: the acquire is
        granted). Rows are locked in sorted resource order (then the event log), so two
        processes' batches over overlapping resources wait for each other, never
        deadlock. Each change appends its events exactly as the single call would, in
        the same transaction; listeners are told after it committed. An exception means
        the step failed as a whole: no verdict for any of them (for a database, nothing
        committed, or the outcome of the commit is unknown, as for a single call).
        """


@runtime_checkable
class ResourceEventLog(Protocol):
    """An event log kept per resource (see the module docstring); the same object as
    the :class:`LeaseBackend`, whose acquire, renew and release append to the log of
    their resource in the same atomic step."""

    async def resource_head(self, resource: str) -> int:
        """The newest revision of ``resource``'s log (0 if it has none)."""

    async def resource_events_after(self, resource: str, revision: int, limit: int) -> EventPage:
        """As :meth:`EventLog.events_after`, for one resource's log. Appends first, in
        the same atomic step, the EXPIRED owed to a lease that expired unlogged, so
        a reader never sees the log without it (rule 4)."""

    def on_resource_events(self, callback: Callable[[str, int], None]) -> None:
        """Register ``callback(resource, head)``, called on the event loop after events
        up to ``head`` of ``resource``'s log were committed (own appends, and other
        processes' where observable). The same head may be reported again (an own
        append heard back from other processes' channel): keep the highest. Callers
        also poll; the callback must not block."""


def _scope(backend: object) -> str:
    return str(getattr(backend, "event_log_scope", "global"))


def event_log_of(backend: LeaseBackend) -> EventLog | None:
    """The backend's event log, or None if it keeps none or only per-resource logs
    (Watch is then unavailable, or limited to one resource: :func:`resource_log_of`)."""
    if isinstance(backend, EventLog) and _scope(backend) == "global":
        return backend
    return None


def resource_log_of(backend: LeaseBackend) -> ResourceEventLog | None:
    """The backend's per-resource event logs, if that is what it keeps."""
    if isinstance(backend, ResourceEventLog) and _scope(backend) == "resource":
        return backend
    return None
