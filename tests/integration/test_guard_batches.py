"""WriteMany and WriteStream over real gRPC, through the sync and asyncio SDK."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import grpc
import grpc.aio
import pytest

from fencing import (
    AsyncGuardClient,
    BackendUnavailableError,
    Claim,
    GuardClient,
    InvalidArgumentError,
    Put,
    StaleTokenError,
)
from fencing.client._core import WriteResult
from fencing.client.async_write_stream import AsyncWriteStream
from fencing.limits import MAX_WRITE_RESOURCES
from fencing.testing import RunningServers, running_servers
from fencing.types import Delete
from fencing.v1 import guard_pb2, guard_pb2_grpc


def test_write_many_is_all_or_nothing(guard: GuardClient) -> None:
    result = guard.write_many(
        [(Claim("a", 3), Put("k", b"a3")), (Claim("b", 4), [Put("k", b"b4"), Put("j", b"x")])],
        idempotency_key="move-1",
    )
    assert result.fences == {"a": 3, "b": 4} and not result.replayed
    guard.put(Claim("b", 5), "k", b"b5")
    with pytest.raises(StaleTokenError) as stale:
        guard.write_many([(Claim("a", 9), Put("k", b"no")), (Claim("b", 4), Delete("j"))])
    assert (stale.value.resource, stale.value.current_token) == ("b", 5)
    record = guard.read("a", "k")
    assert record is not None and record.value == b"a3"
    assert guard.describe_fence("a") == 3
    # The token is judged before the key: b's 4 is stale now, so no replay for it...
    with pytest.raises(StaleTokenError) as refused:
        guard.write_many(
            [(Claim("a", 3), Put("k", b"a3")), (Claim("b", 4), Put("k", b"b4"))],
            idempotency_key="move-1",
        )
    assert (refused.value.key_applied, refused.value.applied_by_token) == (True, 4)
    # ... while tokens that may write now get it, with the tokens that applied it.
    again = guard.write_many(
        [(Claim("a", 3), Put("k", b"a3")), (Claim("b", 5), Put("k", b"b4"))],
        idempotency_key="move-1",
    )
    assert again.replayed and again.fences == {"a": 3, "b": 4}
    assert again.replayed_by_tokens == {"a": 3, "b": 4}


@pytest.mark.parametrize(
    ("writes", "field"),
    [
        ([], "writes"),
        ([("a", 1), ("a", 1)], "writes"),
        ([(f"r{i}", 1) for i in range(MAX_WRITE_RESOURCES + 1)], "writes"),
        ([("a", 0)], "writes[0].token"),
        ([("", 1)], "writes[0].resource"),
    ],
)
def test_write_many_validates_the_whole_request(
    guard: GuardClient, writes: list[tuple[str, int]], field: str
) -> None:
    with pytest.raises(InvalidArgumentError) as invalid:
        guard.write_many([(Claim(r, t), Put("k", b"v")) for r, t in writes])
    assert invalid.value.field == field


def test_write_many_of_too_many_ops_is_refused(guard: GuardClient) -> None:
    ops = [Put(f"k{i}", b"v") for i in range(600)]
    with pytest.raises(InvalidArgumentError):
        guard.write_many([(Claim("a", 1), ops), (Claim("b", 1), ops)])


def test_a_stream_gives_each_write_its_own_verdict(servers: RunningServers) -> None:
    guard = GuardClient(servers.guard_address)
    guard.put(Claim("s", 5), "k", b"five")
    with guard.stream() as stream:
        ok = stream.submit(Claim("s", 6), Put("k", b"six"))
        stale = stream.submit(Claim("s", 4), Put("k", b"four"))
        keyed = stream.submit(Claim("t", 1), Put("k", b"one"), idempotency_key="once")
        assert ok.result(10) == WriteResult(6, False)
        with pytest.raises(StaleTokenError) as refused:
            stale.result(10)
        assert refused.value.current_token >= 5
        assert keyed.result(10) == WriteResult(1, False)
        assert stream.write(Claim("t", 1), Put("k", b"x"), idempotency_key="once").replayed
        with pytest.raises(InvalidArgumentError) as invalid:
            stream.write(Claim("t", 1), [])
        assert invalid.value.field == "ops"
    record = guard.read("s", "k")
    assert record is not None and record.written_by_token == 6
    with pytest.raises(BackendUnavailableError, match="closed"):
        stream.write(Claim("t", 2), Put("k", b"late"))
    guard.close()


def test_a_write_given_up_by_its_caller_leaves_the_stream_working(
    servers: RunningServers,
) -> None:
    with GuardClient(servers.guard_address) as guard:
        with guard.stream() as stream:
            given_up = stream.submit(Claim("g", 1), Put("k", b"one"))
            assert given_up.cancel()  # before its verdict: the guard still gets the write
            # The stream's reader hands the next verdicts out as before.
            assert stream.write(Claim("g", 2), Put("k", b"two"), timeout=10).fence == 2
            assert not stream.broken
        record = guard.read("g", "k")
        assert record is not None and record.written_by_token == 2


def test_coalesced_writes_from_many_threads(servers: RunningServers) -> None:
    with GuardClient(servers.guard_address, coalesce=True) as guard:

        def work(i: int) -> list[int]:
            return [guard.put(Claim(f"c{i}", 1 + j), "k", str(j).encode()) for j in range(20)]

        with ThreadPoolExecutor(16) as pool:
            assert all(fences == list(range(1, 21)) for fences in pool.map(work, range(32)))
        record = guard.read("c7", "k")
        assert record is not None and (record.value, record.written_by_token) == (b"19", 20)
    commit = servers.guard.service.commit
    assert commit is not None and commit.batched_writes >= 32 * 20


async def test_async_stream_packs_concurrent_writes(servers: RunningServers) -> None:
    async with (
        grpc.aio.insecure_channel(servers.guard_address) as channel,
        AsyncWriteStream(channel) as stream,
    ):
        results = await asyncio.gather(
            *(stream.write(Claim(f"x{i % 10}", 1 + i // 10), Put("k", b"v")) for i in range(500)),
            stream.write(Claim("x0", 1), Put("k", b"late")),
            return_exceptions=True,
        )
    assert all(isinstance(r, WriteResult) for r in results[:500])
    # The last write was queued after x0 reached token 50: stale.
    assert isinstance(results[500], StaleTokenError)


async def test_async_client_coalesces_and_writes_many(servers: RunningServers) -> None:
    async with AsyncGuardClient(servers.guard_address, coalesce=True) as guard:
        fences = await asyncio.gather(
            *(guard.put(Claim(f"ac{i}", 3), "k", b"v") for i in range(50))
        )
        assert fences == [3] * 50
        with pytest.raises(StaleTokenError):
            await guard.put(Claim("ac0", 2), "k", b"late")
        result = await guard.write_many([(Claim("ac1", 4), Put("k", b"x")), (Claim("ac2", 4), [])])
        assert result.fences == {"ac1": 4, "ac2": 4}
        async with guard.stream() as stream:
            assert (await stream.write(Claim("ac3", 9), Put("k", b"y"))).fence == 9
    commit = servers.guard.service.commit
    assert commit is not None and commit.batched_writes >= 52


def test_a_broken_stream_fails_its_pending_writes() -> None:
    with running_servers() as servers, GuardClient(servers.guard_address) as guard:
        stream = guard.stream()
        assert stream.write(Claim("r", 1), Put("k", b"v")).fence == 1
        servers.call(servers.guard.built.server.stop(0))
        with pytest.raises(BackendUnavailableError):
            stream.write(Claim("r", 1), Put("k", b"v"), timeout=10)
        assert stream.broken
        with pytest.raises(BackendUnavailableError):
            stream.write(Claim("r", 1), Put("k", b"again"), timeout=10)
        stream.close(1)


def test_stream_messages_over_the_limit_end_the_stream(servers: RunningServers) -> None:
    with grpc.insecure_channel(servers.guard_address) as channel:
        stub = guard_pb2_grpc.GuardServiceStub(channel)
        write = guard_pb2.WriteRequest(
            resource="r", token=1, ops=[guard_pb2.Op(put=guard_pb2.Put(key="k", value=b"v"))]
        )
        message = guard_pb2.WriteStreamRequest(
            writes=[guard_pb2.StreamedWrite(id=i, write=write) for i in range(1001)]
        )
        with pytest.raises(grpc.RpcError) as err:
            list(stub.WriteStream(iter([message]), timeout=10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
