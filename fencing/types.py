"""Plain data shared by the SDK and the servers: write ops, the token a caller holds,
and the wire's metadata keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

#: Initial metadata of a ``Watch`` stream: the revision the stream starts after (the
#: server's head when the client asked "from now"), so a client can resume from it.
WATCH_START_KEY = "fencing-watch-after"
#: Initial metadata of a ``Watch`` stream: the identity of the server's event log, which
#: a resume cursor belongs to (absent where the backend's log has none).
WATCH_LOG_KEY = "fencing-watch-log"
#: What the queue server's refusal of a cancelled job's claim says (LEASE_LOST): the
#: workers tell an operator's cancel from a claim taken over by it.
JOB_CANCELLED = "was cancelled by an operator"
#: Initial metadata of a ``Session`` stream: how many calls the server takes in flight
#: on it at once (a call beyond that is answered ``RESOURCE_EXHAUSTED``); with
#: :data:`SESSION_MAX_UPKEEP_IN_FLIGHT_KEY`, how many acquires.
SESSION_MAX_IN_FLIGHT_KEY = "fencing-session-max-in-flight"
#: Initial metadata of a ``Session`` stream: how many renewals and releases (the
#: :data:`UPKEEP_CALLS`) the server takes in flight on it apart from the acquires, so
#: that acquires waiting in line never hold up the renewal of a lease already held.
#: Absent (an older server): one limit for every call.
SESSION_MAX_UPKEEP_IN_FLIGHT_KEY = "fencing-session-max-upkeep-in-flight"
#: The ``SessionCall`` kinds counted in the upkeep limit: the calls on leases already held.
UPKEEP_CALLS = frozenset({"renew", "release", "renew_many", "release_many"})


class Fenced(Protocol):
    """Anything that names a resource and carries a fencing token for it (a lease)."""

    @property
    def resource(self) -> str: ...

    @property
    def token(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Claim:
    """A (resource, token) pair held without a lease handle, e.g. from the CLI or a job."""

    resource: str
    token: int


@dataclass(frozen=True, slots=True)
class Put:
    """Store ``value`` under ``key`` in the guarded resource."""

    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove ``key`` from the guarded resource (no error if absent)."""

    key: str


Op = Put | Delete


@dataclass(frozen=True, slots=True)
class LeaseState:
    """Who holds a resource now: what ``describe`` returns to a client, and what a lease
    backend answers the server's Describe with (the same fields either side)."""

    resource: str
    held: bool
    holder: str
    #: The live lease's token (0 if none is held).
    token: int
    remaining_ms: int
    #: The highest token ever granted for the resource.
    last_token: int
    #: The held lease's own ttl (ms), which a renewal naming none renews by: the ttl it
    #: was granted or last renewed with (0 when not held).
    ttl_ms: int = 0


@dataclass(frozen=True, slots=True)
class Record:
    """A stored value and the token of the write that stored it."""

    value: bytes
    written_by_token: int


__all__ = [
    "JOB_CANCELLED",
    "WATCH_LOG_KEY",
    "WATCH_START_KEY",
    "Claim",
    "Delete",
    "Fenced",
    "LeaseState",
    "Op",
    "Put",
    "Record",
]
