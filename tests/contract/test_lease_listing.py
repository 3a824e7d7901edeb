"""``LeaseBackend.list_held``: every backend in tests/backends.py lists the same leases.

Held leases only (an expired or released one is not listed), under a byte-wise prefix
(no wildcards: ``%``, ``_``, ``*`` and ``{`` are plain characters), in code point
order, after a cursor, at most ``limit``.
"""

from __future__ import annotations

import asyncio

from fencing.limits import MAX_PAGE_SIZE
from fencing.types import LeaseState
from lease_server.backends.base import LeaseBackend
from lease_server.leases import Grant
from tests.backends import TimeControl

Pair = tuple[LeaseBackend, TimeControl]


async def take(backend: LeaseBackend, resource: str, ttl_ms: int = 10_000) -> Grant:
    outcome = await backend.acquire(resource, "h-" + resource[-1], ttl_ms, "")
    assert isinstance(outcome, Grant), outcome
    return outcome


def names(infos: list[LeaseState]) -> list[str]:
    return [info.resource for info in infos]


async def test_lists_held_leases_under_a_prefix_in_order(lease_backend: Pair) -> None:
    backend, _ = lease_backend
    grants = {r: await take(backend, r) for r in ["orders/b", "orders/a", "orders/é", "other/x"]}
    await take(backend, "orders/gone")
    await backend.release("orders/gone", (await backend.describe("orders/gone")).token, "")
    listed = await backend.list_held("orders/", "", 10)
    assert names(listed) == ["orders/a", "orders/b", "orders/é"]  # code point order
    first = listed[0]
    assert first.held and first.holder == "h-a" and first.token == grants["orders/a"].token
    assert 0 < first.remaining_ms <= 10_000 and first.last_token == first.token
    assert names(await backend.list_held("", "", 10)) == [
        "orders/a",
        "orders/b",
        "orders/é",
        "other/x",
    ]
    assert await backend.list_held("nothing/", "", 10) == []


async def test_describe_and_list_show_the_leases_own_ttl(lease_backend: Pair) -> None:
    """The ttl a renewal naming none renews by: the grant's, then the last renewal's."""
    backend, _ = lease_backend
    a = await take(backend, "own/a", ttl_ms=45_000)
    await take(backend, "own/b", ttl_ms=15_000)
    assert (await backend.describe("own/a")).ttl_ms == 45_000
    await backend.renew("own/a", a.token, "", 30_000)
    listed = await backend.list_held("own/", "", 10)
    assert [(i.resource, i.ttl_ms) for i in listed] == [("own/a", 30_000), ("own/b", 15_000)]
    await backend.release("own/a", a.token, "")
    free = await backend.describe("own/a")
    assert not free.held and free.ttl_ms == 0
    assert (await backend.describe("never")).ttl_ms == 0


async def test_pages_follow_the_cursor(lease_backend: Pair) -> None:
    backend, _ = lease_backend
    for i in range(5):
        await take(backend, f"p/{i}")
    assert names(await backend.list_held("p/", "", 2)) == ["p/0", "p/1"]
    assert names(await backend.list_held("p/", "p/1", 2)) == ["p/2", "p/3"]
    assert names(await backend.list_held("p/", "p/3", 2)) == ["p/4"]
    assert await backend.list_held("p/", "p/4", 2) == []


async def test_expired_leases_are_not_listed(lease_backend: Pair) -> None:
    backend, time = lease_backend
    await take(backend, "e/short", ttl_ms=200)
    await take(backend, "e/long")
    await time.sleep(300)
    assert names(await backend.list_held("e/", "", 10)) == ["e/long"]


async def test_the_prefix_has_no_wildcards(lease_backend: Pair) -> None:
    backend, _ = lease_backend
    for r in ["a%b", "axb", "a_b", "a*b", "a{b}", "a[b"]:
        await take(backend, r)
    assert names(await backend.list_held("a%", "", 10)) == ["a%b"]
    assert names(await backend.list_held("a_", "", 10)) == ["a_b"]
    assert names(await backend.list_held("a*", "", 10)) == ["a*b"]
    assert names(await backend.list_held("a{", "", 10)) == ["a{b}"]
    assert names(await backend.list_held("a[", "", 10)) == ["a[b"]


async def test_a_full_page_of_the_largest_size(lease_backend: Pair) -> None:
    """The service asks for MAX_PAGE_SIZE + 1 (to know whether a page follows): a backend
    reads that many in one call without running out of connections."""
    backend, _ = lease_backend
    resources = [f"big/{i:04d}" for i in range(MAX_PAGE_SIZE)]
    for start in range(0, len(resources), 50):  # one by one: a cluster's slots differ
        chunk = resources[start : start + 50]
        await asyncio.gather(*(backend.acquire(r, "h", 30_000, "") for r in chunk))
    assert names(await backend.list_held("big/", "", MAX_PAGE_SIZE + 1)) == resources
