"""Test helpers for users of the SDK: a real lease server and guard on free ports.

::

    from fencing.testing import running_servers

    with running_servers() as servers:              # in-memory lease server + guard
        leases = LeaseClient(servers.lease_address)
        guard = GuardClient(servers.guard_address)
        queue = QueueClient(servers.queue_address)  # hosted by the lease server

The servers are the real gRPC servers on 127.0.0.1 with port 0; only their storage is
in memory unless you pass ``sqlite:`` URLs (or any other backend URL). They are started
by :mod:`fencingctl.stack`, which stands above the servers; this module only keeps the
documented import path, and ``import fencing`` never loads it.

For authors of a fenced store: :mod:`fencing.testing.stores` is the store contract suite
(imported on its own; it needs pytest).
"""

from fencingctl.stack import RunningServers, running_servers

__all__ = ["RunningServers", "running_servers"]
