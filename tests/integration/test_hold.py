"""``hold``: renewal in the background, loss noticed, release on exit."""

from __future__ import annotations

import threading
import time

import pytest

from fencing import GuardClient, Lease, LeaseClient, LeaseLost, StaleTokenError
from fencing.testing import RunningServers
from tests.integration.conftest import LeaseClientFactory


def test_hold_outlives_its_ttl_and_releases_on_exit(leases: LeaseClient) -> None:
    # A ttl long enough that a renewal delayed by a loaded machine (the full suite on two
    # cores) still lands inside it; the block lasts over two ttls, so only renewals keep it.
    with leases.hold("r", ttl=1.0) as lease:
        time.sleep(2.5)
        lease.check()
        assert leases.describe("r").token == lease.token
    state = leases.describe("r")
    assert not state.held
    assert state.last_token == 1


def test_lost_lease_is_noticed_and_surfaces_from_the_block(
    lease_client: LeaseClientFactory, leases: LeaseClient, guard: GuardClient
) -> None:
    lost_calls: list[Lease] = []
    fired = threading.Event()

    def on_lost(lease: Lease) -> None:
        lost_calls.append(lease)
        fired.set()

    with pytest.raises(LeaseLost), leases.hold("r", ttl=0.5, on_lost=on_lost) as lease:
        # Someone releases our lease behind our back (an operator, a bug):
        leases.release("r", lease.token)
        with lease_client(holder="thief") as thief:
            newer = thief.acquire("r", ttl=5)
        assert fired.wait(5)
        assert lease.lost.is_set()
        with pytest.raises(LeaseLost):
            lease.check()
        # The guard is the safety net: the newer token fences ours.
        guard.put(newer, "k", b"new")
        with pytest.raises(StaleTokenError):
            guard.put(lease, "k", b"old")
    assert lost_calls == [lease]


def test_local_deadline_marks_the_lease_lost_when_the_server_vanishes(
    servers: RunningServers, lease_client: LeaseClientFactory
) -> None:
    client = lease_client(rpc_timeout=0.2)
    with pytest.raises(LeaseLost), client.hold("r", ttl=0.6) as lease:
        servers.call(servers.lease.built.server.stop(0))  # the server disappears
        assert lease.lost.wait(5)
        assert lease.remaining() == 0.0
