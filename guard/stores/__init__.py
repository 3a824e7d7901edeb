"""Fenced stores, chosen by URL: ``memory://``, ``sqlite:///path``,
``postgres://``/``postgresql://`` (see :mod:`serving.postgres_db` for the URL's parameters),
``redis://`` (and ``rediss://``, ``redis+cluster://``). See :mod:`guard.stores.base`
for the Protocol."""

from __future__ import annotations

from urllib.parse import urlsplit

from fencing.errors import InvalidArgumentError
from guard.stores.base import GuardStore, StoreWriteResult
from serving.sqlite_db import sqlite_path


def open_store(url: str) -> GuardStore:
    """Build (not yet open) the store a URL names."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        from guard.stores.memory import MemoryStore

        return MemoryStore()
    if scheme == "sqlite":
        from guard.stores.sqlite import SQLiteStore

        return SQLiteStore(sqlite_path(url))
    if scheme in ("postgres", "postgresql"):
        from guard.stores.postgres import PostgresStore

        return PostgresStore(url)
    if scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        from guard.stores.redis import RedisStore

        return RedisStore(url)
    raise InvalidArgumentError(
        f"unsupported guard store {scheme + '://' if scheme else url!r}: use memory://, "
        "sqlite:///path, postgresql://... or redis://...",
        field="store",
    )


__all__ = ["GuardStore", "StoreWriteResult", "open_store"]
