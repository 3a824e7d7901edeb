"""``fencing fence``: show, advance, and the operator's reset, against real servers."""

from __future__ import annotations

import pytest

from fencing import Claim, GuardClient, LeaseClient, Put
from fencing.testing import RunningServers
from fencingctl import main
from serving import exits


def run(servers: RunningServers, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(
        [
            "fence",
            *args,
            "--lease-addr",
            servers.lease_address,
            "--guard-addr",
            servers.guard_address,
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    return out.strip()


def test_fence_shows_advances_and_resets(
    servers: RunningServers, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(servers, capsys, "orders") == "resource=orders fence=0"
    assert run(servers, capsys, "orders", "5") == "resource=orders fence=5"
    # A resource named "reset" can still be fenced: "reset" followed by a number.
    assert run(servers, capsys, "reset", "3") == "resource=reset fence=3"
    with LeaseClient(servers.lease_address, holder="a") as leases:
        lease = leases.acquire("acct", ttl=30)
    with GuardClient(servers.guard_address) as guard:
        guard.write(Claim("acct", 2**63 - 1), Put("k", b"wedge"))
    out = run(servers, capsys, "reset", "acct")
    assert out == (
        f"resource=acct previous_fence={2**63 - 1} fence={lease.token} last_token={lease.token}"
    )
    assert run(servers, capsys, "acct", "--reset").startswith(
        f"resource=acct previous_fence={lease.token} fence={lease.token}"
    )


def test_fence_reset_takes_no_token_and_a_token_is_a_number(
    servers: RunningServers, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--lease-addr", servers.lease_address, "--guard-addr", servers.guard_address]
    assert main(["fence", "acct", "7", "--reset", *base]) == exits.USAGE
    assert "error: USAGE: a reset takes no token" in capsys.readouterr().err
    assert main(["fence", "acct", "seven", *base]) == exits.USAGE
    assert "token must be a number" in capsys.readouterr().err
