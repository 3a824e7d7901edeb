"""MySQL / MariaDB fenced store (``mysql://``, ``mariadb://``), on asyncmy.

Built only on the public seam (:mod:`guard.stores.base`, :mod:`guard.fence`,
:mod:`fencing.types`, :mod:`fencing.errors`), as a store in its own package would be;
it is registered like any other scheme.

URL: ``mysql://user:password@host:3306/database?prefix=fencing_&pool_max=8&timeout=5``.
``prefix`` (letters, digits, ``_``; default ``fencing_``) names the three InnoDB tables
``<prefix>fences``, ``<prefix>data`` and ``<prefix>idempotency``, created on open.
Resources and keys are stored as their UTF-8 bytes (``VARBINARY``: byte order, no
collation folding, trailing spaces significant), values as ``LONGBLOB``.

**One transaction per write** (READ COMMITTED): the resource's fence row is inserted if
missing and locked (``SELECT ... FOR UPDATE``), the token judged by
:func:`guard.fence.judge` with the idempotency key read under that lock, every op
applied in order, the fence advanced and the key recorded, then ``COMMIT``; a refusal
rolls back, so nothing of it lands (G3, G6). ``write_many`` and ``write_batch`` (the
guard's group commit) lock every fence row they touch first, in sorted order, so
overlapping transactions never deadlock on each other; should InnoDB still pick a
deadlock victim (new rows' gap locks), the whole transaction, rolled back by InnoDB, is
run again.

**Your own transactions** fence themselves with the same fence rows: ``CALL
<prefix>check_and_advance(resource, token)`` (:data:`CHECK_AND_ADVANCE`, created on
open; :mod:`fencing.mysql` maps its error).

**Durability**: a commit is durable only with ``innodb_flush_log_at_trx_commit = 1``
(the default); any other value is reported in ``durability_warning`` after
:meth:`MySQLStore.open` (logged by the guard, refused by ``--require-durable``), as an
unpersisted Redis is.

**Driver**: asyncmy, chosen by evidence: aiomysql 0.3.2 (its latest) fails on every
``bytes`` parameter with PyMySQL 2.x, the PyMySQL its own requirement installs today
(``TypeError`` in ``escape_bytes_prefixed``), and our keys and values are bytes;
asyncmy is maintained (a release in 2026), has no PyMySQL dependency to drift, and its
Cython protocol code is the faster of the two.

**Modes**: monotonic, promise (``Fence``) and watch. Strict is not offered: it needs the
lease backend in the same database, and no lease backend runs on MySQL.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import asyncmy
from asyncmy import errors as mysql_errors

from fencing.errors import (
    BackendUnavailableError,
    InvalidArgumentError,
    LeaseLost,
    StaleTokenError,
)
from fencing.types import Op, Put, Record
from guard import fence as fence_rule
from guard.fence import FenceMode, Recorded
from guard.stores.base import (
    STORE_API_VERSION,
    BatchedWrite,
    ResourceWrite,
    StoreManyResult,
    StoreWriteResult,
    Verdict,
)

#: Idempotency keys deleted per statement when pruning.
PRUNE_BATCH = 5000
#: Times a transaction InnoDB chose as a deadlock victim is run again.
DEADLOCK_RETRIES = 5
#: MySQL error codes: deadlock victim, lock wait timeout (both roll the transaction back).
_RETRYABLE = {1213, 1205}

#: The schema: ``{p}`` is the table prefix. InnoDB, so a transaction covers all three.
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS {p}fences (
        resource VARBINARY(256) NOT NULL PRIMARY KEY,
        fence    BIGINT NOT NULL CHECK (fence >= 0)
    ) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS {p}data (
        resource VARBINARY(256)  NOT NULL,
        k        VARBINARY(1024) NOT NULL,
        value    LONGBLOB NOT NULL,
        token    BIGINT NOT NULL,
        PRIMARY KEY (resource, k)
    ) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS {p}idempotency (
        resource    VARBINARY(256) NOT NULL,
        ikey        VARBINARY(256) NOT NULL,
        fence       BIGINT NOT NULL,
        token       BIGINT NOT NULL,
        recorded_ms BIGINT NOT NULL,
        PRIMARY KEY (resource, ikey),
        KEY by_time (recorded_ms)
    ) ENGINE=InnoDB""",
)


