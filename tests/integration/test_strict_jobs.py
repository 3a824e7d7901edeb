"""Strict mode knows jobs: a PostgreSQL guard (and ``check_live_lease`` in your own SQL)
accepts the live claim of the job that owns a resource and refuses, as LEASE_LOST, a
claim that expired or was taken over, by the database's clock.

Claims are real: made through the PostgreSQL queue backend on the guard's schema. A
Redis lease server hosts no queue (there is no Redis queue backend), so strict job
writes exist on PostgreSQL only; a strict Redis guard refuses them (fails closed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import sql

from fencing.errors import LeaseLost, StaleTokenError
from fencing.types import Put, Record
from guard.fence import FenceMode
from guard.stores.postgres import PostgresStore
from lease_server.queue.backends.postgres import PostgresQueue
from lease_server.queue.jobs import JobRecord, JobRef, NewJob
from serving import postgres_db
from tests import pg as testpg

pytestmark = pytest.mark.postgres

STRICT = FenceMode.STRICT


@pytest.fixture
async def schema() -> AsyncIterator[tuple[str, str]]:
    async with testpg.fresh_schema() as pair:
        yield pair


@pytest.fixture
async def queue(schema: tuple[str, str]) -> AsyncIterator[PostgresQueue]:
    q = PostgresQueue(*schema)
    await q.open()
    yield q
    await q.close()


@pytest.fixture
async def store(schema: tuple[str, str], queue: PostgresQueue) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(*schema)
    await s.open()
    yield s
    await s.close()


async def claim_one(queue: PostgresQueue, worker: str, ttl_ms: int) -> JobRecord:
    (job,) = await queue.claim("q", worker, 1, ttl_ms)
    return job


async def test_strict_accepts_the_live_claim_and_refuses_it_once_expired(
    queue: PostgresQueue, store: PostgresStore
) -> None:
    await queue.enqueue("q", [NewJob(b"send")])
    job = await claim_one(queue, "worker-a", 300)
    r = job.fenced_resource
    assert r == f"job/q/{job.id}"
    ok = await store.write(r, job.token, [Put("sent", b"live")], mode=STRICT)
    assert ok.fence == job.token
    await asyncio.sleep(0.4)  # the claim expires; nobody rescued it yet
    with pytest.raises(LeaseLost, match="not the live lease or job claim") as lost:
        await store.write(r, job.token, [Put("sent", b"late")], mode=STRICT)
    assert (lost.value.resource, lost.value.token) == (r, job.token)
    assert await store.read(r, "sent") == Record(b"live", job.token)
    # The control: monotonic mode accepts the same late write (token == fence).
    assert (await store.write(r, job.token, [Put("sent", b"late")])).fence == job.token
    assert await store.read(r, "sent") == Record(b"late", job.token)


async def test_strict_refuses_a_claim_that_was_taken_over(
    queue: PostgresQueue, store: PostgresStore
) -> None:
    """Worker A's claim expires and B rescues the job; B has not written yet, so A's
    token is not below the fence: strict still refuses it (LEASE_LOST), monotonic would
    not. After B writes, A's token is below the fence (STALE_TOKEN)."""
    await queue.enqueue("q", [NewJob(b"send")])
    a = await claim_one(queue, "worker-a", 200)
    await asyncio.sleep(0.3)
    b = await claim_one(queue, "worker-b", 10_000)
    assert b.id == a.id and b.token > a.token
    coupon = a.fenced_resource
    with pytest.raises(LeaseLost):
        await store.write(coupon, a.token, [Put("used", b"by a")], mode=STRICT)
    assert (await store.write(coupon, b.token, [Put("used", b"by b")], mode=STRICT)).fence
    with pytest.raises(StaleTokenError) as stale:
        await store.write(coupon, a.token, [Put("used", b"by a")], mode=STRICT)
    assert stale.value.current_token == b.token
    # Done is not live: a completed claim writes no more.
    await queue.complete([JobRef(b.id, b.token)], "q")
    with pytest.raises(LeaseLost):
        await store.write(coupon, b.token, [Put("used", b"after")], mode=STRICT)
    assert await store.read(coupon, "used") == Record(b"by b", b.token)


