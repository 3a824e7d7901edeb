"""Many leases in one step (AcquireMany, RenewMany, ReleaseMany): every backend, and the
one-call-per-lease fallback, pass these."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator

import pytest
from redis.crc import key_slot

from fencing.errors import InvalidArgumentError, LeaseLost
from fencing.limits import MAX_ACQUIRE_MANY, MAX_RENEW_MANY
from lease_server.backends.base import (
    LeaseBackend,
    LeaseBatches,
    event_log_of,
    resource_log_of,
)
from lease_server.backends.memory import MemoryBackend
from lease_server.batches import OneByOne, batches_of
from lease_server.clock import ManualClock
from lease_server.leases import Grant, Held, ReleaseItem, RenewItem, Scope, TransitionKind
from serving.redis_db import ResourceKeys
from tests.backends import TimeControl

Pair = tuple[LeaseBackend, TimeControl]


@pytest.fixture(params=["native", "one-by-one"])
async def batch_backend(
    request: pytest.FixtureRequest, lease_backend: Pair
) -> AsyncIterator[tuple[LeaseBackend, LeaseBatches, TimeControl]]:
    backend, time = lease_backend
    if request.param == "native":
        assert isinstance(backend, LeaseBatches)
        yield backend, batches_of(backend), time
    else:
        yield backend, OneByOne(backend), time


Batch = tuple[LeaseBackend, LeaseBatches, TimeControl]


def names(backend: LeaseBackend, count: int, base: str = "b") -> list[str]:
    """``count`` resources one AcquireMany may span: any on one server; on a Redis
    Cluster, names whose keys share one hash slot."""
    if not getattr(backend, "cluster", False):
        return [f"{base}{i}" for i in range(count)]
    prefix = backend.prefix  # type: ignore[attr-defined]
    slot = key_slot(ResourceKeys(prefix, f"{base}0").lease.encode())
    found = [f"{base}0"]
    for i in itertools.count(1):
        if key_slot(ResourceKeys(prefix, f"{base}{i}").lease.encode()) == slot:
            found.append(f"{base}{i}")
            if len(found) == count:
                return found
    raise AssertionError("unreachable")


async def test_acquire_many_grants_every_resource(batch_backend: Batch) -> None:
    backend, batches, _ = batch_backend
    a, b, c = names(backend, 3)
    await backend.release(a, (await _grant(backend, a)).token, "a")
    before = (await backend.describe(a)).last_token
    grants = await batches.acquire_many(sorted([c, a, b]), "h", 5000, "")
    assert isinstance(grants, list) and len(grants) == 3
    by = {g.resource: g for g in grants}
    assert set(by) == {a, b, c}
    assert by[a].token > before
    for r in (a, b, c):
        info = await backend.describe(r)
        assert info.held and info.holder == "h" and info.token == by[r].token
        assert 0 < by[r].ttl_ms <= 5000 and not by[r].replayed


async def test_one_held_resource_refuses_all(batch_backend: Batch) -> None:
    backend, batches, _ = batch_backend
    a, b, c = names(backend, 3)
    held = await _grant(backend, b, "other")
    outcome = await batches.acquire_many(sorted([a, b, c]), "h", 5000, "")
    assert isinstance(outcome, Held)
    assert (outcome.resource, outcome.holder, outcome.token) == (b, "other", held.token)
    assert 0 < outcome.remaining_ms <= 10_000
    for r in (a, c):
        assert not (await backend.describe(r)).held
    assert (await backend.describe(b)).token == held.token


async def test_a_retried_acquire_many_replays(batch_backend: Batch) -> None:
    backend, batches, _ = batch_backend
    a, b = names(backend, 2)
    first = await batches.acquire_many([a, b], "h", 5000, "req-1")
    again = await batches.acquire_many([a, b], "h", 5000, "req-1")
    assert isinstance(first, list) and isinstance(again, list)
    assert [g.token for g in again] == [g.token for g in first]
    assert all(g.replayed for g in again)
    assert isinstance(await batches.acquire_many([a, b], "h", 5000, "req-2"), Held)


async def test_acquire_many_takes_over_expired_leases(batch_backend: Batch) -> None:
    backend, batches, time = batch_backend
    a, b = names(backend, 2)
    old = await _grant(backend, a, "old", ttl_ms=150)
    await time.sleep(200)
    grants = await batches.acquire_many([a, b], "new", 5000, "")
    assert isinstance(grants, list)
    assert grants[0].token > old.token and grants[0].holder == "new"


async def test_renew_many_renews_each_on_its_own(batch_backend: Batch) -> None:
    backend, batches, time = batch_backend
    a, b, c, d = names(backend, 4)
    # On real time (PostgreSQL, Redis) the margins are wide enough for a loaded machine:
    # a and c outlive b's expiry by far, and the second sleep ends between a's first
    # expiry and its renewed one with most of a second to spare on either side.
    ga = await _grant(backend, a, "h", ttl_ms=1000)
    gb = await _grant(backend, b, "h", ttl_ms=150)
    gc = await _grant(backend, c, "h", ttl_ms=1000)
    await time.sleep(300)  # b expired
    outcomes = await batches.renew_many(
        [
            RenewItem(a, ga.token, "h", 2500),
            RenewItem(b, gb.token, "h", 2500),
            RenewItem(c, gc.token, "someone-else", 2500),
            RenewItem(d, 7, "", 2500),
        ]
    )
    assert isinstance(outcomes[0], Grant) and outcomes[0].token == ga.token
    assert outcomes[0].holder == "h" and outcomes[0].ttl_ms == 2500
    for lost, resource in zip(outcomes[1:], (b, c, d), strict=True):
        assert isinstance(lost, LeaseLost) and lost.resource == resource
    await time.sleep(900)  # past a's first expiry, within the renewed one
    assert (await backend.describe(a)).held
    assert not (await backend.describe(c)).held


async def test_release_many_releases_each_on_its_own(batch_backend: Batch) -> None:
    backend, batches, _ = batch_backend
    a, b, c = names(backend, 3)
    ga = await _grant(backend, a)
    gb = await _grant(backend, b)
    outcomes = await batches.release_many(
        [
            ReleaseItem(a, ga.token, "a"),
            ReleaseItem(b, gb.token, "intruder"),
            ReleaseItem(c, 1, ""),
        ]
    )
    assert outcomes[0] is None
    assert isinstance(outcomes[1], LeaseLost) and isinstance(outcomes[2], LeaseLost)
    info = await backend.describe(a)
    assert not info.held and info.last_token == ga.token
    assert (await backend.describe(b)).held


async def test_overlapping_sets_in_any_order_never_deadlock(batch_backend: Batch) -> None:
    """Two holders ask, at the same time and over and over, for sets that overlap, named
    in opposite orders (the service sorts; here each asks sorted, as the service does):
    at most one wins each round, nobody fails for any other reason."""
    backend, batches, _ = batch_backend
    pool = names(backend, 5, "dl")
    rng = random.Random(7)
    for _ in range(15):
        one = sorted(rng.sample(pool, 3))
        two = sorted({*rng.sample(pool, 2), one[1]})
        first, second = await asyncio.gather(
            batches.acquire_many(one, "one", 5000, ""),
            batches.acquire_many(two, "two", 5000, ""),
        )
        winners = [(o, h) for o, h in ((first, "one"), (second, "two")) if isinstance(o, list)]
        assert len(winners) <= 1
        for grants, holder in winners:
            released = await batches.release_many(
                [ReleaseItem(g.resource, g.token, holder) for g in grants]
            )
            assert released == [None] * len(grants)


async def test_batches_append_their_events(lease_backend: Pair) -> None:
    """Each lease of a batch appends the events its single call would (the shared log,
    or each resource's own log on a Redis Cluster): renewals none."""
    backend, _ = lease_backend
    shared, own = event_log_of(backend), resource_log_of(backend)
    if shared is None and own is None:
        pytest.skip(f"the {backend.name} lease backend keeps no event log")
    a, b = names(backend, 2, "ev")
    start = await shared.head_revision() if shared is not None else 0
    grants = await batches_of(backend).acquire_many([a, b], "h", 5000, "")
    assert isinstance(grants, list)
    renewals = [RenewItem(g.resource, g.token, "h", 6000) for g in grants]
    await batches_of(backend).renew_many(renewals)
    await batches_of(backend).release_many([ReleaseItem(a, grants[0].token, "h")])
    if shared is not None:
        page = await shared.events_after(start, Scope(), 100)
        kinds = [(e.kind, e.resource) for e in page.events]
        assert sorted(kinds, key=lambda k: k[1]) == sorted(
            [
                (TransitionKind.ACQUIRED, a),
                (TransitionKind.ACQUIRED, b),
                (TransitionKind.RELEASED, a),
            ],
            key=lambda k: k[1],
        )
        assert [k for k, r in kinds if r == a] == [TransitionKind.ACQUIRED, TransitionKind.RELEASED]
        revisions = [e.revision for e in page.events]
        assert revisions == sorted(revisions) and len(set(revisions)) == len(revisions)
    else:
        assert own is not None
        for resource, expected in (
            (a, [TransitionKind.ACQUIRED, TransitionKind.RELEASED]),
            (b, [TransitionKind.ACQUIRED]),
        ):
            page = await own.resource_events_after(resource, 0, 100)
            assert [e.kind for e in page.events] == expected


async def test_cluster_refuses_acquire_many_across_slots(lease_backend: Pair) -> None:
    backend, _ = lease_backend
    if not getattr(backend, "cluster", False):
        pytest.skip("only a Redis Cluster splits resources across slots")
    prefix = backend.prefix  # type: ignore[attr-defined]
    by_slot = {key_slot(ResourceKeys(prefix, f"s{i}").lease.encode()): f"s{i}" for i in range(50)}
    a, b = sorted(by_slot.values())[:2]
    with pytest.raises(InvalidArgumentError):
        await batches_of(backend).acquire_many([a, b], "h", 5000, "")
    # Renewals and releases do not need one slot: each lease is renewed on its own.
    ga, gb = await _grant(backend, a), await _grant(backend, b)
    outcomes = await batches_of(backend).renew_many(
        [RenewItem(a, ga.token, "a", 5000), RenewItem(b, gb.token, "a", 5000)]
    )
    assert all(isinstance(o, Grant) for o in outcomes)


async def test_the_fallback_backs_out_what_it_took() -> None:
    """OneByOne cannot take all at once: when one is held it releases what it took."""
    backend = MemoryBackend(ManualClock())
    await backend.acquire("c", "other", 5000, "")
    outcome = await OneByOne(backend).acquire_many(["a", "b", "c"], "h", 5000, "")
    assert isinstance(outcome, Held) and outcome.resource == "c"
    assert not (await backend.describe("a")).held and not (await backend.describe("b")).held


async def _grant(
    backend: LeaseBackend, resource: str, holder: str = "a", ttl_ms: int = 10_000
) -> Grant:
    outcome = await backend.acquire(resource, holder, ttl_ms, "")
    assert isinstance(outcome, Grant), outcome
    return outcome


async def test_renew_many_naming_no_ttl_keeps_each_leases_own(batch_backend: Batch) -> None:
    backend, batches, _ = batch_backend
    a, b, c = names(backend, 3, "own")
    ga = await _grant(backend, a, "h", ttl_ms=40_000)
    gb = await _grant(backend, b, "h", ttl_ms=20_000)
    outcomes = await batches.renew_many(
        [
            RenewItem(a, ga.token, "h", 0),
            RenewItem(b, gb.token, "h", 0),
            RenewItem(c, 9, "h", 0),
        ]
    )
    assert [o.ttl_ms for o in outcomes[:2] if isinstance(o, Grant)] == [40_000, 20_000]
    assert isinstance(outcomes[2], LeaseLost)
    assert 30_000 < (await backend.describe(a)).remaining_ms <= 40_000
    assert 10_000 < (await backend.describe(b)).remaining_ms <= 20_000


async def test_renew_many_and_release_many_at_their_limit(batch_backend: Batch) -> None:
    """One RenewMany of MAX_RENEW_MANY leases, then one ReleaseMany of them, each one
    backend call bounded by the backend's own timeout: every lease renewed, then freed.
    A client holding that many renews them all in one call every few seconds; a backend
    whose work grew faster than the number of leases ran past its timeout here and the
    client lost every lease."""
    backend, batches, _ = batch_backend
    if getattr(backend, "cluster", False):
        pytest.skip("AcquireMany cannot span a Redis Cluster's slots to take so many")
    if isinstance(batches, OneByOne):
        pytest.skip("one call per lease: nothing at stake in the size of one call")
    grants: list[Grant] = []
    for chunk in range(MAX_RENEW_MANY // MAX_ACQUIRE_MANY):
        taken = await batches.acquire_many(
            [f"lim{chunk}-{i}" for i in range(MAX_ACQUIRE_MANY)], "h", 60_000, ""
        )
        assert isinstance(taken, list)
        grants.extend(taken)
    assert len(grants) == MAX_RENEW_MANY
    renewed = await batches.renew_many(
        [RenewItem(g.resource, g.token, "h", 60_000) for g in grants]
    )
    assert all(isinstance(o, Grant) for o in renewed)
    released = await batches.release_many([ReleaseItem(g.resource, g.token, "h") for g in grants])
    assert released == [None] * MAX_RENEW_MANY
    for g in grants[:: MAX_ACQUIRE_MANY // 2]:
        assert not (await backend.describe(g.resource)).held
