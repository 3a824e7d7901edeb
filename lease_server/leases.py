"""The lease rules, pure: what acquire, renew, release and describe do to one record.

Every backend keeps, per resource, a :class:`LeaseRecord` (a counter that is never
deleted, and the current holder, token, expiry and request id). Backends that run
Python inside their transaction (memory, SQLite) call these functions on the record
they locked; backends that decide in SQL or Lua implement the same rules there, and
the contract suite holds both to them.

Time is milliseconds on the backend's clock; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fencing.errors import LeaseLost


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """Everything stored for one resource. ``counter`` is the last token ever issued."""

    resource: str
    counter: int = 0
    holder: str = ""
    token: int = 0
    expires_at_ms: int = 0
    request_id: str = ""

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


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """The answer to Describe."""

    resource: str
    held: bool
    holder: str
    token: int
    remaining_ms: int
    last_token: int


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
    new = LeaseRecord(record.resource, token, holder, token, now_ms + ttl_ms, request_id)
    return new, Grant(record.resource, holder, token, ttl_ms)


def _require_current(record: LeaseRecord, token: int, holder: str, now_ms: int) -> None:
    if not record.live(now_ms) or record.token != token or (holder and record.holder != holder):
        raise LeaseLost(resource=record.resource, token=token)


def renew(
    record: LeaseRecord, token: int, holder: str, ttl_ms: int, now_ms: int
) -> tuple[LeaseRecord, Grant]:
    """Extend the current unexpired lease to ``now + ttl_ms``; ``LeaseLost`` otherwise.

    An empty ``holder`` skips the holder check: the token alone is the proof.
    """
    _require_current(record, token, holder, now_ms)
    new = replace(record, expires_at_ms=now_ms + ttl_ms)
    return new, Grant(record.resource, record.holder, token, ttl_ms)


def release(record: LeaseRecord, token: int, holder: str, now_ms: int) -> LeaseRecord:
    """Free the resource now; ``LeaseLost`` if ``token`` is not the current unexpired lease.

    The counter stays, so the next grant still gets a larger token.
    """
    _require_current(record, token, holder, now_ms)
    return LeaseRecord(record.resource, record.counter)


def describe(record: LeaseRecord, now_ms: int) -> LeaseInfo:
    live = record.live(now_ms)
    return LeaseInfo(
        resource=record.resource,
        held=live,
        holder=record.holder if live else "",
        token=record.token if live else 0,
        remaining_ms=record.remaining_ms(now_ms),
        last_token=record.counter,
    )
