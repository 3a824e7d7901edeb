"""SDK calls recorded into a chaos history (:mod:`chaos.history`), for :func:`chaos.checker.check`.

Each helper records the invocation just before the call and its outcome after:
``ok``; ``fail`` when the server refused the request as a whole (``LEASE_HELD``,
``STALE_TOKEN``, ``LEASE_LOST``); ``info`` when the outcome is unknown
(``BACKEND_UNAVAILABLE``, a deadline). The exception is re-raised after
recording, so the caller still decides what to do next.
"""

from __future__ import annotations

from chaos.history import Recorder
from fencing import (
    BackendUnavailableError,
    DeadlineExceededError,
    FencingError,
    GuardClient,
    Lease,
    LeaseClient,
    Put,
)


def _outcome(exc: FencingError) -> str:
    return "info" if isinstance(exc, BackendUnavailableError | DeadlineExceededError) else "fail"


def acquire(rec: Recorder, client: LeaseClient, resource: str, ttl: float, timeout: float) -> Lease:
    op = rec.invoke("acquire", resource, ttl_ms=round(ttl * 1000))
    try:
        lease = client.acquire(resource, ttl=ttl, timeout=timeout)
    except FencingError as exc:
        rec.complete(op, _outcome(exc), error=exc.reason)
        raise
    rec.complete(op, "ok", token=lease.token)
    return lease


def write(rec: Recorder, guard: GuardClient, lease: Lease, key: str, value: str) -> int:
    """A one-put write whose idempotency key is its key (unique per write)."""
    op = rec.invoke(
        "write", lease.resource, token=lease.token, key=key, value=value, idempotency_key=key
    )
    try:
        result = guard.write(lease, Put(key, value.encode()), idempotency_key=key)
    except FencingError as exc:
        rec.complete(op, _outcome(exc), error=exc.reason)
        raise
    rec.complete(op, "ok")
    return result.fence


def release(rec: Recorder, lease: Lease) -> None:
    op = rec.invoke("release", lease.resource, token=lease.token)
    try:
        lease.release()
    except FencingError as exc:
        rec.complete(op, _outcome(exc), error=exc.reason)
        raise
    rec.complete(op, "ok")


def final_read(rec: Recorder, guard: GuardClient, resource: str, key: str) -> None:
    """The read the checker judges acknowledged writes by (``final=1``)."""
    op = rec.invoke("read", resource, key=key, final=1)
    record = guard.read(resource, key)
    rec.complete(op, "ok", value=record.value.decode() if record else None)
