"""Free loopback ports, for a process that cannot bind port 0 and report what it got.

Our own servers bind port 0 and say which port they were given. Some processes
must be told their port up front (PostgreSQL, Redis, etcd, a metrics endpoint
named on a command line): :func:`free_port` picks one that was free a moment ago.
Another process may take it before it is used; callers that start a server on it
retry on a bind failure or live with the rare clash in a test.
"""

from __future__ import annotations

import socket

#: A Redis Cluster node also listens on its port + 10000 (the cluster bus).
REDIS_CLUSTER_BUS_OFFSET = 10_000

_ATTEMPTS = 200


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(*, host: str = "127.0.0.1", also_offset: int = 0) -> int:
    """A TCP port on ``host`` that was free a moment ago; with ``also_offset`` one whose
    partner port (port + ``also_offset``, e.g. :data:`REDIS_CLUSTER_BUS_OFFSET`) was free too.

    Raises ``RuntimeError`` when no such pair turns up after a few hundred tries.
    """
    for _ in range(_ATTEMPTS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if not also_offset:
            return port
        if port + also_offset < 65536 and _bindable(port + also_offset, host):
            return port
    raise RuntimeError(f"no free port pair {also_offset} apart found on {host}")


__all__ = ["REDIS_CLUSTER_BUS_OFFSET", "free_port"]
