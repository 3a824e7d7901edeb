"""Restarting ``fencing serve`` (SIGTERM and SIGKILL) keeps tokens increasing and data intact."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fencing import Claim, GuardClient, LeaseClient, StaleTokenError

pytestmark = pytest.mark.e2e


@contextmanager
def serve(data: Path) -> Iterator[tuple[subprocess.Popen[str], str, str]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fencingctl",
            "serve",
            "--data-dir",
            str(data),
            "--lease-listen",
            "127.0.0.1:0",
            "--guard-listen",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lease_line = proc.stdout.readline()
        guard_line = proc.stdout.readline()
        assert "lease server listening on" in lease_line, proc.stderr.read() if proc.stderr else ""
        yield proc, lease_line.split()[-1], guard_line.split()[3]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_tokens_keep_increasing_and_values_survive(tmp_path: Path, how: signal.Signals) -> None:
    issued: list[int] = []
    for round_ in range(3):
        with serve(tmp_path) as (proc, lease_addr, guard_addr):
            with (
                LeaseClient(lease_addr, holder=f"round-{round_}") as leases,
                GuardClient(guard_addr) as guard,
            ):
                if round_ > 0:
                    state = leases.describe("ledger")
                    assert state.last_token == issued[-1]
                    if state.held:  # the lease left held survived the restart
                        assert state.token == issued[-1]
                    record = guard.read("ledger", "entry")
                    assert record is not None
                    assert record.value == f"round-{round_ - 1}".encode()
                    assert record.written_by_token == issued[-1]
                    # The fence survived too: an older token stays stale.
                    with pytest.raises(StaleTokenError):
                        guard.put(Claim("ledger", issued[-2]), "entry", b"late")
                for i in range(3):
                    # Waits for the lease left held by the previous round to expire.
                    lease = leases.acquire("ledger", ttl=2, timeout=15)
                    issued.append(lease.token)
                    guard.put(lease, "entry", f"round-{round_}".encode())
                    if i < 2:
                        lease.release()  # the last one stays held across the restart
            proc.send_signal(how)
            proc.wait(15)
            if how is signal.SIGTERM:
                assert proc.returncode == 0
    assert issued == sorted(set(issued)), issued
    assert len(issued) == 9
