"""PostgreSQL's attempts' history across its migration (0026_job_attempts.sql): jobs of a
schema migrated before it start with none, and a claim made before it still ends as an
attempt. The rest of the rule is the contract suite's (tests/contract/test_queue_history.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import sql

from lease_server.queue.backends.postgres import PostgresQueue
from lease_server.queue.jobs import AttemptOutcome, JobRef, JobState, NewJob
from serving import postgres_db
from tests import pg as testpg

pytestmark = pytest.mark.postgres


@pytest.fixture
async def schema() -> AsyncIterator[tuple[str, str]]:
    async with testpg.fresh_schema() as pair:
        yield pair


async def test_jobs_from_before_0026_have_no_history_and_their_running_claim_ends_as_one(
    schema: tuple[str, str],
) -> None:
    dsn, name = schema
    before = [m for m in postgres_db.migrations() if m.version < 26]
    s = sql.Identifier(name)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await postgres_db._apply_migrations(conn, name, before)
        enqueue = sql.SQL(
            "SELECT * FROM {}.job_enqueue_many(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        ).format(s)
        params = PostgresQueue._enqueue_params("q", [NewJob(b"done"), NewJob(b"running")])
        await conn.execute(enqueue, params)
        claim = sql.SQL("SELECT id, token FROM {}.job_claim('q', 'old', 1, 60000, '')").format(s)
        done = await (await conn.execute(claim)).fetchone()
        running = await (await conn.execute(claim)).fetchone()
        assert done is not None and running is not None
        await conn.execute(
            sql.SQL("SELECT * FROM {}.job_complete(%s, %s, '')").format(s),
            ([done[0]], [done[1]]),
        )
    queue = PostgresQueue(dsn, name)
    await queue.open()  # migrates 0026
    try:
        assert await queue.history(done[0]) == []
        assert await queue.history(running[0]) == []
        stored = await queue.get(done[0])
        assert stored is not None and stored.state is JobState.SUCCEEDED
        await queue.fail(JobRef(running[0], running[1]), "late", lambda attempts: 0)
        (ended,) = await queue.history(running[0])
        assert (ended.attempt, ended.worker, ended.token, ended.outcome, ended.error) == (
            1,
            "old",
            running[1],
            AttemptOutcome.FAILED,
            "late",
        )
        assert 0 < ended.started_at_ms <= ended.ended_at_ms
        (again,) = await queue.claim("q", "new", 1, 60_000)
        assert [a.attempt for a in await queue.history(again.id)] == [1, 2]
    finally:
        await queue.close()
