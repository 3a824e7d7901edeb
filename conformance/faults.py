"""A fault proxy in front of the lease server, driven by a scenario's ``fault`` steps.

A scenario with ``"lease_via_fault_proxy": true`` runs its driver against a
:class:`~chaos.proxy.ThreadedFaultProxy` of its own (one per driver run, so the faults of
one run never touch another run on the shared servers). The driver acts on the proxy by
sending one line per ``fault`` step to a control socket and waiting for ``ok``; a line
is a proxy method without arguments (``reset``, ``heal``, ``blackhole``, ``refuse``) or
``half_open upstream|downstream``. Any language can send a line, so every driver acts on
the link the same way, through no SDK.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from chaos.proxy import DIRECTIONS, ThreadedFaultProxy

#: The proxy's faults a ``fault`` step may name.
ACTIONS = frozenset({"reset", "heal", "blackhole", "refuse", "half_open"})


def apply(proxy: ThreadedFaultProxy, line: str) -> None:
    """Carry out one control line on ``proxy`` (ValueError naming what is wrong)."""
    action, *args = line.split()
    if action not in ACTIONS:
        raise ValueError(f"unknown fault {action!r} (one of {', '.join(sorted(ACTIONS))})")
    if action == "half_open":
        if len(args) != 1 or args[0] not in DIRECTIONS:
            raise ValueError(f"half_open takes one of {', '.join(DIRECTIONS)}")
        proxy.half_open(args[0])
    elif args:
        raise ValueError(f"{action} takes no arguments")
    else:
        getattr(proxy, action)()


@contextmanager
def fault_proxy(lease_addr: str) -> Iterator[tuple[str, str]]:
    """A fault proxy to ``lease_addr`` and its control socket: yields (proxy address,
    control address), both on loopback."""
    host, port = lease_addr.rsplit(":", 1)
    proxy = ThreadedFaultProxy(host, int(port))

    class Control(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            for raw in self.rfile:
                try:
                    apply(proxy, raw.decode().strip())
                except Exception as exc:  # the driver reports it as its step's failure
                    self.wfile.write(f"error {exc}\n".encode())
                else:
                    self.wfile.write(b"ok\n")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Control)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="fault-control", daemon=True)
    with proxy:
        thread.start()
        try:
            yield proxy.target, f"127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()
