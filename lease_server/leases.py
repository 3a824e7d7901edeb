"""The lease rules, pure: what acquire, renew, release and describe do to one record.

Every backend keeps, per resource, a :class:`LeaseRecord` (a counter that is never
deleted, and the current holder, token, expiry and request id). Backends that run
Python inside their transaction (memory, SQLite) call these functions on the record
they locked; backends that decide in SQL or Lua implement the same rules there, and
the contract suite holds both to them.

Every change of a record is also a :class:`Transition` for the event log that
``Watch`` streams (:func:`transitions`, :func:`expire`); a backend numbers each one
with the next revision and appends it in the same transaction as the change.

Time is milliseconds on the backend's clock; nothing here reads a clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from fencing.errors import LeaseLost
from fencing.types import LeaseState


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """Everything stored for one resource. ``counter`` is the last token ever issued."""

    resource: str
    counter: int = 0
    holder: str = ""
    token: int = 0
    expires_at_ms: int = 0
    request_id: str = ""
    #: The lease's own ttl: the one it was granted, or last renewed, with (0 when free,
    #: or for a lease stored before the ttl was kept). A renewal that names no ttl
    #: extends the lease by this, as an etcd keep-alive does.
    ttl_ms: int = 0

    def live(self, now_ms: int) -> bool:
        """True while a lease is granted and not yet expired at ``now_ms``."""
        return self.token != 0 and self.expires_at_ms > now_ms

    def remaining_ms(self, now_ms: int) -> int:
        return max(0, self.expires_at_ms - now_ms) if self.live(now_ms) else 0


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease handed to ``holder``; ``ttl_ms`` is what is left of it as of the decision."""

    resource: str
    holder: str
    token: int
    ttl_ms: int
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Held:
    """Acquire found an unexpired lease of someone else."""

    resource: str
    holder: str
    token: int
    remaining_ms: int


def acquire(
    record: LeaseRecord, holder: str, ttl_ms: int, request_id: str, now_ms: int
) -> tuple[LeaseRecord, Grant | Held]:
    """Grant if free or expired (token = counter + 1), replay a retried request, or report held.

    A retry is recognised by a non-empty ``request_id`` equal to the one that won the
    current, unexpired lease, from the same holder: it gets the same token back with
    the time that is left, and the record is unchanged.
    """
    if record.live(now_ms):
        if request_id and record.request_id == request_id and record.holder == holder:
            grant = Grant(record.resource, holder, record.token, record.remaining_ms(now_ms), True)
            return record, grant
        return record, Held(
            record.resource, record.holder, record.token, record.remaining_ms(now_ms)
        )
    token = record.counter + 1
    new = LeaseRecord(record.resource, token, holder, token, now_ms + ttl_ms, request_id, ttl_ms)
    return new, Grant(record.resource, holder, token, ttl_ms)


@dataclass(frozen=True, slots=True)
class RenewItem:
    """One renewal of a batch (a session's keepalive): what ``renew`` takes."""

    resource: str
    token: int
    holder: str
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class ReleaseItem:
    """One release of a batch: what ``release`` takes."""

    resource: str
    token: int
    holder: str


@dataclass(frozen=True, slots=True)
class AcquireItem:
    """One acquire attempt of a batch of lease steps: what ``acquire`` takes."""

    resource: str
    holder: str
    ttl_ms: int
    request_id: str


#: One independent lease call of a batch (:meth:`LeaseSteps.lease_steps
#: <lease_server.backends.base.LeaseSteps.lease_steps>`): an acquire attempt (never
#: waiting), a renewal or a release, each from its own caller.
LeaseStep = AcquireItem | RenewItem | ReleaseItem
#: A step's verdict: acquire -> Grant or Held; renew -> Grant or LeaseLost; release ->
#: None (released) or LeaseLost. A value, never raised: one step's refusal fails no other.
StepOutcome = Grant | Held | LeaseLost | None


def step(record: LeaseRecord, op: LeaseStep, now_ms: int) -> tuple[LeaseRecord, StepOutcome]:
    """Apply one lease step to its resource's record: :func:`acquire`, :func:`renew` or
    :func:`release`, with a refusal returned as the verdict (and the record unchanged)."""
    if isinstance(op, AcquireItem):
        return acquire(record, op.holder, op.ttl_ms, op.request_id, now_ms)
    try:
        if isinstance(op, RenewItem):
            return renew(record, op.token, op.holder, op.ttl_ms, now_ms)
        return release(record, op.token, op.holder, now_ms), None
    except LeaseLost as exc:
        return record, exc