#: The procedure your own transactions call to fence themselves (:mod:`fencing.mysql`):
#: lock the resource's fence row (made if missing), refuse a token below the fence
#: with SQLSTATE ``FN001`` (errno 31001, message: the JSON detail, without the resource
#: when it would pass the 128 characters a SIGNAL message may have), else advance it.
CHECK_AND_ADVANCE = (
    "DROP PROCEDURE IF EXISTS {p}check_and_advance",
    """CREATE PROCEDURE {p}check_and_advance(IN p_resource VARBINARY(256), IN p_token BIGINT)
    BEGIN
        DECLARE v_fence BIGINT;
        DECLARE v_detail TEXT;
        INSERT INTO {p}fences (resource, fence) VALUES (p_resource, 0)
            ON DUPLICATE KEY UPDATE fence = fence;
        SELECT fence INTO v_fence FROM {p}fences WHERE resource = p_resource FOR UPDATE;
        IF p_token < v_fence THEN
            SET v_detail = JSON_OBJECT('resource', CONVERT(p_resource USING utf8mb4),
                'token', p_token, 'current_token', v_fence);
            IF CHAR_LENGTH(v_detail) > 128 THEN
                SET v_detail = JSON_OBJECT('token', p_token, 'current_token', v_fence);
            END IF;
            SIGNAL SQLSTATE 'FN001' SET MESSAGE_TEXT = v_detail, MYSQL_ERRNO = 31001;
        END IF;
        UPDATE {p}fences SET fence = p_token WHERE resource = p_resource AND fence < p_token;
    END""",
)


