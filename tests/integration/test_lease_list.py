"""``List`` on the lease server, through both SDK twins (``list_held``): pages, the
page-size bound at the edge, and authorization per prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from fencing import InvalidArgumentError, LeaseClient, PermissionDeniedError
from fencing.client import _core
from fencing.limits import MAX_PAGE_SIZE
from fencing.testing import RunningServers, running_servers
from serving.auth import AuthPolicy
from serving.server import ServerOptions
from tests.integration.conftest import LeaseClientFactory


def test_lists_every_held_lease_page_by_page(lease_client: LeaseClientFactory) -> None:
    leases = lease_client(holder="lister")
    tokens = {f"jobs/{i}": leases.acquire(f"jobs/{i}", ttl=30).token for i in range(5)}
    leases.acquire("other", ttl=30)
    gone = leases.acquire("jobs/gone", ttl=30)
    leases.release("jobs/gone", gone.token)
    listed = list(leases.list_held("jobs/", page_size=2))  # three pages
    assert [s.resource for s in listed] == sorted(tokens)
    assert all(s.held and s.holder == "lister" for s in listed)
    assert {s.resource: s.token for s in listed} == tokens
    assert [s.resource for s in leases.list_held()] == [*sorted(tokens), "other"]
    # Page by page on demand, as the console's "next page" does.
    first, token = leases.list_page("jobs/", page_size=2)
    second, token = leases.list_page("jobs/", page_size=2, page_token=token)
    third, token = leases.list_page("jobs/", page_size=2, page_token=token)
    assert [s.resource for s in first + second + third] == sorted(tokens)
    assert token == ""


def test_a_page_is_bounded_at_the_edge(lease_client: LeaseClientFactory) -> None:
    leases = lease_client()
    for size in (MAX_PAGE_SIZE + 1, -1):
        with pytest.raises(InvalidArgumentError) as err:
            list(leases.list_held(page_size=size))
        assert err.value.field == "page_size"


def test_the_raw_pages_carry_a_cursor(servers: RunningServers) -> None:
    with LeaseClient(servers.lease_address) as leases:
        for name in ("a", "b", "c"):
            leases.acquire(name, ttl=30)
        first = leases._stub.List(_core.list_request("", 2, ""))
        assert [s.resource for s in first.leases] == ["a", "b"] and first.next_page_token
        last = leases._stub.List(_core.list_request("", 2, first.next_page_token))
    assert [s.resource for s in last.leases] == ["c"] and last.next_page_token == ""


POLICY = """
[principals.alice]
tokens = ["alice-token"]
allow = [{ prefix = "orders/", actions = ["acquire", "describe"] }]

[principals.ops]
tokens = ["ops-token"]
allow = [{ prefix = "", actions = ["describe"] }]
"""


def test_listing_is_authorized_per_prefix(tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(POLICY)
    with running_servers(options=ServerOptions(auth=AuthPolicy.load(path))) as servers:
        with LeaseClient(servers.lease_address, token="alice-token") as alice:
            alice.acquire("orders/1", ttl=30)
            assert [s.resource for s in alice.list_held("orders/")] == ["orders/1"]
            assert [s.resource for s in alice.list_held("orders/1")] == ["orders/1"]
            for wider in ("", "ord"):
                with pytest.raises(PermissionDeniedError):
                    list(alice.list_held(wider))
        with LeaseClient(servers.lease_address, token="ops-token") as ops:
            assert [s.resource for s in ops.list_held()] == ["orders/1"]