def acquire_all(
    records: Sequence[LeaseRecord], holder: str, ttl_ms: int, request_id: str, now_ms: int
) -> tuple[list[LeaseRecord], list[Grant] | Held]:
    """:func:`acquire` for every record, all or nothing.

    ``records`` are in the order the caller locked them (sorted by resource). If any
    is held by someone else (not a replay of this ``request_id`` and holder), the
    first such is returned as :class:`Held` and every record stays as it was;
    otherwise each is granted (or replayed) as :func:`acquire` would.
    """
    for record in records:
        if record.live(now_ms):
            _, outcome = acquire(record, holder, ttl_ms, request_id, now_ms)
            if isinstance(outcome, Held):
                return list(records), outcome
    new_records: list[LeaseRecord] = []
    grants: list[Grant] = []
    for record in records:
        new, outcome = acquire(record, holder, ttl_ms, request_id, now_ms)
        assert isinstance(outcome, Grant)
        new_records.append(new)
        grants.append(outcome)
    return new_records, grants


def _require_current(record: LeaseRecord, token: int, holder: str, now_ms: int) -> None:
    if not record.live(now_ms) or record.token != token or (holder and record.holder != holder):
        raise LeaseLost(resource=record.resource, token=token)


#: What a renewal without a ttl extends a lease by when the lease's own ttl is unknown
#: (granted before the backend kept it): the SDK's default ttl, which renewals sent then.
LEGACY_TTL_MS = 10_000


def renew_ttl(requested_ms: int, own_ms: int) -> int:
    """The ttl a renewal grants: the one requested, or, for 0 (none named), the lease's own
    (``LeaseRecord.ttl_ms``; :data:`LEGACY_TTL_MS` if it was never stored)."""
    return requested_ms or own_ms or LEGACY_TTL_MS


def renew(
    record: LeaseRecord, token: int, holder: str, ttl_ms: int, now_ms: int
) -> tuple[LeaseRecord, Grant]:
    """Extend the current unexpired lease to ``now + ttl`` (:func:`renew_ttl`: ``ttl_ms``,
    or the lease's own ttl when ``ttl_ms`` is 0); ``LeaseLost`` otherwise. The ttl
    granted becomes the lease's own, for the next renewal that names none.

    An empty ``holder`` skips the holder check: the token alone is the proof.
    """
    _require_current(record, token, holder, now_ms)
    ttl = renew_ttl(ttl_ms, record.ttl_ms)
    # Built whole: dataclasses.replace looks up the fields on every call, and a RenewMany
    # renews thousands of leases in one transaction.
    new = LeaseRecord(
        resource=record.resource,
        counter=record.counter,
        holder=record.holder,
        token=record.token,
        expires_at_ms=now_ms + ttl,
        request_id=record.request_id,
        ttl_ms=ttl,
    )
    return new, Grant(record.resource, record.holder, token, ttl)


def release(record: LeaseRecord, token: int, holder: str, now_ms: int) -> LeaseRecord:
    """Free the resource now; ``LeaseLost`` if ``token`` is not the current unexpired lease.

    The counter stays, so the next grant still gets a larger token.
    """
    _require_current(record, token, holder, now_ms)
    return LeaseRecord(record.resource, record.counter)


def describe(record: LeaseRecord, now_ms: int) -> LeaseState:
    live = record.live(now_ms)
    return LeaseState(
        resource=record.resource,
        held=live,
        holder=record.holder if live else "",
        token=record.token if live else 0,
        remaining_ms=record.remaining_ms(now_ms),
        last_token=record.counter,
        ttl_ms=renew_ttl(0, record.ttl_ms) if live else 0,
    )


def list_held(
    records: Iterable[LeaseRecord], prefix: str, after: str, limit: int, now_ms: int
) -> list[LeaseState]:
    """The rule of ``LeaseBackend.list_held`` over records (any order): the live ones
    under ``prefix`` past ``after``, in resource (code point) order, at most ``limit``."""
    picked = sorted(
        (r for r in records if r.resource.startswith(prefix) and r.resource > after),
        key=lambda r: r.resource,
    )
    held = (describe(r, now_ms) for r in picked if r.live(now_ms))
    return list(itertools.islice(held, limit))


# -- the event log ---------------------------------------------------------------------------


