"""Independent lease calls of different callers in one backend step (``LeaseSteps``, the
group commit of lease calls): every backend, and the one-call-per-step fallback, pass
these. Each step keeps the verdict its single call would give, and appends the same
events; steps of one resource apply in the order given."""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from fencing.errors import LeaseLost
from lease_server.backends.base import LeaseBackend, LeaseSteps, event_log_of
from lease_server.backends.redis import RedisBackend
from lease_server.backends.sqlite import SQLiteBackend
from lease_server.batches import OneByOne, steps_of
from lease_server.leases import (
    AcquireItem,
    Grant,
    Held,
    LeaseStep,
    ReleaseItem,
    RenewItem,
    Scope,
    StepOutcome,
    TransitionKind,
)
from tests import redis_server
from tests.backends import TimeControl

Pair = tuple[LeaseBackend, TimeControl]
Steps = tuple[LeaseBackend, LeaseSteps, TimeControl]


@pytest.fixture(params=["native", "one-by-one"])
async def steps_backend(
    request: pytest.FixtureRequest, lease_backend: Pair
) -> AsyncIterator[Steps]:
    backend, time = lease_backend
    if request.param == "native":
        assert isinstance(backend, LeaseSteps)
        yield backend, steps_of(backend), time
    else:
        yield backend, OneByOne(backend), time


async def _grant(backend: LeaseBackend, resource: str, holder: str, ttl_ms: int = 10_000) -> Grant:
    outcome = await backend.acquire(resource, holder, ttl_ms, "")
    assert isinstance(outcome, Grant), outcome
    return outcome


async def _head(backend: LeaseBackend) -> int:
    log = event_log_of(backend)
    return await log.head_revision() if log is not None else 0


async def test_mixed_steps_each_get_their_own_verdict(steps_backend: Steps) -> None:
    backend, steps, _ = steps_backend
    held = await _grant(backend, "s-held", "other")
    kept = await _grant(backend, "s-renew", "r")
    freed = await _grant(backend, "s-release", "x")
    gone = await _grant(backend, "s-lost", "y")
    head = await _head(backend)
    outcomes = await steps.lease_steps(
        [
            AcquireItem("s-free", "a", 5000, "req-a"),
            AcquireItem("s-held", "b", 5000, ""),
            RenewItem("s-renew", kept.token, "r", 7000),
            RenewItem("s-lost", gone.token + 1, "", 7000),
            ReleaseItem("s-release", freed.token, "x"),
            ReleaseItem("s-lost", gone.token, "someone-else"),
        ]
    )
    granted, refused, renewed, not_renewed, released, not_released = outcomes
    assert isinstance(granted, Grant) and granted.holder == "a" and not granted.replayed
    assert granted.resource == "s-free" and 0 < granted.ttl_ms <= 5000
    assert isinstance(refused, Held)
    assert (refused.resource, refused.holder, refused.token) == ("s-held", "other", held.token)
    assert 0 < refused.remaining_ms <= 10_000
    assert isinstance(renewed, Grant) and (renewed.token, renewed.holder) == (kept.token, "r")
    assert renewed.ttl_ms == 7000
    assert isinstance(not_renewed, LeaseLost) and not_renewed.resource == "s-lost"
    assert released is None
    assert isinstance(not_released, LeaseLost) and not_released.resource == "s-lost"
    # The state is what the single calls would have left.
    free = await backend.describe("s-free")
    assert free.held and free.holder == "a" and free.token == granted.token
    assert (await backend.describe("s-held")).token == held.token
    assert not (await backend.describe("s-release")).held
    assert (await backend.describe("s-lost")).token == gone.token
    # A retry of the granted acquire replays it, alone or in a batch.
    (again,) = await steps.lease_steps([AcquireItem("s-free", "a", 5000, "req-a")])
    assert isinstance(again, Grant) and again.replayed and again.token == granted.token
    # Events: only the grant and the release, as their single calls append.
    log = event_log_of(backend)
    if log is not None:
        page = await log.events_after(head, Scope(prefix="s-"), 100)
        kinds = sorted((e.kind, e.resource) for e in page.events)
        assert kinds == [
            (TransitionKind.ACQUIRED, "s-free"),
            (TransitionKind.RELEASED, "s-release"),
        ]