class MySQLConfig:
    """What a ``mysql://`` URL says (module doc); bad parameters name their field."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("mysql", "mariadb"):
            raise InvalidArgumentError(f"not a mysql:// URL: {url!r}", field="store")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 3306
        self.user = unquote(parts.username or "root")
        self.password = unquote(parts.password or "")
        self.database = parts.path.lstrip("/")
        if not self.database:
            raise InvalidArgumentError("the mysql:// URL names no database", field="store")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"prefix", "pool_max", "timeout"}
        if unknown:
            raise InvalidArgumentError(
                f"unknown mysql:// URL parameter {sorted(unknown)[0]!r} "
                "(prefix, pool_max, timeout)",
                field=sorted(unknown)[0],
            )
        self.prefix = query.get("prefix", "fencing_")
        if not re.fullmatch(r"[A-Za-z0-9_]{0,40}", self.prefix):
            raise InvalidArgumentError(
                f"table prefix {self.prefix!r}: letters, digits and _ only, at most 40",
                field="prefix",
            )
        self.pool_max = _positive_int(query.get("pool_max", "8"), "pool_max")
        self.timeout = _positive_int(query.get("timeout", "5"), "timeout")


def flush_warning(innodb_flush_log_at_trx_commit: int) -> str | None:
    """What a server with this setting may lose (None: a commit is on disk when acked)."""
    if innodb_flush_log_at_trx_commit == 1:
        return None
    return (
        f"innodb_flush_log_at_trx_commit = {innodb_flush_log_at_trx_commit}: commits "
        "acknowledged in the last second before a crash may be lost (set it to 1)"
    )


def _positive_int(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise InvalidArgumentError(f"{name} must be a positive integer, not {text!r}", field=name)
    return value


def _b(text: str) -> bytes:
    return text.encode()


class _Txn:
    """One transaction's statements (the connection's cursor), named for what they do."""

    def __init__(self, cur: Any, p: str) -> None:
        self.cur = cur
        self.p = p

    async def lock_fences(self, resources: Sequence[str]) -> dict[str, int]:
        """Insert missing fence rows, then lock every row, in sorted (byte) order."""
        names = sorted({_b(r) for r in resources})
        if not names:
            return {}
        await self.cur.executemany(
            f"INSERT INTO {self.p}fences (resource, fence) VALUES (%s, 0)"
            " ON DUPLICATE KEY UPDATE fence = fence",
            [(n,) for n in names],
        )
        marks = ", ".join(["%s"] * len(names))
        await self.cur.execute(
            f"SELECT resource, fence FROM {self.p}fences WHERE resource IN ({marks})"
            " ORDER BY resource FOR UPDATE",
            names,
        )
        return {bytes(r).decode(): int(f) for r, f in await self.cur.fetchall()}

    async def recorded(self, resource: str, key: str) -> Recorded | None:
        if not key:
            return None
        await self.cur.execute(
            f"SELECT fence, token FROM {self.p}idempotency WHERE resource = %s AND ikey = %s",
            (_b(resource), _b(key)),
        )
        row = await self.cur.fetchone()
        return Recorded(int(row[0]), int(row[1])) if row else None

    async def apply(self, resource: str, token: int, ops: Sequence[Op], new_fence: int) -> None:
        r = _b(resource)
        for op in ops:  # in order: a later op on the same key wins
            if isinstance(op, Put):
                await self.cur.execute(
                    f"INSERT INTO {self.p}data (resource, k, value, token) VALUES (%s, %s, %s, %s)"
                    " ON DUPLICATE KEY UPDATE value = VALUES(value), token = VALUES(token)",
                    (r, _b(op.key), op.value, token),
                )
            else:
                await self.cur.execute(
                    f"DELETE FROM {self.p}data WHERE resource = %s AND k = %s", (r, _b(op.key))
                )
        await self.set_fence(resource, new_fence)

    async def set_fence(self, resource: str, fence: int) -> None:
        await self.cur.execute(
            f"UPDATE {self.p}fences SET fence = %s WHERE resource = %s", (fence, _b(resource))
        )

    async def record(self, resource: str, key: str, fence: int, token: int) -> None:
        await self.cur.execute(
            f"INSERT INTO {self.p}idempotency (resource, ikey, fence, token, recorded_ms)"
            " VALUES (%s, %s, %s, %s, FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000))",
            (_b(resource), _b(key), fence, token),
        )


class MySQLStore:
    """Fences and data in three InnoDB tables of a MySQL or MariaDB database.

    ``MySQLStore("mysql://root@127.0.0.1:3306/test?prefix=fencing_")``; any number of
    guards may share the tables. After :meth:`open`, ``durability_warning`` says whether
    a commit survives a crash of the server (module doc).
    """

    name = "mysql"
    api_version = STORE_API_VERSION
    #: Strict mode needs the lease backend in the store's database: none runs on MySQL.
    supports_strict = False

    def __init__(self, url: str) -> None:
        self.config = MySQLConfig(url)
        # Half the pool: batches grow while earlier ones commit, reads still find one.
        self.commit_concurrency = max(1, self.config.pool_max // 2)
        self.durability_warning: str | None = None
        self._pool: Any = None
        self._p = self.config.prefix

    async def open(self) -> None:
        if self._pool is not None:
            return
        c = self.config
        try:
            self._pool = await asyncmy.create_pool(
                host=c.host,
                port=c.port,
                user=c.user,
                password=c.password,
                db=c.database,
                minsize=1,
                maxsize=c.pool_max,
                connect_timeout=c.timeout,
                autocommit=False,
                init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            )
            async with self._pool.acquire() as conn, conn.cursor() as cur:
                for statement in SCHEMA:
                    await cur.execute(statement.format(p=self._p))
                await self._create_procedure(cur)
                await cur.execute("SELECT @@innodb_flush_log_at_trx_commit")
                row = await cur.fetchone()
                await conn.commit()
        except (mysql_errors.MySQLError, OSError) as exc:
            await self.close()
            raise BackendUnavailableError(
                f"MySQL at {c.host}:{c.port}/{c.database}: {exc}"
            ) from exc
        self.durability_warning = flush_warning(int(row[0]) if row else 1)

    async def _create_procedure(self, cur: Any) -> None:
        """(Re)create :data:`CHECK_AND_ADVANCE`; a guard starting beside another that
        just did the same may see it already exist, which is as good."""
        await cur.execute(
            "SELECT COUNT(*) FROM information_schema.routines WHERE routine_schema ="
            " DATABASE() AND routine_name = %s",
            (f"{self._p}check_and_advance",),
        )
        row = await cur.fetchone()
        if row and int(row[0]):
            return
        try:
            await cur.execute(CHECK_AND_ADVANCE[1].format(p=self._p))
        except mysql_errors.OperationalError as exc:
            if not (exc.args and exc.args[0] == 1304):  # ER_SP_ALREADY_EXISTS
                raise

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
            await pool.wait_closed()

    async def healthy(self) -> bool:
        """MySQL answers ``SELECT 1`` (see ``serving.storage.HealthProbe``)."""
        try:
            async with self._connection() as conn, conn.cursor() as cur:
                await cur.execute("SELECT 1")
                return (await cur.fetchone()) is not None
        except BackendUnavailableError:
            return False

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        if self._pool is None:
            raise BackendUnavailableError("the MySQL store is not open")
        try:
            async with self._pool.acquire() as conn:
                yield conn
        except (mysql_errors.OperationalError, mysql_errors.InterfaceError, OSError) as exc:
            raise BackendUnavailableError(f"MySQL: {exc}") from exc

    async def _transaction(self, body: Any) -> Any:
        """Run ``body(txn)`` in one transaction: commit on return, roll back on a raise;
        run again (a few times) when InnoDB chose it as a deadlock victim."""
        for attempt in range(DEADLOCK_RETRIES + 1):
            async with self._connection() as conn:
                await conn.begin()
                try:
                    async with conn.cursor() as cur:
                        result = await body(_Txn(cur, self._p))
                    await conn.commit()
                    return result
                except mysql_errors.OperationalError as exc:
                    await conn.rollback()
                    if exc.args and exc.args[0] in _RETRYABLE and attempt < DEADLOCK_RETRIES:
                        continue
                    raise
                except (StaleTokenError, LeaseLost, InvalidArgumentError):
                    await conn.rollback()
                    raise
                except BaseException:
                    # Cancelled or failed mid-transaction: the connection never goes
                    # back to the pool with a transaction open (closing it rolls back).
                    conn.close()
                    raise
        raise AssertionError("unreachable")

    async def write(
        self,
        resource: str,
        token: int,
        ops: Sequence[Op],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> StoreWriteResult:
        async def body(t: _Txn) -> StoreWriteResult:
            fence = (await t.lock_fences([resource]))[resource]
            judged = fence_rule.judge(
                resource,
                token,
                fence,
                mode,
                has_key=bool(idempotency_key),
                recorded=await t.recorded(resource, idempotency_key),
                live=False,  # strict mode: no lease backend here, fail closed
            )
            if judged.replayed:
                return StoreWriteResult(judged.fence, judged.replayed_by_token)
            await t.apply(resource, token, ops, judged.fence)
            if idempotency_key:
                await t.record(resource, idempotency_key, judged.fence, token)
            return StoreWriteResult(judged.fence)

        result: StoreWriteResult = await self._transaction(body)
        return result

    async def write_many(
        self,
        writes: Sequence[ResourceWrite],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> StoreManyResult:
        async def body(t: _Txn) -> StoreManyResult:
            fences = await t.lock_fences([w.resource for w in writes])
            claims = [(w.resource, w.token, fences[w.resource]) for w in writes]
            replay = fence_rule.judge_all(
                claims,
                mode,
                has_key=bool(idempotency_key),
                recorded=[await t.recorded(w.resource, idempotency_key) for w in writes],
                live=[False] * len(writes),  # strict mode: fail closed
            )
            if replay is not None:
                return StoreManyResult(tuple(replay[0]), True, tuple(replay[1]))
            new = fence_rule.admit_all(claims, mode)
            for w, new_fence in zip(writes, new, strict=True):
                await t.apply(w.resource, w.token, w.ops, new_fence)
                if idempotency_key:
                    await t.record(w.resource, idempotency_key, new_fence, w.token)
            return StoreManyResult(tuple(new))

        result: StoreManyResult = await self._transaction(body)
        return result

    async def write_batch(
        self, writes: Sequence[BatchedWrite], mode: FenceMode = FenceMode.MONOTONIC
    ) -> list[Verdict]:
        if mode is FenceMode.STRICT:
            raise InvalidArgumentError("strict writes are not batched", field="mode")
        if not writes:
            return []

        async def body(t: _Txn) -> list[Verdict]:
            fences = await t.lock_fences([w.resource for w in writes])
            verdicts: list[Verdict] = []
            for w in writes:  # in order: a later write sees what earlier ones left
                try:
                    judged = fence_rule.judge(
                        w.resource,
                        w.token,
                        fences[w.resource],
                        mode,
                        has_key=bool(w.idempotency_key),
                        recorded=await t.recorded(w.resource, w.idempotency_key),
                    )
                except StaleTokenError as exc:
                    verdicts.append(exc)
                    continue
                if judged.replayed:
                    verdicts.append(StoreWriteResult(judged.fence, judged.replayed_by_token))
                    continue
                await t.apply(w.resource, w.token, w.ops, judged.fence)
                fences[w.resource] = judged.fence
                if w.idempotency_key:
                    await t.record(w.resource, w.idempotency_key, judged.fence, w.token)
                verdicts.append(StoreWriteResult(judged.fence))
            return verdicts

        result: list[Verdict] = await self._transaction(body)
        return result

    async def read(self, resource: str, key: str) -> Record | None:
        async with self._connection() as conn, conn.cursor() as cur:
            await cur.execute(
                f"SELECT value, token FROM {self._p}data WHERE resource = %s AND k = %s",
                (_b(resource), _b(key)),
            )
            row = await cur.fetchone()
            await conn.commit()
        return Record(bytes(row[0]), int(row[1])) if row else None

    async def list_records(
        self, resource: str, prefix: str, after: str, limit: int
    ) -> list[tuple[str, Record]]:
        # Keys are VARBINARY (UTF-8): byte order is code point order; the range on k
        # lets the primary key's index do the work.
        p = _b(prefix)
        async with self._connection() as conn, conn.cursor() as cur:
            await cur.execute(
                f"SELECT k, value, token FROM {self._p}data WHERE resource = %s AND k > %s "
                "AND k >= %s AND LEFT(k, %s) = %s ORDER BY k LIMIT %s",
                (_b(resource), _b(after), p, len(p), p, limit),
            )
            rows = await cur.fetchall()
            await conn.commit()
        return [(bytes(k).decode(), Record(bytes(v), int(t))) for k, v, t in rows]

    async def fence(self, resource: str, token: int, mode: FenceMode = FenceMode.MONOTONIC) -> int:
        async def body(t: _Txn) -> int:
            current = (await t.lock_fences([resource]))[resource]
            new = fence_rule.advance(resource, token, current)
            fence_rule.may_fence(resource, token, mode, live=False)
            await t.set_fence(resource, new)
            return new

        result: int = await self._transaction(body)
        return result

    async def reset_fence(self, resource: str, to_token: int) -> int:
        async def body(t: _Txn) -> int:
            before = (await t.lock_fences([resource]))[resource]
            await t.set_fence(resource, fence_rule.reset_to(resource, to_token, before))
            return before

        result: int = await self._transaction(body)
        return result

    async def describe_fence(self, resource: str) -> int:
        async with self._connection() as conn, conn.cursor() as cur:
            await cur.execute(
                f"SELECT fence FROM {self._p}fences WHERE resource = %s", (_b(resource),)
            )
            row = await cur.fetchone()
            await conn.commit()
        return int(row[0]) if row else 0

    async def prune_idempotency(self, older_than_ms: int) -> int:
        """Forget keys recorded (database clock) before ``older_than_ms``, in batches."""
        total = 0
        for _ in range(1000):
            async with self._connection() as conn, conn.cursor() as cur:
                deleted = await cur.execute(
                    f"DELETE FROM {self._p}idempotency WHERE recorded_ms < %s LIMIT %s",
                    (older_than_ms, PRUNE_BATCH),
                )
                await conn.commit()
            total += int(deleted)
            if deleted < PRUNE_BATCH:
                break
        return total
