"""The session's rules on a fake clock: which leases a keepalive renews, and what verdicts
and failures do to them."""

from __future__ import annotations

import threading

import pytest

from fencing._renewal import RenewalPolicy
from fencing.client._core import LeaseBase
from fencing.client._session import SessionCore
from fencing.errors import BackendUnavailableError, InvalidArgumentError
from fencing.v1 import lease_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeLease(LeaseBase[threading.Event]):
    def __init__(self, resource: str, clock: Clock, ttl_ms: int = 9000) -> None:
        msg = lease_pb2.Lease(resource=resource, holder="h", token=7, ttl_ms=ttl_ms)
        super().__init__(msg, clock(), RenewalPolicy(), clock, threading.Event(), threading.Lock())


def test_leases_taken_apart_are_renewed_together() -> None:
    clock = Clock()
    core: SessionCore[FakeLease] = SessionCore()
    first = FakeLease("a", clock)  # renewal due at +3 s
    core.add(first)
    clock.now += 1.0
    second = FakeLease("b", clock)  # due at +4 s
    core.add(second)
    clock.now += 0.5
    assert core.sleep_for(clock.now) == pytest.approx(1.5)  # until a renews
    clock.now += 1.5
    due, expired = core.take_due(clock.now)
    # b is due within half a period (1.5 s) too: both go in one call.
    assert due == [first, second] and expired == []
    request = core.request(due)
    assert [r.resource for r in request.renewals] == ["a", "b"]
    assert all(r.ttl_ms == 9000 and r.token == 7 and r.holder == "h" for r in request.renewals)
    response = lease_pb2.RenewManyResponse(
        results=[
            lease_pb2.RenewResult(lease=lease_pb2.Lease(resource="a", token=7, ttl_ms=9000)),
            lease_pb2.RenewResult(lost=True),
        ]
    )
    core.settle(due, clock.now, response)
    assert not first.lost.is_set() and second.lost.is_set()
    assert len(core) == 1
    assert core.sleep_for(clock.now) == pytest.approx(3.0)  # a renewed from now


def test_a_lease_past_its_deadline_is_given_up() -> None:
    clock = Clock()
    core: SessionCore[FakeLease] = SessionCore()
    lease = FakeLease("a", clock, ttl_ms=1000)
    core.add(lease)
    clock.now += 2.0
    due, expired = core.take_due(clock.now)
    assert due == [] and expired == [lease] and len(core) == 0


def test_a_transient_failure_retries_sooner_and_a_final_one_loses_all() -> None:
    clock = Clock()
    core: SessionCore[FakeLease] = SessionCore()
    leases = [FakeLease(f"r{i}", clock) for i in range(3)]
    for lease in leases:
        core.add(lease)
    clock.now += 3.0
    due, _ = core.take_due(clock.now)
    core.failed(due, BackendUnavailableError("down"), clock.now)
    assert not any(lease.lost.is_set() for lease in leases)
    assert core.sleep_for(clock.now) == pytest.approx(0.9)  # retry_ratio 0.1 of 9 s
    core.failed(due, InvalidArgumentError("bad"), clock.now)
    assert all(lease.lost.is_set() for lease in leases) and len(core) == 0


def test_requests_are_chunked() -> None:
    clock = Clock()
    core: SessionCore[FakeLease] = SessionCore(max_batch=2)
    leases = [FakeLease(f"r{i}", clock) for i in range(5)]
    assert [len(c) for c in core.chunks(leases)] == [2, 2, 1]