async def test_steps_of_one_resource_apply_in_order(steps_backend: Steps) -> None:
    backend, steps, _ = steps_backend
    first = await _grant(backend, "t-one", "old")
    outcomes = await steps.lease_steps(
        [
            ReleaseItem("t-one", first.token, "old"),
            AcquireItem("t-one", "new", 5000, ""),
            AcquireItem("t-one", "late", 5000, ""),
            AcquireItem("t-two", "p", 5000, "req-p"),
            AcquireItem("t-two", "p", 5000, "req-p"),
            RenewItem("t-two", 0, "p", 5000),
        ]
    )
    released, granted, refused, two, replayed, _ = outcomes
    assert released is None
    assert isinstance(granted, Grant) and granted.token > first.token
    assert isinstance(refused, Held) and (refused.holder, refused.token) == ("new", granted.token)
    assert isinstance(two, Grant) and isinstance(replayed, Grant)
    assert replayed.replayed and replayed.token == two.token
    info = await backend.describe("t-one")
    assert info.holder == "new" and info.token == granted.token
    # A renewal after the grant in the same step sees it (token 0 is never a lease).
    (renewed,) = await steps.lease_steps([RenewItem("t-two", two.token, "p", 6000)])
    assert isinstance(renewed, Grant) and renewed.ttl_ms == 6000


async def test_a_renew_step_naming_no_ttl_keeps_the_leases_own(steps_backend: Steps) -> None:
    """ttl_ms 0 in a step: the lease's own ttl, also of a grant earlier in the same step."""
    backend, steps, _ = steps_backend
    old = await _grant(backend, "own-old", "p", ttl_ms=45_000)
    granted, renewed, kept = await steps.lease_steps(
        [
            AcquireItem("own-new", "q", 25_000, ""),
            RenewItem("own-old", old.token, "p", 0),
            RenewItem("own-new", old.token + 10**9, "q", 0),
        ]
    )
    assert isinstance(granted, Grant) and granted.ttl_ms == 25_000
    assert isinstance(renewed, Grant) and renewed.ttl_ms == 45_000
    assert isinstance(kept, LeaseLost)
    (again,) = await steps.lease_steps([RenewItem("own-new", granted.token, "q", 0)])
    assert isinstance(again, Grant) and again.ttl_ms == 25_000
    assert 15_000 < (await backend.describe("own-new")).remaining_ms <= 25_000


async def test_steps_take_over_an_expired_lease_with_its_expiry_logged(
    steps_backend: Steps,
) -> None:
    backend, steps, time = steps_backend
    old = await _grant(backend, "u-exp", "old", ttl_ms=150)
    await time.sleep(300)
    head = await _head(backend)
    outcomes = await steps.lease_steps(
        [AcquireItem("u-exp", "new", 5000, ""), RenewItem("u-exp", old.token, "old", 5000)]
    )
    grant, lost = outcomes
    assert isinstance(grant, Grant) and grant.token > old.token and grant.holder == "new"
    assert isinstance(lost, LeaseLost)
    log = event_log_of(backend)
    if log is not None:
        page = await log.events_after(head, Scope(resource="u-exp"), 10)
        # The sweeper may not have run (none here): the takeover logs the expiry first.
        assert [(e.kind, e.token) for e in page.events] == [
            (TransitionKind.EXPIRED, old.token),
            (TransitionKind.ACQUIRED, grant.token),
        ]


async def test_steps_agree_with_single_calls(steps_backend: Steps) -> None:
    """A random mix of steps over a few resources, in rounds: per step, the batch gives
    the verdict (kind and holder) that the same calls made one by one give, on a twin
    set of resources with the same history."""
    backend, steps, _ = steps_backend
    rng = random.Random(7)
    worlds = {"m": steps, "n": OneByOne(backend)}
    tokens: dict[str, dict[int, int]] = {"m": {}, "n": {}}
    for _ in range(5):
        plan = [
            (rng.randrange(4), rng.randrange(3), f"h{rng.randrange(2)}", rng.randrange(3))
            for _ in range(12)
        ]
        results = {}
        for world, runner in worlds.items():
            known = tokens[world]
            ops: list[LeaseStep] = []
            for r, kind, holder, pick in plan:
                resource = f"{world}{r}"
                token = known.get(r, 1) + (1 if pick == 2 else 0)
                who = "" if pick == 1 else holder
                if kind == 0:
                    ops.append(AcquireItem(resource, holder, 5000, f"q{pick}"))
                elif kind == 1:
                    ops.append(RenewItem(resource, token, who, 5000))
                else:
                    ops.append(ReleaseItem(resource, token, who))
            results[world] = await runner.lease_steps(ops)
            for (r, _, _, _), got in zip(plan, results[world], strict=True):
                if isinstance(got, Grant):
                    known[r] = got.token
        for step, got, want in zip(plan, results["m"], results["n"], strict=True):
            assert type(got) is type(want), (step, got, want)
            if isinstance(got, Grant | Held) and isinstance(want, Grant | Held):
                assert (got.holder, getattr(got, "replayed", False)) == (
                    want.holder,
                    getattr(want, "replayed", False),
                ), (step, got, want)


