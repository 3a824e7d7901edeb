"""PostgreSQL in your own transactions: enqueue jobs, and the fencing SQLSTATEs' typed errors.

The lease server and the guard keep their tables and SQL functions in one PostgreSQL
*schema* (default ``fencing``; :mod:`serving.postgres_db` creates and upgrades it), so
your own transactions can fence themselves with the same rule as the guard::

    BEGIN;
    SELECT fencing.check_and_advance('orders', 42);  -- SQLSTATE FN001 if 42 is stale
    INSERT INTO orders ...;
    COMMIT;

:func:`fencing_error` turns what such SQL raises into this SDK's exceptions. It reads
the error's SQLSTATE and detail only.

:func:`enqueue` (and :func:`enqueue_many`, and their asyncio twins) add jobs in the
transaction of a psycopg connection you already hold, as River's ``InsertTx`` and
procrastinate's ``defer`` do: a rolled-back transaction leaves no job, and claims
waiting on any lease server sharing the database wake when it commits (the queue's
NOTIFY is part of the transaction). The jobs are checked here as the Enqueue RPC checks
them (the same field-named :class:`~fencing.errors.InvalidArgumentError`, nothing
sent), then by the SQL function ``<schema>.enqueue(...)`` behind them, which any
language may call. Enqueued by SQL, a job is authorised by the database's own grants,
not by the lease server's auth policy: grant ``EXECUTE`` on it (and the schema's
``USAGE``) only to roles that may enqueue.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from fencing import limits
from fencing.client._queue import EnqueuedJob, new_job
from fencing.errors import FencingError, InvalidArgumentError, LeaseLost, StaleTokenError
from fencing.v1 import queue_pb2

DEFAULT_SCHEMA = "fencing"
#: SQLSTATE raised by ``check_and_advance``/``check_live_lease``/the guard: stale token.
STALE_TOKEN_SQLSTATE = "FN001"
#: SQLSTATE raised by ``check_live_lease`` and strict writes: the token is not the live
#: lease or job claim (expired, released, taken over, never granted).
LEASE_NOT_LIVE_SQLSTATE = "FN002"
#: SQLSTATE raised by ``lease_acquire_many``: a resource is held (nothing was granted).
LEASE_HELD_SQLSTATE = "FN003"


def fencing_error(exc: BaseException) -> FencingError | None:
    """Our exception for a fencing SQLSTATE raised in SQL, else None.

    A job the SQL ``enqueue`` function refused (``22023`` with a field in its detail)
    becomes :class:`~fencing.errors.InvalidArgumentError` naming that field.

    As the guard answers in every store: ``FN001`` (the token is below the fence)
    becomes :class:`StaleTokenError` with ``current_token`` = the fence; ``FN002``
    (strict, ``check_live_lease``: the token is not the live lease or job claim, but
    nobody newer need own the resource) becomes :class:`LeaseLost`. A refused guard
    write that carried an idempotency key also says whether that key was applied and
    by which token (``key_applied``, ``applied_by_token``). Use it around your own
    transactions::

        except psycopg.Error as exc:
            raise fencing_error(exc) or exc
    """
    sqlstate = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    if sqlstate == INVALID_JOB_SQLSTATE:
        try:
            field = json.loads(getattr(diag, "message_detail", None) or "{}").get("field")
        except (ValueError, AttributeError):
            field = None
        if not isinstance(field, str):
            return None
        message = getattr(diag, "message_primary", None) or str(exc)
        return InvalidArgumentError(message, field=field)
    if sqlstate not in (STALE_TOKEN_SQLSTATE, LEASE_NOT_LIVE_SQLSTATE):
        return None
    return error_from_detail(sqlstate, getattr(diag, "message_detail", None) or "")


def error_from_detail(sqlstate: str, text: str, resource: str = "") -> FencingError:
    """The exception a fencing SQLSTATE and its JSON detail name (shared by
    :mod:`fencing.mysql`, whose errors carry the same detail); ``resource`` when the
    detail names none."""
    try:
        detail = json.loads(text or "{}")
    except ValueError:
        detail = {}
    if not isinstance(detail, dict):
        detail = {}
    resource = str(detail.get("resource", "") or resource)
    token = int(detail.get("token", 0))
    applied = detail.get("key_applied")
    key_applied = None if applied is None else bool(applied)
    applied_by = int(detail.get("applied_by_token", 0) or 0)
    if sqlstate == LEASE_NOT_LIVE_SQLSTATE:
        return LeaseLost(
            f"token {token} is not the live lease or job claim of {resource!r} (strict mode)",
            resource=resource,
            token=token,
            key_applied=key_applied,
            applied_by_token=applied_by,
        )
    return StaleTokenError(
        resource=resource,
        token=token,
        current_token=int(detail.get("current_token", 0)),
        key_applied=key_applied,
        applied_by_token=applied_by,
    )


#: SQLSTATE of a job the SQL ``enqueue`` function refuses (invalid_parameter_value); its
#: DETAIL is ``{"field": "jobs[i].<member>"}``.
INVALID_JOB_SQLSTATE = "22023"

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class _Cursor(Protocol):
    def fetchall(self) -> list[Any]: ...


class _Connection(Protocol):
    def execute(self, query: Any, params: Any = ...) -> Any: ...


def _statement(schema: str) -> str:
    if not _SCHEMA_NAME.fullmatch(schema):
        raise InvalidArgumentError(f"schema {schema!r} is not a plain identifier", field="schema")
    return f'SELECT id, created, state FROM "{schema}".enqueue(%s, %s, %s, %s, %s, %s, %s, %s, %s)'


def _params(queue: str, jobs: Sequence[queue_pb2.NewJob]) -> tuple[Any, ...]:
    """The SQL function's arguments for ``jobs``, each checked as the Enqueue RPC checks it."""
    limits.check_queue(queue)
    limits.check_batch(len(jobs), "jobs")
    now_ms = round(time.time() * 1000)
    checked = [
        limits.check_new_job(
            payload=j.payload,
            idempotency_key=j.idempotency_key,
            max_attempts=j.max_attempts,
            delay_ms=j.delay_ms,
            run_at_ms=j.run_at_ms,
            ordering_key=j.ordering_key,
            priority=j.priority,
            resource=j.resource,
            field=f"jobs[{i}]",
            now_ms=now_ms,
        )
        for i, j in enumerate(jobs)
    ]
    return (
        queue,
        [c["payload"] for c in checked],
        [c["idempotency_key"] for c in checked],
        [c["ordering_key"] for c in checked],
        [c["priority"] for c in checked],
        [c["max_attempts"] for c in checked],
        [c["delay_ms"] for c in checked],
        [
            datetime.fromtimestamp(c["run_at_ms"] / 1000, UTC) if c["run_at_ms"] else None
            for c in checked
        ],
        [c["resource"] for c in checked],
    )


