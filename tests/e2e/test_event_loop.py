"""``--event-loop uvloop``: both servers run on uvloop and keep every rule.

Real processes: a lease server and a watch guard on uvloop (checked in the process's
own memory map, not assumed), an SDK client holding a lease over the lease stream, a
guarded write, a takeover and the former holder's stale write refused. The control is
the same pair on the standard loop, which does not load uvloop.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from fencing import GuardClient, LeaseClient, StaleTokenError

pytestmark = pytest.mark.e2e


@contextmanager
def server(module: str, *args: str) -> Iterator[tuple[str, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--listen", "127.0.0.1:0", "--log-level", "WARNING", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, line
        yield line.split("listening on ")[1].split()[0], proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        if proc.stdout:
            proc.stdout.close()


def loads_uvloop(pid: int) -> bool:
    return "uvloop" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_servers_on_each_loop_keep_the_fence(event_loop: str, tmp_path: Path) -> None:
    loop = ["--event-loop", event_loop]
    with ExitStack() as stack:
        lease_addr, lease_pid = stack.enter_context(
            server("lease_server", "--backend", f"sqlite:{tmp_path / 'leases.db'}", *loop)
        )
        guard_addr, guard_pid = stack.enter_context(
            server(
                "guard",
                "--store",
                f"sqlite:{tmp_path / 'guard.db'}",
                "--fence-mode",
                "watch",
                "--lease-addr",
                lease_addr,
                *loop,
            )
        )
        assert loads_uvloop(lease_pid) == loads_uvloop(guard_pid) == (event_loop == "uvloop")
        old = stack.enter_context(LeaseClient(lease_addr, holder="old", transport="stream"))
        new = stack.enter_context(LeaseClient(lease_addr, holder="new", transport="stream"))
        guard = stack.enter_context(GuardClient(guard_addr))
        first = old.acquire("ledger", ttl=30)
        guard.put(first, "balance", b"1")
        old.release("ledger", first.token)
        second = new.acquire("ledger", ttl=30)
        assert second.token > first.token
        guard.put(second, "balance", b"2")
        with pytest.raises(StaleTokenError) as refused:
            guard.put(first, "balance", b"stale")
        assert refused.value.current_token == second.token
        record = guard.read("ledger", "balance")
        assert record is not None and record.value == b"2"
