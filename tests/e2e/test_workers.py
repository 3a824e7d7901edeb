"""``--workers N``: several server processes on one port, sharing one store or backend."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fencing import Claim, GuardClient, LeaseClient

pytestmark = pytest.mark.e2e


@contextmanager
def workers(module: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], str, list[int]]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--listen", "127.0.0.1:0", "--log-level", "WARNING", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line and "2 workers" in line, line
        address = line.split("listening on ")[1].split()[0]
        pids = [int(p) for p in line.split("pids ")[1].rstrip(")\n").split()]
        yield proc, address, pids
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        if proc.stdout:
            proc.stdout.close()


def test_guard_workers_share_the_port_and_the_store(tmp_path: Path) -> None:
    with workers("guard", "--store", f"sqlite:{tmp_path / 'guard.db'}", "--workers", "2") as (
        proc,
        address,
        pids,
    ):
        assert len(set(pids)) == 2
        # Each client opens its own connection; the kernel spreads them over the workers.
        clients = [GuardClient(address) for _ in range(8)]
        try:
            for token, client in enumerate(clients, start=1):
                assert client.put(Claim("shared", token), "k", str(token).encode()) == token
            for client in clients:
                assert client.describe_fence("shared") == 8
        finally:
            for client in clients:
                client.close()
        # Without SO_REUSEPORT nothing else can bind the port.
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", int(address.rsplit(":", 1)[1])))
            other.listen()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_lease_server_workers_keep_tokens_growing(tmp_path: Path) -> None:
    backend = f"sqlite:{tmp_path / 'leases.db'}"
    with workers("lease_server", "--backend", backend, "--workers", "2") as (_, address, _pids):
        tokens = []
        for _ in range(6):
            with LeaseClient(address) as client:
                lease = client.acquire_nowait("r", ttl=5)
                tokens.append(lease.token)
                lease.release()
        assert tokens == sorted(tokens) and len(set(tokens)) == 6


def test_a_dead_worker_stops_the_others(tmp_path: Path) -> None:
    with workers("guard", "--store", f"sqlite:{tmp_path / 'g.db'}", "--workers", "2") as (
        proc,
        _,
        pids,
    ):
        os.kill(pids[0], signal.SIGKILL)
        assert proc.wait(30) == 1
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pids[1], 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the surviving worker was not stopped")


def test_memory_cannot_be_shared_by_workers() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "guard", "--store", "memory://", "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "memory" in result.stderr
