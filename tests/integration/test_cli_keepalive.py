"""``fencing lease keep-alive RESOURCE TOKEN`` and ``fencing lease renew``: real processes
keeping a real lease alive, by the lease's own ttl unless ``--ttl`` names another.

It renews past several ttls until SIGTERM or SIGINT (exit 0, the lease still held);
it exits LEASE_LOST (5) as soon as the lease is taken from it, or at once for a token
that is not the live one.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import pytest

from fencing import AsyncLeaseClient, LeaseClient
from fencing.testing import RunningServers, running_servers
from serving import exits
from tests.integration.test_cli_lock import env
from tests.waiting import HANG_GUARD


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(f"sqlite:{tmp_path / 'l.db'}") as s:
        yield s


def keep_alive(
    servers: RunningServers, resource: str, token: int, ttl: Sequence[str] = ("--ttl", "1")
) -> subprocess.Popen[str]:
    """The command, with ``ttl``'s flags (``()``: none, the lease's own ttl)."""
    argv = [sys.executable, "-m", "fencingctl", "lease", "keep-alive", resource, str(token)]
    argv += [*ttl, "--json", "--lease-addr", servers.lease_address]
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


def renew(servers: RunningServers, *argv: str) -> dict[str, object]:
    address = ["--lease-addr", servers.lease_address]
    done = subprocess.run(
        [sys.executable, "-m", "fencingctl", "lease", "renew", *argv, "--json", *address],
        env=env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == exits.OK, done.stderr
    return cast(dict[str, object], json.loads(done.stdout))


def test_renew_without_a_ttl_keeps_the_leases_own(servers: RunningServers) -> None:
    with LeaseClient(servers.lease_address, holder="cron") as leases:
        lease = leases.acquire("nightly", ttl=60)
        token = str(lease.token)
        assert renew(servers, "nightly", token)["ttl_ms"] == 60_000
        assert leases.describe("nightly").remaining_ms > 50_000
        # The control: a ttl named is the ttl granted (10 s was what it always sent).
        assert renew(servers, "nightly", token, "--ttl", "10s")["ttl_ms"] == 10_000
        assert leases.describe("nightly").remaining_ms <= 10_000
        # ... and from then on the lease's own.
        assert renew(servers, "nightly", token)["ttl_ms"] == 10_000
        assert leases.renew("nightly", lease.token, 60) == 60_000
        assert leases.renew("nightly", lease.token) == 60_000


async def test_the_async_client_renews_by_the_leases_own_ttl(servers: RunningServers) -> None:
    async with AsyncLeaseClient(servers.lease_address, holder="cron") as leases:
        lease = await leases.acquire("nightly", ttl=45)
        assert await leases.renew("nightly", lease.token) == 45_000
        assert (await leases.describe("nightly")).remaining_ms > 35_000


def test_keep_alive_without_a_ttl_renews_by_the_leases_own(servers: RunningServers) -> None:
    with LeaseClient(servers.lease_address, holder="cron") as leases:
        lease = leases.acquire("nightly", ttl=3)
        with keep_alive(servers, "nightly", lease.token) as control:
            try:
                assert renewals(control, 1)[0]["ttl_ms"] == 1000
            finally:
                control.kill()
        leases.renew("nightly", lease.token, 3)
        with keep_alive(servers, "nightly", lease.token, ()) as proc:
            try:
                seen = renewals(proc, 3)
            finally:
                proc.kill()
        assert [line["ttl_ms"] for line in seen] == [3000] * 3
        assert leases.describe("nightly").token == lease.token
