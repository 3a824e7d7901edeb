"""Plain data shared by the SDK and the servers: write ops and the token a caller holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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
class Record:
    """A stored value and the token of the write that stored it."""

    value: bytes
    written_by_token: int


__all__ = ["Claim", "Delete", "Fenced", "Op", "Put", "Record"]
