"""Several server processes on one port: ``--workers N`` (``SO_REUSEPORT``).

A Python gRPC server runs its handlers on one event loop, so one process uses about
one core. With ``--workers N`` the command becomes a supervisor: it reserves the
port (a socket bound with ``SO_REUSEPORT`` that never listens, so the kernel never
hands it a connection), starts N copies of itself with ``--workers 1 --listen
host:port --reuse-port``, and the kernel spreads new connections over the N
listening processes. It prints one ``listening on`` line once every worker has,
forwards SIGTERM/SIGINT, and stops them all if one dies.

Workers share nothing but the backend or store, so everything that must be shared
lives there: what the guard keeps (fences, data, idempotency keys) is in the store,
and group commit batches per worker. A lease server's waiter queues are per worker
(a waiter is woken at once by a release through its own worker, through others by
LISTEN/NOTIFY on PostgreSQL, pub/sub on Redis, and only by polling on SQLite), and
SQLite serialises writers across processes anyway: see ``bench`` for what workers
buy on each backend. ``memory://`` cannot be shared, so it refuses workers.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from types import FrameType

from serving.server import host_of

#: Seconds to wait for every worker's "listening on" line.
START_TIMEOUT = 30.0


def reserve_port(address: str) -> tuple[socket.socket, int]:
    """Bind ``address`` with ``SO_REUSEPORT`` without listening; return it and its port."""
    host = host_of(address)
    port = int(address.rsplit(":", 1)[1])
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock, int(sock.getsockname()[1])


def run_workers(
    module: str, argv: list[str], listen: str, workers: int, what: str, *, metrics_port: int = 0
) -> int:
    """Run ``python -m module argv...`` as ``workers`` processes sharing ``listen``'s port.

    With ``metrics_port``, worker i serves its metrics on ``metrics_port + i``. Returns
    the exit status: 0 after a clean stop on SIGTERM/SIGINT, 1 if a worker failed to
    start or died.
    """
    reservation, port = reserve_port(listen)
    host = host_of(listen)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    command = [sys.executable, "-m", module, *argv]
    command += ["--listen", address, "--workers", "1", "--reuse-port"]
    procs: list[subprocess.Popen[str]] = []
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        for i in range(workers):
            own = ["--metrics-port", str(metrics_port + i)] if metrics_port else []
            procs.append(subprocess.Popen([*command, *own], stdout=subprocess.PIPE, text=True))
        deadline = time.monotonic() + START_TIMEOUT
        for proc in procs:
            assert proc.stdout is not None
            line = _readline(proc, deadline)
            if "listening on" not in line:
                print(f"{what} worker did not start: {line!r}", file=sys.stderr, flush=True)
                return 1
        print(
            f"{what} listening on {address} ({workers} workers, pids "
            f"{' '.join(str(p.pid) for p in procs)})",
            flush=True,
        )
        # After the banner: whatever the workers print next comes after it.
        for proc in procs:
            threading.Thread(target=_drain, args=(proc,), daemon=True).start()
        while not stopping.wait(0.2):
            if any(proc.poll() is not None for proc in procs):
                print(f"a {what} worker exited; stopping the others", file=sys.stderr, flush=True)
                status = 1
                break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reservation.close()
    return status


def _readline(proc: subprocess.Popen[str], deadline: float) -> str:
    """The first line a worker prints, or '' if it exits or the deadline passes first."""
    result: list[str] = []
    reader = threading.Thread(
        target=lambda: result.append(proc.stdout.readline() if proc.stdout else ""), daemon=True
    )
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    return result[0] if result else ""


def _drain(proc: subprocess.Popen[str]) -> None:
    """Echo what a worker prints after its first line (it must never block on a full pipe)."""
    with contextlib.suppress(ValueError, OSError):
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
