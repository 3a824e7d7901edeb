"""Exit codes of the ``fencing`` client commands against real servers: one per reason,
and with ``--json`` the error as an object on stdout as well as the line on stderr."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from fencing import Claim, GuardClient, LeaseClient, Put
from fencing.testing import RunningServers
from serving import exits


def fencing(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencingctl", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_stale_token_exits_with_its_code_and_json(servers: RunningServers) -> None:
    with GuardClient(servers.guard_address) as guard:
        guard.write(Claim("orders", 5), Put("k", b"new"))
    done = fencing(
        "put", "orders", "k", "old", "--token", "4", "--json",
        "--guard-addr", servers.guard_address,
    )  # fmt: skip
    assert done.returncode == exits.CODES["STALE_TOKEN"] == 3
    assert done.stderr.startswith("error: STALE_TOKEN: ")
    error = json.loads(done.stdout)
    assert error["reason"] == "STALE_TOKEN" and error["exit_code"] == 3
    assert error["metadata"]["current_token"] == "5" and error["message"]


def test_a_held_lease_and_a_lost_one_exit_with_their_codes(servers: RunningServers) -> None:
    with LeaseClient(servers.lease_address, holder="a") as leases:
        lease = leases.acquire("orders", ttl=30)
        held = fencing("lease", "acquire", "orders", "--lease-addr", servers.lease_address)
        assert held.returncode == exits.CODES["LEASE_HELD"] == 4, held.stderr
        assert "LEASE_HELD" in held.stderr and held.stdout == ""
        lost = fencing(
            "lease", "renew", "orders", str(lease.token + 1), "--json",
            "--lease-addr", servers.lease_address,
        )  # fmt: skip
        assert lost.returncode == exits.CODES["LEASE_LOST"] == 5, lost.stderr
        assert json.loads(lost.stdout)["reason"] == "LEASE_LOST"
    invalid = fencing("lease", "acquire", "", "--lease-addr", servers.lease_address)
    assert invalid.returncode == exits.CODES["INVALID_ARGUMENT"] == 7, invalid.stderr


def test_an_unreachable_address_exits_unreachable_on_every_client_command() -> None:
    address = f"127.0.0.1:{closed_port()}"
    for argv in (
        ["lease", "describe", "r", "--lease-addr", address],
        ["get", "r", "k", "--guard-addr", address],
        ["queue", "stats", "--lease-addr", address],
    ):
        done = fencing(*argv, "--json")
        assert done.returncode == exits.CODES["UNREACHABLE"] == 12, (argv, done.stderr)
        assert done.stderr.startswith("error: UNREACHABLE: ")
        assert json.loads(done.stdout)["exit_code"] == 12


def test_a_refused_connection_exits_unreachable_on_the_lease_stream_too() -> None:
    """The lease stream's calls (acquire, renew, release, lock, elect) follow the same
    rule as the unary ones: no server at the address is UNREACHABLE, not a backend
    outage."""
    address = f"127.0.0.1:{closed_port()}"
    for argv in (
        ["lease", "acquire", "r", "--lease-addr", address],
        ["lease", "renew", "r", "1", "--lease-addr", address],
        ["lease", "release", "r", "1", "--lease-addr", address],
        ["lock", "r", "--lease-addr", address, "--no-fence", "--", "true"],
        ["elect", "r", "--lease-addr", address, "--guard-addr", address, "--", "true"],
    ):
        done = fencing(*argv)
        assert done.returncode == exits.CODES["UNREACHABLE"], (argv, done.stderr)
        assert done.stderr.startswith("error: UNREACHABLE: "), (argv, done.stderr)


def test_lock_help_names_the_codes_it_exits_with() -> None:
    text = " ".join(fencing("lock", "--help").stdout.split())
    assert "12 (UNREACHABLE) when no server answered" in text
    assert "1 for another error" not in text


def test_usage_errors_still_exit_2() -> None:
    assert fencing("lease", "acquire").returncode == 2
    assert fencing("no-such-command").returncode == 2