class TransitionKind(StrEnum):
    """What happened to a resource's lease (``LeaseEvent.Kind`` on the wire, read by the
    SDK as ``fencing.client.EventKind``, which adds RESYNC)."""

    ACQUIRED = "acquired"
    RENEWED = "renewed"
    RELEASED = "released"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class Transition:
    """One change of a lease, before the backend gives it a revision.

    ``token`` and ``holder`` are the lease's own: the new grant's for ACQUIRED, the
    renewed one's for RENEWED, the lease that ended for RELEASED and EXPIRED.
    ``ttl_ms`` is the validity granted (ACQUIRED, RENEWED) and 0 otherwise.
    ``job_id`` and ``queue`` name the job when the change is a job's claim
    (:func:`lease_server.queue.jobs.transitions`); 0 and "" for a lease.
    """

    kind: TransitionKind
    resource: str
    token: int
    holder: str
    ttl_ms: int = 0
    job_id: int = 0
    queue: str = ""

    def numbered(self, revision: int) -> LoggedEvent:
        return LoggedEvent(
            revision,
            self.kind,
            self.resource,
            self.token,
            self.holder,
            self.ttl_ms,
            self.job_id,
            self.queue,
        )


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """A :class:`Transition` appended to a backend's event log at ``revision`` (sent as
    a ``LeaseEvent`` on the wire; the SDK's ``fencing.client.LeaseEvent`` is what a
    client makes of it).

    Revisions are assigned by the backend: 1, 2, 3, ... across all resources of
    the backend, in commit order, never reused, surviving restarts where the
    backend is durable.
    """

    revision: int
    kind: TransitionKind
    resource: str
    token: int
    holder: str
    ttl_ms: int = 0
    job_id: int = 0
    queue: str = ""


@dataclass(frozen=True, slots=True)
class Scope:
    """Which resources an event reader wants: one ``resource``, or every name that
    starts with ``prefix`` (byte-wise, no wildcards; the empty prefix means all)."""

    resource: str = ""
    prefix: str = ""

    def matches(self, resource: str) -> bool:
        if self.resource:
            return resource == self.resource
        return resource.startswith(self.prefix)


@dataclass(frozen=True, slots=True)
class EventPage:
    """The answer to ``LeaseBackend.events_after``; see its docstring."""

    events: tuple[LoggedEvent, ...]
    head: int
    compacted_through: int

    def gap(self, after: int) -> bool:
        """True when events after ``after`` may be missing: the caller must resync.

        Either they were pruned (``after < compacted_through``), or ``after`` is
        ahead of this log (``after > head``: a cursor from another or a reset backend).
        """
        return after < self.compacted_through or after > self.head


def transitions(old: LeaseRecord, new: LeaseRecord, now_ms: int) -> list[Transition]:
    """What changing ``old`` into ``new`` at ``now_ms`` appends to the event log, in order.

    - a lease that ended (the old token is gone) is RELEASED if it was live at
      ``now_ms`` (only :func:`release` ends a live lease) and EXPIRED otherwise,
      so a takeover of an expired lease appends EXPIRED(t) and then ACQUIRED(t+1);
    - a new token is ACQUIRED with the ttl granted;
    - the same token with a moved expiry (a renewal) appends nothing: a lease's
      revision, and the fence of a guard that follows the log, never move on a
      renewal, and the log is not written at the rate leases are kept alive;
    - no change (a refused or replayed acquire) appends nothing.
    """
    if old == new:
        return []
    out: list[Transition] = []
    if old.token and old.token != new.token:
        kind = TransitionKind.RELEASED if old.live(now_ms) else TransitionKind.EXPIRED
        out.append(Transition(kind, old.resource, old.token, old.holder))
    if new.token and new.token != old.token:
        ttl_ms = new.expires_at_ms - now_ms
        out.append(Transition(TransitionKind.ACQUIRED, new.resource, new.token, new.holder, ttl_ms))
    return out


def expire(record: LeaseRecord, now_ms: int) -> LeaseRecord:
    """The expiry sweeper's rule: a granted lease whose expiry passed becomes free.

    Returns ``record`` itself when there is nothing to expire (no lease, or still
    live), so a sweeper that lost the race to another one changes nothing and
    appends nothing. The counter stays. Describe cannot tell the difference: an
    expired lease already reads as free.
    """
    if record.token == 0 or record.live(now_ms):
        return record
    return LeaseRecord(record.resource, record.counter)
