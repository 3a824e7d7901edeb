"""MySQL / MariaDB in your own transactions: fence them, and get this SDK's errors.

The guard's MySQL store (``mysql://...?prefix=fencing_``) keeps its fences in
``<prefix>fences`` and creates a procedure beside them, so a transaction of your own,
on any driver, fences itself with the same rule and the same fence rows as the
guard's writes::

    START TRANSACTION;
    CALL fencing_check_and_advance('orders', 42);  -- SQLSTATE FN001 if 42 is stale
    INSERT INTO orders ...;
    COMMIT;

The call locks the resource's fence row until your transaction ends (a guard write or
another transaction on the same resource waits meanwhile, so keep it short), refuses a
token below the fence, and advances the fence to the token. :func:`fencing_error`
turns what it raises into :class:`~fencing.errors.StaleTokenError`, as
:func:`fencing.pg.fencing_error` does for PostgreSQL. It reads only the exception's
``args`` (error number, message), the shape PyMySQL, mysqlclient, asyncmy and aiomysql
share, so this module needs no driver::

    except Exception as exc:
        error = fencing_error(exc, resource="orders")
        if error is None:
            raise
        raise error from exc
"""

from __future__ import annotations

from fencing.errors import FencingError
from fencing.pg import STALE_TOKEN_SQLSTATE, error_from_detail

DEFAULT_PREFIX = "fencing_"
#: The MySQL error number ``check_and_advance`` signals with SQLSTATE ``FN001``.
STALE_TOKEN_ERRNO = 31001


def check_and_advance_sql(prefix: str = DEFAULT_PREFIX) -> str:
    """The statement to run first in your transaction, with ``%s`` for the resource and
    the token (the paramstyle every Python MySQL driver uses)."""
    if not prefix.replace("_", "").isalnum() and prefix:
        raise ValueError(f"table prefix {prefix!r}: letters, digits and _ only")
    return f"CALL {prefix}check_and_advance(%s, %s)"


def fencing_error(exc: BaseException, *, resource: str = "") -> FencingError | None:
    """Our exception for a fencing error raised in MySQL, else None.

    Error 31001 (SQLSTATE ``FN001``: the token is below the fence) becomes
    :class:`~fencing.errors.StaleTokenError` with ``current_token`` = the fence.
    ``resource`` fills the error's resource when the server left it out (a name too long
    for the 128 characters of a MySQL error message).
    """
    args: tuple[object, ...] = tuple(getattr(exc, "args", ()))
    if len(args) < 2 or args[0] != STALE_TOKEN_ERRNO:
        return None
    return error_from_detail(STALE_TOKEN_SQLSTATE, str(args[1]), resource)


__all__ = ["DEFAULT_PREFIX", "STALE_TOKEN_ERRNO", "check_and_advance_sql", "fencing_error"]