async def test_strict_refuses_a_token_nobody_was_granted(
    queue: PostgresQueue, store: PostgresStore
) -> None:
    """Never granted (2**63 - 1): LEASE_LOST for a write and for a Fence, so it cannot
    wedge the resource; a live claim of the job still writes."""
    await queue.enqueue("q", [NewJob(b"x")])
    job = await claim_one(queue, "worker-a", 10_000)
    ledger = job.fenced_resource
    for mode_call in (
        store.write(ledger, 2**63 - 1, [Put("k", b"wedge")], mode=STRICT),
        store.fence(ledger, 2**63 - 1, STRICT),
    ):
        with pytest.raises(LeaseLost):
            await mode_call
    assert await store.describe_fence(ledger) == 0
    assert (await store.write(ledger, job.token, [Put("k", b"ok")], mode=STRICT)).fence
    # The control: a monotonic Fence with the same token wedges it.
    await store.fence(ledger, 2**63 - 1)
    with pytest.raises(StaleTokenError):
        await store.write(ledger, job.token, [Put("k", b"real")])


async def test_check_live_lease_in_your_own_sql_knows_job_claims(
    schema: tuple[str, str], queue: PostgresQueue, store: PostgresStore
) -> None:
    dsn, name = schema
    check = sql.SQL("SELECT {}.check_live_lease(%s, %s)").format(sql.Identifier(name))
    await queue.enqueue("q", [NewJob(b"x")])
    job = await claim_one(queue, "w", 300)
    outbox = job.fenced_resource
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(check, (outbox, job.token))
        assert await cur.fetchone() == (job.token,)
        await asyncio.sleep(0.4)
        with pytest.raises(psycopg.Error) as raised:
            await conn.execute(check, (outbox, job.token))
    assert raised.value.sqlstate == postgres_db.LEASE_NOT_LIVE_SQLSTATE
    error = postgres_db.fencing_error(raised.value)
    assert isinstance(error, LeaseLost) and error.token == job.token


async def test_a_strict_job_write_holds_a_rescue_back_until_it_commits(
    schema: tuple[str, str], queue: PostgresQueue, store: PostgresStore
) -> None:
    """The job row is share-locked by the strict check: a rescue skips it (claims use
    SKIP LOCKED) until the transaction that checked the claim commits."""
    dsn, name = schema
    await queue.enqueue("q", [NewJob(b"x")])
    job = await claim_one(queue, "w", 200)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(
            sql.SQL("SELECT {}.check_live_lease(%s, %s)").format(sql.Identifier(name)),
            (job.fenced_resource, job.token),
        )
        await asyncio.sleep(0.3)  # expired by now, but our transaction is still open
        assert await queue.claim("q", "rescuer", 1, 10_000) == []
        await conn.commit()
    rescued = await claim_one(queue, "rescuer", 10_000)
    assert rescued.id == job.id and rescued.token > job.token


async def test_keys_recorded_before_the_upgrade_replay_and_refuse_by_their_fence(
    schema: tuple[str, str],
) -> None:
    """A schema at 0001-0007 has idempotency keys without the token that applied them:
    after 0008 the fence they recorded (= that token in every mode but off) stands in."""
    dsn, name = schema
    before = [m for m in postgres_db.migrations() if m.version <= 7]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await postgres_db._apply_migrations(conn, name, before)
        await conn.execute(
            sql.SQL(
                "SELECT * FROM {}.guard_write("
                "'r', 4, ARRAY['k'], ARRAY['v'::bytea], 'old', 'monotonic')"
            ).format(sql.Identifier(name))
        )
    store = PostgresStore(dsn, name)
    await store.open()  # migrates 0008 (and anything newer)
    try:
        again = await store.write("r", 4, [Put("k", b"again")], "old")
        assert again.replayed and again.replayed_by_token == 4
        await store.fence("r", 5)
        with pytest.raises(StaleTokenError) as stale:
            await store.write("r", 4, [Put("k", b"late")], "old")
        assert (stale.value.key_applied, stale.value.applied_by_token) == (True, 4)
    finally:
        await store.close()


