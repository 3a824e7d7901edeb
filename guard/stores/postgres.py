"""PostgreSQL fenced store (``postgres://``): fences and data in the lease backend's schema.

Tables ``fences``, ``data`` and ``idempotency`` (:mod:`serving.migrations`,
``0002_guard.sql``, ``0008_guard_fence_rules.sql``). A write is one statement, and so
one transaction and one round trip, calling ``guard_write``: lock the resource's
fence row (``SELECT ... FOR UPDATE``, the row inserted first if missing, race-free),
judge the token as :func:`guard.fence.judge` does (the same rule, in SQL: the
token against the fence, then in strict mode against the live lease, and only then
a recorded idempotency key, which is a replay), apply every op in order, advance the
fence, record the key with its token, commit. A rejection raises inside the
transaction, so nothing of it lands (G3, G6).

Strict mode (G5): the lease backend keeps its ``leases`` table, and the queue its
``jobs`` table, in the same schema, so a strict write also share-locks the
resource's lease row (or the running job row whose claim carries the token, for a
job's resource) and requires the token to be the current unexpired lease or claim
by the database's clock; the row lock holds every acquire (or rescue) of the
resource back until the write commits, so no other holder can be granted in
between. A token below the fence is refused with :class:`StaleTokenError` (SQLSTATE
``FN001``); a token that is not the live lease or claim (expired, released, taken
over, never granted, or no lease server on this schema at all: strict mode fails
closed) with :class:`~fencing.errors.LeaseLost` (``FN002``).

Multi-resource writes (``guard_write_many``) and batches of independent writes
(``guard_write_batch``, the guard's group commit) are one statement each too, in
``0006_guard_batches.sql``; both lock fence rows in sorted order (no deadlocks
between overlapping sets) and a batch applies its accepted ops set-based.

Idempotency keys are kept with the database's time of recording; the guard
prunes them after its retention (default 24 h) in batches, oldest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import psycopg

from fencing.errors import InvalidArgumentError, StaleTokenError
from fencing.types import Op, Put, Record
from guard.fence import FenceMode
from guard.stores.base import (
    BatchedWrite,
    ResourceWrite,
    StoreManyResult,
    StoreWriteResult,
    Verdict,
)
from serving.postgres_db import PgConfig, PostgresDatabase

#: Idempotency keys deleted per statement when pruning.
PRUNE_BATCH = 5000


def _flat_ops(
    writes: Sequence[ResourceWrite | BatchedWrite],
) -> tuple[list[int], list[str], list[bytes | None]]:
    """Every write's ops as parallel arrays: the write's 1-based index, key, value (None:
    a delete), in order, as the SQL functions take them."""
    op_index: list[int] = []
    keys: list[str] = []
    values: list[bytes | None] = []
    for i, w in enumerate(writes, start=1):
        for op in w.ops:
            op_index.append(i)
            keys.append(op.key)
            values.append(op.value if isinstance(op, Put) else None)
    return op_index, keys, values


class PostgresStore:
    """Fences and data in one schema of a PostgreSQL database, shared by any number of guards.

    ``PostgresStore("postgresql://user@host/db?schema=fencing")``; an explicit
    ``schema`` argument wins over the URL's. :meth:`open` migrates the schema.
    """

    name = "postgres"
    #: The schema always holds the lease backend's ``leases`` table.
    supports_strict = True

    def __init__(self, url: str, schema: str | None = None) -> None:
        self._db = PostgresDatabase(PgConfig.from_url(url, schema), "fencing-guard")
        # Half the pool: batches grow while earlier ones commit, and Read/Fence calls
        # still find a free connection.
        self.commit_concurrency = max(1, self._db.config.pool_max // 2)
        q = self._db.qualified
        self._write_sql = q("SELECT * FROM {schema}.guard_write(%s, %s, %s, %s, %s, %s)")
        self._write_many_sql = q(
            "SELECT * FROM {schema}.guard_write_many(%s::text[], %s::bigint[], %s::integer[],"
            " %s::text[], %s::bytea[], %s, %s)"
        )
        self._write_batch_sql = q(
            "SELECT * FROM {schema}.guard_write_batch(%s::text[], %s::bigint[], %s::text[],"
            " %s::integer[], %s::text[], %s::bytea[], %s)"
        )
        self._read_sql = q(
            "SELECT value, token FROM {schema}.data WHERE resource = %s AND key = %s"
        )
        # COLLATE "C": code point order, the same on every store and database locale.
        self._list_sql = q(
            "SELECT key, value, token FROM {schema}.data WHERE resource = %s "
            'AND key COLLATE "C" > %s AND key COLLATE "C" >= %s AND starts_with(key, %s) '
            'ORDER BY key COLLATE "C" LIMIT %s'
        )
        self._fence_sql = q("SELECT {schema}.guard_fence(%s, %s, %s)")
        self._reset_sql = q("SELECT {schema}.guard_reset_fence(%s, %s)")
        self._describe_sql = q("SELECT fence FROM {schema}.fences WHERE resource = %s")
        self._prune_sql = q(
            "DELETE FROM {schema}.idempotency AS i USING ("
            " SELECT resource, key FROM {schema}.idempotency WHERE recorded_at < %s"
            " ORDER BY recorded_at LIMIT %s FOR UPDATE SKIP LOCKED) AS old"
            " WHERE i.resource = old.resource AND i.key = old.key"
        )

    @property
    def schema(self) -> str:
        return self._db.config.schema

    async def open(self) -> None:
        await self._db.open()

    async def close(self) -> None:
        await self._db.close()

    async def healthy(self) -> bool:
        """PostgreSQL answers ``SELECT 1`` (see ``serving.storage.HealthProbe``)."""
        return await self._db.healthy()

    async def write(
        self,
        resource: str,
        token: int,
        ops: Sequence[Op],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> StoreWriteResult:
        keys = [op.key for op in ops]
        values = [op.value if isinstance(op, Put) else None for op in ops]
        row = await self._db.fetchone(
            self._write_sql, (resource, token, keys, values, idempotency_key, mode.value)
        )
        assert row is not None  # guard_write always returns one row
        return StoreWriteResult(int(row[0]), int(row[2]))

    async def write_many(
        self,
        writes: Sequence[ResourceWrite],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> StoreManyResult:
        op_index, keys, values = _flat_ops(writes)
        row = await self._db.fetchone(
            self._write_many_sql,
            (
                [w.resource for w in writes],
                [w.token for w in writes],
                op_index,
                keys,
                values,
                idempotency_key,
                mode.value,
            ),
        )
        assert row is not None  # guard_write_many always returns one row
        return StoreManyResult(
            tuple(int(f) for f in row[0]), bool(row[1]), tuple(int(t) for t in row[2])
        )

    async def write_batch(
        self, writes: Sequence[BatchedWrite], mode: FenceMode = FenceMode.MONOTONIC
    ) -> list[Verdict]:
        if mode is FenceMode.STRICT:
            raise InvalidArgumentError("strict writes are not batched", field="mode")
        if not writes:
            return []
        op_index, keys, values = _flat_ops(writes)
        row = await self._db.fetchone(
            self._write_batch_sql,
            (
                [w.resource for w in writes],
                [w.token for w in writes],
                [w.idempotency_key for w in writes],
                op_index,
                keys,
                values,
                mode.value,
            ),
        )
        assert row is not None  # guard_write_batch always returns one row
        verdicts: list[Verdict] = []
        for w, outcome, fence, by in zip(writes, row[0], row[1], row[2], strict=True):
            if outcome == "stale":
                verdicts.append(
                    StaleTokenError(
                        resource=w.resource,
                        token=w.token,
                        current_token=int(fence),
                        key_applied=(by is not None) if w.idempotency_key else None,
                        applied_by_token=int(by or 0),
                    )
                )
            elif outcome == "replayed":
                verdicts.append(StoreWriteResult(int(fence), int(by)))
            else:
                verdicts.append(StoreWriteResult(int(fence)))
        return verdicts

    async def read(self, resource: str, key: str) -> Record | None:
        row = await self._db.fetchone(self._read_sql, (resource, key))
        return Record(bytes(row[0]), int(row[1])) if row else None

    async def list_records(
        self, resource: str, prefix: str, after: str, limit: int
    ) -> list[tuple[str, Record]]:
        rows = await self._db.fetchall(self._list_sql, (resource, after, prefix, prefix, limit))
        return [(str(k), Record(bytes(v), int(t))) for k, v, t in rows]

    async def fence(self, resource: str, token: int, mode: FenceMode = FenceMode.MONOTONIC) -> int:
        row = await self._db.fetchone(self._fence_sql, (resource, token, mode.value))
        assert row is not None
        return int(row[0])

    async def reset_fence(self, resource: str, to_token: int) -> int:
        """Never below a token this schema's lease table or queue granted for the
        resource (``INVALID_ARGUMENT`` naming ``to_token`` otherwise)."""
        try:
            row = await self._db.fetchone(self._reset_sql, (resource, to_token))
        except psycopg.errors.InvalidParameterValue as exc:
            raise InvalidArgumentError(str(exc.diag.message_primary), field="to_token") from exc
        assert row is not None
        return int(row[0])

    async def describe_fence(self, resource: str) -> int:
        row = await self._db.fetchone(self._describe_sql, (resource,))
        return int(row[0]) if row else 0

    async def prune_idempotency(self, older_than_ms: int) -> int:
        """Forget keys recorded (database clock) before ``older_than_ms`` (ms since the epoch)."""
        cutoff = datetime.fromtimestamp(older_than_ms / 1000, UTC)
        total = 0
        # Bounded: each round deletes up to PRUNE_BATCH keys, each in its own transaction.
        for _ in range(1000):
            deleted = await self._db.execute(self._prune_sql, (cutoff, PRUNE_BATCH))
            total += deleted
            if deleted < PRUNE_BATCH:
                break
        return total
