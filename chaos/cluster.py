"""The cluster of one chaos run: its topology, and every process and proxy in it.

:class:`Cluster` starts the backend (a throwaway PostgreSQL or Redis, or SQLite
files), the lease server and the guard, starts clients (each optionally behind its
own fault proxies to the lease server and to the guard), and stops everything in
:meth:`Cluster.stop`, which ``with Cluster(...)`` calls in ``finally``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from chaos.processes import Proc
from chaos.proxy import ThreadedFaultProxy
from chaos.servers import Postgres, Redis, ServerProc, guard_server, lease_server
from serving import urls
from serving.ports import free_port

#: Backends a run can keep the leases and the guard's store in: every kind of storage
#: (:mod:`serving.urls`) but memory, which dies with the server process a run crashes.
BACKENDS: Final = tuple(kind for kind in urls.KINDS if kind != urls.MEMORY)


@dataclass(frozen=True, slots=True)
class Topology:
    """What one run needs: the backend, the guard's mode, where proxies sit.

    ``backend`` is ``sqlite`` (embedded in the lease server and the guard, one file
    each), ``postgres`` or ``redis`` (a throwaway server shared by both, so the
    guard's store and the leases are in one database, as ``strict`` needs).
    ``proxy_lease``/``proxy_guard`` put a fault proxy of its own between every client
    and the lease server / the guard. ``watch``: the guard follows the lease
    server's events (``--lease-addr``, directly, not through a proxy).
    ``redis_persistence``: see :data:`REDIS_PERSISTENCE`. ``guard_args``: extra
    guard flags. ``lease_servers``: how many lease servers share the backend (more
    than one on PostgreSQL or Redis only; the guard watches the first).
    ``metrics``: every server serves ``/metrics`` on a port of its own
    (:attr:`Cluster.metrics_ports`). ``leak``: a soak's leak control, see
    :mod:`chaos.leaky` (never in a real run).
    """

    backend: str = "sqlite"
    fence_mode: str = "monotonic"
    proxy_lease: bool = False
    proxy_guard: bool = False
    watch: bool = False
    redis_persistence: str = "aof-always"
    guard_args: tuple[str, ...] = ()
    lease_servers: int = 1
    metrics: bool = False
    leak: str = ""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r} (expected one of {BACKENDS})")
        if self.lease_servers < 1:
            raise ValueError(f"lease_servers must be >= 1, got {self.lease_servers}")
        if self.lease_servers > 1 and self.backend == "sqlite":
            raise ValueError("several lease servers need a shared backend (postgres or redis)")


@dataclass
class ClientNode:
    """One workload client: its name, its current process, and its proxies (if any)."""

    name: str
    proc: Proc
    lease_target: str
    guard_target: str
    lease_proxy: ThreadedFaultProxy | None = None
    guard_proxy: ThreadedFaultProxy | None = None
    argv: list[str] = field(default_factory=list)

    @property
    def incarnation(self) -> int:
        """How many times this client's process was started, minus one."""
        return max(0, self.proc.starts - 1)


class Cluster:
    """The processes and proxies of one run, started by :meth:`start`, all stopped by :meth:`stop`.

    ``workdir`` receives ``logs/`` and the embedded databases. Clients are added
    with :meth:`add_client` once the servers run. ``with Cluster(...) as c`` starts
    and always stops (clients first, then proxies, servers, databases).
    """

    def __init__(self, topology: Topology, workdir: Path, *, seed: int = 0) -> None:
        self.topology = topology
        self.workdir = workdir
        self.seed = seed
        self.database: Postgres | Redis | None = None
        self.lease: ServerProc | None = None
        self.leases: list[ServerProc] = []
        self.guard: ServerProc | None = None
        #: server name -> the port its ``/metrics`` is served on (``topology.metrics``).
        self.metrics_ports: dict[str, int] = {}
        self.clients: dict[str, ClientNode] = {}
        self._proxies: list[ThreadedFaultProxy] = []

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def lease_target(self) -> str:
        assert self.lease is not None
        return self.lease.target

    @property
    def guard_target(self) -> str:
        assert self.guard is not None
        return self.guard.target

    def backend_urls(self) -> tuple[str, str]:
        """(lease backend URL, guard store URL) for this topology."""
        if self.topology.backend == "sqlite":
            data = self.workdir / "data"
            data.mkdir(parents=True, exist_ok=True)
            return f"sqlite:///{data / 'leases.db'}", f"sqlite:///{data / 'guard.db'}"
        assert self.database is not None
        return self.database.url, self.database.url

    def start(self) -> None:
        """Start the database (if any), the lease server and the guard."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.topology.backend == "postgres":
            self.database = Postgres(self.workdir)
            self.database.start()
        elif self.topology.backend == "redis":
            self.database = Redis(self.workdir, self.topology.redis_persistence)
            self.database.start()
        lease_url, store_url = self.backend_urls()
        leak = self.topology.leak
        for i in range(self.topology.lease_servers):
            name = "lease-server" if i == 0 else f"lease-server-{i}"
            server = lease_server(
                lease_url, self.workdir, name, extra_args=self._metrics_args(name), leak=leak
            )
            self.leases.append(server)
            server.start()
        self.lease = self.leases[0]
        guard_args = list(self.topology.guard_args) + self._metrics_args("guard")
        if self.topology.watch:
            guard_args += ["--lease-addr", self.lease.target]
        self.guard = guard_server(
            store_url, self.topology.fence_mode, self.workdir, extra_args=guard_args, leak=leak
        )
        self.guard.start()

    def _metrics_args(self, name: str) -> list[str]:
        if not self.topology.metrics:
            return []
        # Chosen once: a restart serves on the same port, so samples keep their source.
        self.metrics_ports[name] = free_port()
        return ["--metrics-port", str(self.metrics_ports[name])]

    def _proxy(self, upstream: str, seed: int) -> ThreadedFaultProxy:
        host, port = upstream.rsplit(":", 1)
        proxy = ThreadedFaultProxy(host, int(port), seed=seed)
        proxy.start()
        self._proxies.append(proxy)
        return proxy

    def add_client(self, name: str, argv: Sequence[str], *, lease_server: int = 0) -> ClientNode:
        """Start a workload client; ``argv`` may contain ``{lease}`` and ``{guard}``.

        Those are replaced by the lease server's (``lease_server``: which one, by
        index) and the guard's addresses, or by the client's own proxies' addresses
        when the topology puts proxies in front.
        """
        index = len(self.clients)
        lease_proxy = guard_proxy = None
        lease_target = self.leases[lease_server].target
        guard_target = self.guard_target
        if self.topology.proxy_lease:
            lease_proxy = self._proxy(lease_target, self.seed * 1000 + index * 2)
            lease_target = lease_proxy.target
        if self.topology.proxy_guard:
            guard_proxy = self._proxy(self.guard_target, self.seed * 1000 + index * 2 + 1)
            guard_target = guard_proxy.target
        full = [a.replace("{lease}", lease_target).replace("{guard}", guard_target) for a in argv]
        proc = Proc(name, full, log_path=self.workdir / "logs" / f"{name}.log")
        node = ClientNode(name, proc, lease_target, guard_target, lease_proxy, guard_proxy, full)
        self.clients[name] = node
        proc.start()
        return node

    def restart_client(self, name: str, extra_args: Sequence[str] = ()) -> ClientNode:
        """Start a client's process again (a new incarnation) with the same arguments.

        ``extra_args`` are appended (later flags override earlier ones, e.g. a
        shorter ``--duration`` so the new incarnation stops with the others).
        """
        node = self.clients[name]
        node.proc.kill()
        node.proc.argv = [*node.argv, "--incarnation", str(node.proc.starts), *extra_args]
        node.proc.start()
        return node

    def wait_clients(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` s for every client to exit; names of those still running."""
        end = time.monotonic() + timeout
        for node in self.clients.values():
            node.proc.wait(max(0.0, end - time.monotonic()))
        return [n.name for n in self.clients.values() if n.proc.alive]

    def stop_proxies(self) -> None:
        """Stop every proxy (resetting what they still hold)."""
        for proxy in self._proxies:
            with contextlib.suppress(Exception):
                proxy.stop()
        self._proxies.clear()

    def stop(self) -> None:
        """Stop everything: clients, proxies, guard, lease server, database. Idempotent."""
        for node in self.clients.values():
            node.proc.resume()  # a paused client cannot act on SIGTERM
            node.proc.kill()
            node.proc.close()
        self.stop_proxies()
        for server in (self.guard, *reversed(self.leases)):
            if server is not None:
                server.resume()
                server.terminate()
                server.close()
        if self.database is not None:
            self.database.resume()
            self.database.terminate()
            self.database.close()


__all__ = ["BACKENDS", "ClientNode", "Cluster", "Topology"]
