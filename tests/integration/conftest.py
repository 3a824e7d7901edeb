"""Real lease server + guard over real gRPC on free loopback ports (embedded SQLite)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import GuardClient, LeaseClient
from fencing.testing import RunningServers, running_servers


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(
        f"sqlite:{tmp_path / 'leases.db'}", f"sqlite:{tmp_path / 'guard.db'}"
    ) as running:
        yield running


@pytest.fixture
def leases(servers: RunningServers) -> Iterator[LeaseClient]:
    with LeaseClient(servers.lease_address, holder="tester") as client:
        yield client


@pytest.fixture
def guard(servers: RunningServers) -> Iterator[GuardClient]:
    with GuardClient(servers.guard_address) as client:
        yield client