# -- two backends on one database (two server processes) ------------------------------------

Twins = Callable[[], AbstractAsyncContextManager[tuple[LeaseBackend, LeaseBackend]]]


@asynccontextmanager
async def _both_open(
    one: LeaseBackend, two: LeaseBackend
) -> AsyncIterator[tuple[LeaseBackend, LeaseBackend]]:
    await one.open()
    await two.open()
    try:
        yield one, two
    finally:
        await one.close()
        await two.close()


@asynccontextmanager
async def _sqlite_twins() -> AsyncIterator[tuple[LeaseBackend, LeaseBackend]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "l.db"
        async with _both_open(SQLiteBackend(path), SQLiteBackend(path)) as pair:
            yield pair


@asynccontextmanager
async def _postgres_twins() -> AsyncIterator[tuple[LeaseBackend, LeaseBackend]]:
    from lease_server.backends.postgres import PostgresBackend
    from tests import pg

    async with (
        pg.fresh_schema() as (dsn, schema),
        _both_open(PostgresBackend(dsn, schema), PostgresBackend(dsn, schema)) as pair,
    ):
        yield pair


@asynccontextmanager
async def _redis_twins() -> AsyncIterator[tuple[LeaseBackend, LeaseBackend]]:
    url = redis_server.SERVERS.standalone_url()
    prefix = redis_server.unique_prefix()
    try:
        async with _both_open(
            RedisBackend(url, prefix=prefix), RedisBackend(url, prefix=prefix)
        ) as pair:
            yield pair
    finally:
        await redis_server.drop_prefix(url, prefix)


TWINS = [
    pytest.param(_sqlite_twins, id="sqlite"),
    pytest.param(_postgres_twins, id="postgres", marks=pytest.mark.postgres),
    pytest.param(_redis_twins, id="redis", marks=pytest.mark.redis),
]


@pytest.mark.parametrize("twins", TWINS)
async def test_two_backends_batches_on_overlapping_resources(twins: Twins) -> None:
    """Two backends on one database (two connections, as two lease-server processes) run
    batches over the same resources, named in opposite orders, at once, many times:
    none deadlocks or fails, and no resource is ever granted to both."""
    names = [f"o{i}" for i in range(8)]
    granted = 0
    async with twins() as (one, two):
        rounds = 15
        for n in range(rounds):
            forward: list[LeaseStep] = [AcquireItem(r, "one", 10_000, "") for r in names]
            backward: list[LeaseStep] = [AcquireItem(r, "two", 10_000, "") for r in reversed(names)]
            s1, s2 = steps_of(one), steps_of(two)
            got1, got2 = await asyncio.wait_for(
                asyncio.gather(s1.lease_steps(forward), s2.lease_steps(backward)), 30
            )
            by1 = {op.resource: g for op, g in zip(forward, got1, strict=True)}
            by2 = {op.resource: g for op, g in zip(backward, got2, strict=True)}
            for r in names:
                # Exactly one of the two got it, and the other was told who holds it.
                won = [isinstance(by1[r], Grant), isinstance(by2[r], Grant)]
                assert won.count(True) == 1, (n, r, by1[r], by2[r])
                winner = by1[r] if won[0] else by2[r]
                loser = by2[r] if won[0] else by1[r]
                assert isinstance(winner, Grant) and isinstance(loser, Held)
                assert loser.token == winner.token and loser.holder == winner.holder
                info = await one.describe(r)
                assert info.holder == winner.holder and info.token == winner.token
                granted += 1
            # Both release what they got, in one batch each, at once.
            rel1: list[LeaseStep] = [
                ReleaseItem(r, g.token, "one") for r, g in by1.items() if isinstance(g, Grant)
            ]
            rel2: list[LeaseStep] = [
                ReleaseItem(r, g.token, "two") for r, g in by2.items() if isinstance(g, Grant)
            ]
            done = await asyncio.gather(
                s1.lease_steps(rel1) if rel1 else _none(),
                s2.lease_steps(rel2) if rel2 else _none(),
            )
            assert all(v is None for part in done for v in part)
        # Every grant and release is in the one log, once, numbered 1, 2, 3 ... (what
        # either backend left pending is numbered before a read could come up short).
        log = event_log_of(two)
        if log is not None:
            page = await log.events_after(0, Scope(prefix="o"), 10 * granted)
            assert [e.revision for e in page.events] == list(range(1, 2 * granted + 1))
            kinds = [e.kind for e in page.events]
            assert kinds.count(TransitionKind.ACQUIRED) == granted
            assert kinds.count(TransitionKind.RELEASED) == granted


async def _none() -> list[StepOutcome]:
    return []
