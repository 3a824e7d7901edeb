"""``fencing lease keep-alive RESOURCE TOKEN``: a real process keeping a real lease alive.

It renews past several ttls until SIGTERM or SIGINT (exit 0, the lease still held);
it exits LEASE_LOST (5) as soon as the lease is taken from it, or at once for a token
that is not the live one.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import LeaseClient
from fencing.testing import RunningServers, running_servers
from serving import exits
from tests.integration.test_cli_lock import env
from tests.waiting import HANG_GUARD


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(f"sqlite:{tmp_path / 'l.db'}") as s:
        yield s


def keep_alive(servers: RunningServers, resource: str, token: int) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "fencingctl", "lease", "keep-alive", resource, str(token)]
    argv += ["--ttl", "1", "--json", "--lease-addr", servers.lease_address]
    return subprocess.Popen(
        argv, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def renewals(proc: subprocess.Popen[str], count: int) -> list[dict[str, object]]:
    """The first ``count`` renewal lines it prints."""
    assert proc.stdout is not None and proc.stderr is not None
    lines = [proc.stdout.readline() for _ in range(count)]
    assert all(lines), f"it ended early: {proc.wait(HANG_GUARD)} {proc.stderr.read()}"
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["term", "int"])
def test_renews_past_its_ttl_until_a_stop_signal(
    servers: RunningServers, stop: signal.Signals
) -> None:
    with LeaseClient(servers.lease_address, holder="cron") as leases:
        # not renewed by this client; 5 s to outlast the command's start-up, then
        # each renewal asks for 1 s
        lease = leases.acquire("nightly", ttl=5)
        with keep_alive(servers, "nightly", lease.token) as proc:
            try:
                # five renewals a third of their 1 s ttl apart: past the ttl each grants
                seen = renewals(proc, 5)
                assert seen[0] == {"resource": "nightly", "token": lease.token, "ttl_ms": 1000}
                state = leases.describe("nightly")
                assert state.held and state.token == lease.token and state.holder == "cron"
                proc.send_signal(stop)
                _, err = proc.communicate(timeout=HANG_GUARD)
            finally:
                proc.kill()
        assert proc.returncode == exits.OK, err
        assert leases.describe("nightly").token == lease.token  # left held for its last ttl


def test_exits_lease_lost_once_the_lease_is_taken(servers: RunningServers) -> None:
    with LeaseClient(servers.lease_address) as leases:
        lease = leases.acquire("nightly", ttl=5)
        with keep_alive(servers, "nightly", lease.token) as proc:
            try:
                renewals(proc, 1)
                leases.release("nightly", lease.token)  # an operator takes it away
                out, err = proc.communicate(timeout=HANG_GUARD)
            finally:
                proc.kill()
    assert proc.returncode == exits.CODES["LEASE_LOST"] == 5, err
    assert "LEASE_LOST" in err
    assert json.loads(out.splitlines()[-1])["reason"] == "LEASE_LOST"


def test_a_token_that_is_not_the_live_one_exits_at_once(servers: RunningServers) -> None:
    with LeaseClient(servers.lease_address) as leases:
        lease = leases.acquire("nightly", ttl=5)
        with keep_alive(servers, "nightly", lease.token + 1) as proc:
            out, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == exits.CODES["LEASE_LOST"], err
    assert "ttl_ms" not in out  # never renewed


def test_an_unreachable_server_is_not_a_lost_lease() -> None:
    with running_servers() as servers:
        address = servers.lease_address
    argv = [sys.executable, "-m", "fencingctl", "lease", "keep-alive", "x", "1"]
    done = subprocess.run(
        [*argv, "--lease-addr", address],
        env=env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD * 2,
    )
    # the code a refused connection gives every lease command (not a loss: nothing known)
    assert done.returncode in (exits.CODES["UNREACHABLE"], exits.CODES["BACKEND_UNAVAILABLE"])
    assert "LEASE_LOST" not in done.stderr
