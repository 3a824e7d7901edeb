"""LeaseService over real gRPC through the sync SDK."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from fencing import (
    AcquireTimeoutError,
    InvalidArgumentError,
    LeaseClient,
    LeaseHeldError,
    LeaseLost,
)
from fencing.testing import RunningServers
from fencing.v1 import lease_pb2, lease_pb2_grpc
from tests.integration.conftest import LeaseClientFactory


def test_acquire_describe_release(leases: LeaseClient) -> None:
    lease = leases.acquire("orders", ttl=5)
    assert lease.token == 1
    assert lease.holder == "tester"
    state = leases.describe("orders")
    assert state.held
    assert (state.holder, state.token, state.last_token) == ("tester", 1, 1)
    assert 0 < state.remaining_ms <= 5000
    lease.release()
    state = leases.describe("orders")
    assert not state.held
    assert state.last_token == 1
    assert leases.acquire("orders", ttl=5).token == 2


def test_nowait_raises_held_with_the_holder(
    lease_client: LeaseClientFactory, leases: LeaseClient
) -> None:
    leases.acquire("r", ttl=5)
    with lease_client(holder="other") as other:
        with pytest.raises(LeaseHeldError) as held:
            other.acquire_nowait("r", ttl=5)
        assert held.value.holder == "tester"
        assert held.value.remaining_ms > 0
        with pytest.raises(AcquireTimeoutError) as timed_out:
            other.acquire("r", ttl=5, timeout=0.3)
        assert isinstance(timed_out.value, TimeoutError)


def test_waiter_gets_the_lease_when_it_is_released(
    lease_client: LeaseClientFactory, leases: LeaseClient
) -> None:
    first = leases.acquire("r", ttl=30)
    got: list[int] = []
    with lease_client(holder="waiter") as other:
        t = threading.Thread(target=lambda: got.append(other.acquire("r", 5, timeout=20).token))
        t.start()
        time.sleep(0.3)
        assert not got
        first.release()
        t.join(20)
    assert got == [2]


def test_waiters_are_served_in_arrival_order(
    lease_client: LeaseClientFactory, leases: LeaseClient
) -> None:
    lease = leases.acquire("fifo", ttl=30)
    order: list[str] = []
    lock = threading.Lock()
    clients = [lease_client(holder=f"w{i}") for i in range(4)]

    def wait(i: int) -> None:
        got = clients[i].acquire("fifo", ttl=30, timeout=30)
        with lock:
            order.append(got.holder)
        got.release()

    threads = []
    for i in range(4):
        t = threading.Thread(target=wait, args=(i,))
        t.start()
        threads.append(t)
        time.sleep(0.15)  # arrive one after another
    lease.release()
    for t in threads:
        t.join(30)
    assert order == ["w0", "w1", "w2", "w3"]


def test_waiter_gets_an_expired_lease(
    lease_client: LeaseClientFactory, leases: LeaseClient
) -> None:
    leases.acquire("r", ttl=0.3)  # never renewed
    with lease_client(holder="next") as other:
        lease = other.acquire("r", ttl=5, timeout=10)
    assert lease.token == 2


def test_renew_and_release_of_a_superseded_token_are_lost(
    lease_client: LeaseClientFactory, leases: LeaseClient
) -> None:
    old = leases.acquire("r", ttl=0.2)
    time.sleep(0.3)
    with lease_client(holder="new") as other:
        other.acquire("r", ttl=5)
    with pytest.raises(LeaseLost):
        old.renew()
    assert old.lost.is_set()
    with pytest.raises(LeaseLost):
        leases.release("r", old.token)


def test_retried_acquire_with_the_same_request_id_returns_the_same_token(
    servers: RunningServers,
) -> None:
    with grpc.insecure_channel(servers.lease_address) as channel:
        stub = lease_pb2_grpc.LeaseServiceStub(channel)
        req = lease_pb2.AcquireRequest(resource="r", holder="h", ttl_ms=5000, request_id="x1")
        first = stub.Acquire(req)
        again = stub.Acquire(req)
        assert first.token == again.token == 1
        state = stub.Describe(lease_pb2.DescribeRequest(resource="r"))
        assert state.last_token == 1


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"resource": "", "holder": "h", "ttl_ms": 1000}, "resource"),
        ({"resource": "x" * 257, "holder": "h", "ttl_ms": 1000}, "resource"),
        ({"resource": "bad\x01name", "holder": "h", "ttl_ms": 1000}, "resource"),
        ({"resource": "r", "holder": "", "ttl_ms": 1000}, "holder"),
        ({"resource": "r", "holder": "h" * 129, "ttl_ms": 1000}, "holder"),
        ({"resource": "r", "holder": "h", "ttl_ms": 99}, "ttl_ms"),
        ({"resource": "r", "holder": "h", "ttl_ms": 3_600_001}, "ttl_ms"),
        ({"resource": "r", "holder": "h", "ttl_ms": 1000, "wait_ms": -5}, "wait_ms"),
        ({"resource": "r", "holder": "h", "ttl_ms": 1000, "wait_ms": 300_001}, "wait_ms"),
        ({"resource": "r", "holder": "h", "ttl_ms": 1000, "request_id": "q" * 129}, "request_id"),
    ],
)
def test_bad_acquire_is_invalid_argument_naming_the_field_and_changes_nothing(
    servers: RunningServers, leases: LeaseClient, request_fields: dict[str, object], field: str
) -> None:
    with grpc.insecure_channel(servers.lease_address) as channel:
        stub = lease_pb2_grpc.LeaseServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Acquire(lease_pb2.AcquireRequest(**request_fields))  # type: ignore[arg-type]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (err.value.details() or "")
    # The server keeps serving and nothing was granted.
    assert leases.describe("r").last_token == 0
    assert leases.acquire("r", ttl=1).token == 1


def test_sdk_raises_invalid_argument_with_the_field(leases: LeaseClient) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        leases.acquire("r", ttl=0.01)
    assert err.value.field == "ttl_ms"
    with pytest.raises(InvalidArgumentError) as err:
        leases.renew("r", 0, ttl=1)
    assert err.value.field == "token"
