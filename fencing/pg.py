"""PostgreSQL in your own transactions: the fencing SQLSTATEs and their typed errors.

The lease server and the guard keep their tables and SQL functions in one PostgreSQL
*schema* (default ``fencing``; :mod:`serving.postgres_db` creates and upgrades it), so
your own transactions can fence themselves with the same rule as the guard::

    BEGIN;
    SELECT fencing.check_and_advance('orders', 42);  -- SQLSTATE FN001 if 42 is stale
    INSERT INTO orders ...;
    COMMIT;

:func:`fencing_error` turns what such SQL raises into this SDK's exceptions. It reads
the error's SQLSTATE and detail only, so this module needs no database driver.
"""

from __future__ import annotations

import json

from fencing.errors import FencingError, LeaseLost, StaleTokenError

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
    if sqlstate not in (STALE_TOKEN_SQLSTATE, LEASE_NOT_LIVE_SQLSTATE):
        return None
    diag = getattr(exc, "diag", None)
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


__all__ = [
    "DEFAULT_SCHEMA",
    "LEASE_HELD_SQLSTATE",
    "LEASE_NOT_LIVE_SQLSTATE",
    "STALE_TOKEN_SQLSTATE",
    "error_from_detail",
    "fencing_error",
]
