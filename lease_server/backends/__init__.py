"""Lease backends, chosen by URL: ``memory://``, ``sqlite:///path``,
``postgres://``/``postgresql://`` (see :mod:`serving.postgres_db` for the URL's parameters),
``redis://`` (and ``rediss://``, ``redis+cluster://``). See
:mod:`lease_server.backends.base` for the Protocol."""

from __future__ import annotations

from lease_server.backends.base import LeaseBackend
from lease_server.clock import Clock
from serving import urls
from serving.extras import needs_extra
from serving.sqlite_db import sqlite_path


def open_backend(url: str, clock: Clock | None = None) -> LeaseBackend:
    """Build (not yet open) the backend a URL names (schemes: :mod:`serving.urls`).

    ``clock`` drives the embedded backends; PostgreSQL and Redis use their own clocks.
    """
    kind = urls.kind_of(url, what="lease backend", field="backend")
    if kind == urls.MEMORY:
        from lease_server.backends.memory import MemoryBackend

        return MemoryBackend(clock)
    if kind == urls.SQLITE:
        from lease_server.backends.sqlite import SQLiteBackend

        return SQLiteBackend(sqlite_path(url), clock)
    if kind == urls.POSTGRES:
        with needs_extra("postgres", "the PostgreSQL lease backend"):
            from lease_server.backends.postgres import PostgresBackend

        return PostgresBackend(url)
    # Redis decides expiry by its own clock: ``clock`` does not apply.
    with needs_extra("redis", "the Redis lease backend"):
        from lease_server.backends.redis import RedisBackend

    return RedisBackend(url)


__all__ = ["LeaseBackend", "open_backend", "sqlite_path"]
