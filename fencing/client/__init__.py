"""The fencing clients: :class:`LeaseClient` and :class:`GuardClient` (blocking)."""

from fencing.client._core import LeaseState, WriteResult
from fencing.client.guard import GuardClient
from fencing.client.lease import Lease, LeaseClient

__all__ = ["GuardClient", "Lease", "LeaseClient", "LeaseState", "WriteResult"]
