"""GuardService over real gRPC through the sync SDK."""

from __future__ import annotations

import grpc
import pytest

from fencing import Claim, Delete, GuardClient, InvalidArgumentError, Put, StaleTokenError
from fencing.limits import MAX_VALUE_BYTES
from fencing.testing import RunningServers
from fencing.v1 import guard_pb2, guard_pb2_grpc


def test_write_read_and_stale_rejection(guard: GuardClient) -> None:
    assert guard.put(Claim("acct", 1), "balance", b"100") == 1
    assert guard.put(Claim("acct", 2), "balance", b"200") == 2
    with pytest.raises(StaleTokenError) as stale:
        guard.write(Claim("acct", 1), [Put("balance", b"stale"), Put("other", b"x")])
    assert stale.value.current_token == 2
    assert stale.value.token == 1
    record = guard.read("acct", "balance")
    assert record is not None
    assert (record.value, record.written_by_token) == (b"200", 2)
    assert guard.read("acct", "other") is None
    assert guard.describe_fence("acct") == 2


def test_fence_is_a_promise(guard: GuardClient) -> None:
    assert guard.fence(Claim("r", 7)) == 7
    assert guard.fence(Claim("r", 7)) == 7
    with pytest.raises(StaleTokenError):
        guard.fence(Claim("r", 6))
    with pytest.raises(StaleTokenError):
        guard.put(Claim("r", 6), "k", b"v")
    assert guard.read("r", "k") is None
    assert guard.delete(Claim("r", 7), "k") == 7


def test_idempotency_key_replays(guard: GuardClient) -> None:
    first = guard.write(Claim("r", 1), Put("k", b"1"), idempotency_key="pay-1")
    again = guard.write(Claim("r", 1), Put("k", b"2"), idempotency_key="pay-1")
    assert not first.replayed
    assert again.replayed
    assert again.fence == first.fence
    record = guard.read("r", "k")
    assert record is not None
    assert record.value == b"1"


@pytest.mark.parametrize(
    ("ops", "field"),
    [
        ([], "ops"),
        ([guard_pb2.Op()], "ops[0]"),
        ([guard_pb2.Op(put=guard_pb2.Put(key="", value=b"v"))], "ops[0].put.key"),
        ([guard_pb2.Op(put=guard_pb2.Put(key="k" * 1025, value=b"v"))], "ops[0].put.key"),
        (
            [
                guard_pb2.Op(put=guard_pb2.Put(key="ok", value=b"v")),
                guard_pb2.Op(put=guard_pb2.Put(key="big", value=b"v" * (MAX_VALUE_BYTES + 1))),
            ],
            "ops[1].put.value",
        ),
        ([guard_pb2.Op(put=guard_pb2.Put(key="k", value=b"v"))] * 1001, "ops"),
        ([guard_pb2.Op(delete=guard_pb2.Delete(key="\x07"))], "ops[0].delete.key"),
    ],
)
def test_bad_write_is_rejected_whole_naming_the_field(
    servers: RunningServers, guard: GuardClient, ops: list[guard_pb2.Op], field: str
) -> None:
    with grpc.insecure_channel(servers.guard_address) as channel:
        stub = guard_pb2_grpc.GuardServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Write(guard_pb2.WriteRequest(resource="r", token=5, ops=ops))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (err.value.details() or "")
    assert guard.describe_fence("r") == 0
    assert guard.read("r", "ok") is None
    assert guard.put(Claim("r", 1), "k", b"fine") == 1


def test_sdk_names_the_field(guard: GuardClient) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        guard.put(Claim("r", 0), "k", b"v")
    assert err.value.field == "token"
    with pytest.raises(InvalidArgumentError) as err:
        guard.write(Claim("r" * 300, 1), [Delete("k")])
    assert err.value.field == "resource"
    with pytest.raises(InvalidArgumentError) as err:
        guard.read("r", "")
    assert err.value.field == "key"


def test_list_refusals_names_reason_token_and_fence(guard: GuardClient) -> None:
    assert guard.list_refusals("acct-r") == []
    guard.put(Claim("acct-r", 5), "k", b"v")
    with pytest.raises(StaleTokenError):
        guard.put(Claim("acct-r", 3), "k", b"late")
    with pytest.raises(StaleTokenError):
        guard.fence(Claim("acct-r", 4))
    refusals = guard.list_refusals("acct-r")
    assert [(r.reason, r.token, r.fence, r.call) for r in refusals] == [
        ("STALE_TOKEN", 4, 5, "fence"),
        ("STALE_TOKEN", 3, 5, "write"),
    ]
    assert guard.list_refusals("other") == []
    info = guard.describe_guard()
    assert info.refusals["STALE_TOKEN"] >= 2
    assert (info.fence_mode, info.store, info.watch_state) == ("monotonic", "sqlite", "")