async def test_reset_never_goes_below_a_granted_lease_or_job_token(
    schema: tuple[str, str], queue: PostgresQueue, store: PostgresStore
) -> None:
    from fencing.errors import InvalidArgumentError
    from lease_server.backends.postgres import PostgresBackend
    from lease_server.leases import Grant

    backend = PostgresBackend(*schema)
    await backend.open()
    try:
        grant = await backend.acquire("acct", "a", 10_000, "")
        assert isinstance(grant, Grant)
    finally:
        await backend.close()
    await queue.enqueue("q", [NewJob(b"x")])
    job = await claim_one(queue, "w", 10_000)
    outbox = job.fenced_resource
    for resource, granted in (("acct", grant.token), (outbox, job.token)):
        await store.fence(resource, 2**63 - 1)
        with pytest.raises(InvalidArgumentError) as below:
            await store.reset_fence(resource, granted - 1)
        assert below.value.field == "to_token"
        assert await store.describe_fence(resource) == 2**63 - 1
        assert await store.reset_fence(resource, granted) == 2**63 - 1
        assert await store.describe_fence(resource) == granted
    assert (await store.write(outbox, job.token, [Put("k", b"v")], mode=STRICT)).fence


async def test_strict_judges_the_claim_before_a_replay_in_write_and_write_many(
    queue: PostgresQueue, store: PostgresStore
) -> None:
    """A repeat of a keyed strict write is a replay only while its claim is live; once
    it expired the repeat is LEASE_LOST, saying the key was applied and by which token."""
    from guard.stores.base import ResourceWrite

    await queue.enqueue("q", [NewJob(b"a"), NewJob(b"b")])
    first, second = await queue.claim("q", "w", 2, 300)
    o1, o2 = first.fenced_resource, second.fenced_resource
    many = [ResourceWrite(o1, first.token, [Put("k", b"1")]), ResourceWrite(o2, second.token)]
    assert not (await store.write_many(many, "move", STRICT)).replayed
    again = await store.write_many(many, "move", STRICT)
    assert again.replayed and again.replayed_by_tokens == (first.token, second.token)
    await store.write(o1, first.token, [Put("j", b"x")], "single", STRICT)
    assert (await store.write(o1, first.token, [], "single", STRICT)).replayed
    await asyncio.sleep(0.4)  # both claims expire
    with pytest.raises(LeaseLost) as lost_many:
        await store.write_many(many, "move", STRICT)
    assert lost_many.value.resource == o1
    assert (lost_many.value.key_applied, lost_many.value.applied_by_token) == (True, first.token)
    with pytest.raises(LeaseLost) as lost:
        await store.write(o1, first.token, [Put("j", b"y")], "single", STRICT)
    assert (lost.value.key_applied, lost.value.applied_by_token) == (True, first.token)
    assert await store.read(o1, "j") == Record(b"x", first.token)


async def test_a_job_naming_its_own_resource_writes_strict_only_under_its_lease(
    schema: tuple[str, str], queue: PostgresQueue, store: PostgresStore
) -> None:
    """Its claim is the lease on its resource (lease_server/queue/resources.py): the
    queue's provisional claim alone is no claim to a strict guard; the claim holding the
    lease, with the lease's token, is. After the lease expires, the job row's claim
    (heartbeated later than the lease) does not keep the token live."""
    from lease_server.backends.postgres import PostgresBackend
    from lease_server.leases import Grant

    await queue.enqueue("q", [NewJob(b"x", resource="outbox/7")])
    job = await claim_one(queue, "w", 10_000)
    with pytest.raises(LeaseLost):
        await store.write("outbox/7", job.token, [Put("k", b"provisional")], mode=STRICT)
    leases = PostgresBackend(*schema)
    await leases.open()
    try:
        grant = await leases.acquire("outbox/7", "w", 300, "")
        assert isinstance(grant, Grant)
    finally:
        await leases.close()
    held = await queue.retoken(JobRef(job.id, job.token), grant.token)
    ok = await store.write("outbox/7", held.token, [Put("k", b"held")], mode=STRICT)
    assert ok.fence == grant.token
    await asyncio.sleep(0.4)  # the lease expires; the job row's claim lasts 10 s
    with pytest.raises(LeaseLost):
        await store.write("outbox/7", held.token, [Put("k", b"late")], mode=STRICT)
