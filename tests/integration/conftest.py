"""Real lease server + guard over real gRPC on free loopback ports (embedded SQLite).

Client fixtures are parametrized over the SDK twins: ``sync`` (LeaseClient,
GuardClient) and ``async`` (AsyncLeaseClient, AsyncGuardClient behind the blocking
adapter of tests/integration/flavors.py), so one suite checks both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from fencing import GuardClient, LeaseClient
from fencing.testing import RunningServers, running_servers
from tests.integration.flavors import Portal, SyncGuardClient, SyncLeaseClient

LeaseClientFactory = Callable[..., LeaseClient]
GuardClientFactory = Callable[..., GuardClient]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(
        f"sqlite:{tmp_path / 'leases.db'}", f"sqlite:{tmp_path / 'guard.db'}"
    ) as running:
        yield running


@pytest.fixture(params=["sync", "async"])
def flavor(request: pytest.FixtureRequest) -> Iterator[Portal | None]:
    """None for the blocking twin; a portal (loop thread) for the asyncio twin."""
    if request.param == "sync":
        yield None
        return
    portal = Portal()
    yield portal
    portal.close()


def _factory(
    default_target: str, flavor: Portal | None, blocking: type[Any], adapter: type[Any]
) -> tuple[Callable[..., Any], list[Any]]:
    """``make(target=None, **kwargs)``: a client of the flavour under test; and what it made."""
    made: list[Any] = []

    def make(target: str | None = None, **kwargs: Any) -> Any:
        address = target or default_target
        client = (
            blocking(address, **kwargs) if flavor is None else adapter(flavor, address, **kwargs)
        )
        made.append(client)
        return client

    return make, made


@pytest.fixture
def lease_client(servers: RunningServers, flavor: Portal | None) -> Iterator[LeaseClientFactory]:
    """``lease_client(holder=..., target=..., **kwargs)``: a client of the flavour under test."""
    make, made = _factory(servers.lease_address, flavor, LeaseClient, SyncLeaseClient)
    yield cast(LeaseClientFactory, make)
    for client in made:
        client.close()


@pytest.fixture
def guard_client(servers: RunningServers, flavor: Portal | None) -> Iterator[GuardClientFactory]:
    make, made = _factory(servers.guard_address, flavor, GuardClient, SyncGuardClient)
    yield cast(GuardClientFactory, make)
    for client in made:
        client.close()


@pytest.fixture
def leases(lease_client: LeaseClientFactory) -> LeaseClient:
    return lease_client(holder="tester")


@pytest.fixture
def guard(guard_client: GuardClientFactory) -> GuardClient:
    return guard_client()
