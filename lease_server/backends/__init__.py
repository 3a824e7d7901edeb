"""Lease backends, chosen by URL: ``memory://``, ``sqlite:///path``,
``postgres://``/``postgresql://`` (see :mod:`serving.postgres_db` for the URL's parameters),
``redis://`` (and ``rediss://``, ``redis+cluster://``). See
:mod:`lease_server.backends.base` for the Protocol."""

from __future__ import annotations

from urllib.parse import urlsplit

from fencing.errors import InvalidArgumentError
from lease_server.backends.base import LeaseBackend
from lease_server.clock import Clock
from serving.sqlite_db import sqlite_path


def open_backend(url: str, clock: Clock | None = None) -> LeaseBackend:
    """Build (not yet open) the backend a URL names.

    ``clock`` drives the embedded backends; PostgreSQL and Redis use their own clocks.
    """
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        from lease_server.backends.memory import MemoryBackend

        return MemoryBackend(clock)
    if scheme == "sqlite":
        from lease_server.backends.sqlite import SQLiteBackend

        return SQLiteBackend(sqlite_path(url), clock)
    if scheme in ("postgres", "postgresql"):
        from lease_server.backends.postgres import PostgresBackend

        return PostgresBackend(url)
    if scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        # Redis decides expiry by its own clock: ``clock`` does not apply.
        from lease_server.backends.redis import RedisBackend

        return RedisBackend(url)
    raise InvalidArgumentError(
        f"unsupported lease backend {scheme + '://' if scheme else url!r}: use memory://, "
        "sqlite:///path, postgresql://... or redis://...",
        field="backend",
    )


__all__ = ["LeaseBackend", "open_backend", "sqlite_path"]