def _enqueued(rows: Sequence[Sequence[Any]]) -> list[EnqueuedJob]:
    return [EnqueuedJob(int(r[0]), bool(r[1]), str(r[2])) for r in rows]


def enqueue_many(
    conn: _Connection, queue: str, jobs: Sequence[queue_pb2.NewJob], *, schema: str = DEFAULT_SCHEMA
) -> list[EnqueuedJob]:
    """Add ``jobs`` (built with :func:`fencing.client.new_job`) to ``queue`` in ``conn``'s
    transaction (a psycopg ``Connection``), in order; see the module doc. A job whose
    idempotency key the queue knows returns that job (``created=False``)."""
    cur = conn.execute(_statement(schema), _params(queue, jobs))
    return _enqueued(cur.fetchall())


def enqueue(
    conn: _Connection,
    queue: str,
    payload: bytes | str,
    *,
    idempotency_key: str = "",
    ordering_key: str = "",
    priority: int = 0,
    max_attempts: int = 0,
    delay: float = 0.0,
    run_at: datetime | float | None = None,
    resource: str = "",
    schema: str = DEFAULT_SCHEMA,
) -> EnqueuedJob:
    """Add one job in ``conn``'s transaction; the arguments are
    :meth:`fencing.QueueClient.enqueue`'s."""
    job = new_job(
        payload,
        idempotency_key=idempotency_key,
        ordering_key=ordering_key,
        priority=priority,
        max_attempts=max_attempts,
        delay=delay,
        run_at=run_at,
        resource=resource,
    )
    return enqueue_many(conn, queue, [job], schema=schema)[0]


async def enqueue_many_async(
    conn: _Connection, queue: str, jobs: Sequence[queue_pb2.NewJob], *, schema: str = DEFAULT_SCHEMA
) -> list[EnqueuedJob]:
    """:func:`enqueue_many` on a psycopg ``AsyncConnection``."""
    cur = await conn.execute(_statement(schema), _params(queue, jobs))
    return _enqueued(await cur.fetchall())


async def enqueue_async(
    conn: _Connection,
    queue: str,
    payload: bytes | str,
    *,
    idempotency_key: str = "",
    ordering_key: str = "",
    priority: int = 0,
    max_attempts: int = 0,
    delay: float = 0.0,
    run_at: datetime | float | None = None,
    resource: str = "",
    schema: str = DEFAULT_SCHEMA,
) -> EnqueuedJob:
    """:func:`enqueue` on a psycopg ``AsyncConnection``."""
    job = new_job(
        payload,
        idempotency_key=idempotency_key,
        ordering_key=ordering_key,
        priority=priority,
        max_attempts=max_attempts,
        delay=delay,
        run_at=run_at,
        resource=resource,
    )
    return (await enqueue_many_async(conn, queue, [job], schema=schema))[0]


__all__ = [
    "DEFAULT_SCHEMA",
    "INVALID_JOB_SQLSTATE",
    "LEASE_HELD_SQLSTATE",
    "LEASE_NOT_LIVE_SQLSTATE",
    "STALE_TOKEN_SQLSTATE",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "error_from_detail",
    "fencing_error",
]
