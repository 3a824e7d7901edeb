"""The guard's records from the shell and the SDK: ``ListRecords`` over real gRPC,
``fencing get RESOURCE [--prefix P]`` (listing) and ``fencing delete``, in real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from fencing import AsyncGuardClient, GuardClient, InvalidArgumentError, NotFoundError
from fencing.testing import RunningServers, running_servers
from fencing.types import Claim, Put, Record
from fencing.v1 import guard_pb2, guard_pb2_grpc
from guard.stores.base import GuardStore
from guard.stores.memory import MemoryStore
from serving import exits
from tests.integration.test_cli_lock import env
from tests.waiting import HANG_GUARD

KEYS = ["cfg/a", "cfg/b", "cfg/c", "cfg/d", "cfg/e", "other"]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(f"sqlite:{tmp_path / 'l.db'}", f"sqlite:{tmp_path / 'g.db'}") as s:
        with GuardClient(s.guard_address) as guard:
            guard.write(Claim("shop", 4), [Put(k, k.upper().encode()) for k in KEYS])
        yield s


def fencing(servers: RunningServers, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencingctl", *argv, "--guard-addr", servers.guard_address],
        env=env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )


def test_get_with_a_prefix_lists_every_page_in_key_order(servers: RunningServers) -> None:
    done = fencing(servers, "get", "shop", "--prefix", "cfg/", "--page-size", "2", "--json")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["key"] for r in rows] == KEYS[:5]  # three pages of at most 2
    assert rows[0] == {"resource": "shop", "key": "cfg/a", "value": "CFG/A", "written_by_token": 4}
    every = fencing(servers, "get", "shop", "--keys-only")
    assert every.stdout.splitlines() == [f"resource=shop key={k}" for k in KEYS]
    one = fencing(servers, "get", "shop", "cfg/b")  # a KEY still reads one key
    assert "value=CFG/B" in one.stdout
    both = fencing(servers, "get", "shop", "cfg/b", "--prefix", "cfg/")
    assert both.returncode == exits.USAGE and "not both" in both.stderr


def test_delete_is_a_fenced_write(servers: RunningServers) -> None:
    stale = fencing(servers, "delete", "shop", "cfg/a", "--token", "3")
    assert stale.returncode == exits.CODES["STALE_TOKEN"], stale.stderr
    done = fencing(servers, "delete", "shop", "cfg/a", "--token", "5")
    assert done.returncode == 0 and "deleted=True fence=5" in done.stdout, done.stderr
    with GuardClient(servers.guard_address) as guard:
        assert guard.read("shop", "cfg/a") is None
        assert guard.read("shop", "cfg/b") == Record(b"CFG/B", 4)  # only that key
    no_token = fencing(servers, "delete", "shop", "cfg/b")
    assert no_token.returncode != 0 and "token" in no_token.stderr


def test_a_page_stops_at_its_byte_budget_and_the_clients_page_on() -> None:
    big = b"x" * (1024 * 1024)  # the largest value: three fill a page's 3 MiB of values
    with running_servers() as servers, GuardClient(servers.guard_address) as guard:
        for k in "abcd":
            guard.put(Claim("blobs", 1), k, big)
        with grpc.insecure_channel(servers.guard_address) as channel:
            stub = guard_pb2_grpc.GuardServiceStub(channel)
            first = stub.ListRecords(guard_pb2.ListRecordsRequest(resource="blobs"))
        assert [r.key for r in first.records] == list("abc") and first.next_page_token == "c"
        assert [k for k, _ in guard.list_records("blobs")] == list("abcd")


def test_bad_listing_fields_are_named() -> None:
    with running_servers() as servers, GuardClient(servers.guard_address) as guard:
        with pytest.raises(InvalidArgumentError) as info:
            list(guard.list_records("r", page_size=1001))
        assert info.value.field == "page_size"
        with pytest.raises(InvalidArgumentError) as info:
            list(guard.list_records(""))
        assert info.value.field == "resource"
        with grpc.insecure_channel(servers.guard_address) as channel:
            stub = guard_pb2_grpc.GuardServiceStub(channel)
            with pytest.raises(grpc.RpcError) as raw:  # a cursor no page handed out
                stub.ListRecords(guard_pb2.ListRecordsRequest(resource="r", page_token="k" * 1025))
        assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "page_token" in (raw.value.details() or "")


async def test_the_async_twin_lists_alike(servers: RunningServers) -> None:
    async with AsyncGuardClient(servers.guard_address) as guard:
        got = [k async for k, _ in guard.list_records("shop", "cfg/", page_size=2)]
    assert got == KEYS[:5]


class _StoreWithoutListing:
    """A store of its own on the seam's required members only (no ``list_records``)."""

    def __init__(self) -> None:
        self._inner = MemoryStore()

    def __getattr__(self, name: str) -> Any:
        if name == "list_records":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_a_store_that_does_not_list_answers_not_found() -> None:
    store = cast(GuardStore, _StoreWithoutListing())
    with running_servers(store=store) as servers, GuardClient(servers.guard_address) as guard:
        guard.put(Claim("r", 1), "k", b"v")  # the store works otherwise
        with pytest.raises(NotFoundError, match="does not list records"):
            list(guard.list_records("r"))
