"""Fenced stores, chosen by URL: ``memory://``, ``sqlite:///path``,
``postgres://``/``postgresql://`` (see :mod:`serving.postgres_db` for the URL's parameters),
``redis://`` (and ``rediss://``, ``redis+cluster://``). See :mod:`guard.stores.base`
for the Protocol."""

from __future__ import annotations

from guard.stores.base import GuardStore, StoreWriteResult
from serving import urls
from serving.extras import needs_extra
from serving.sqlite_db import sqlite_path


def open_store(url: str) -> GuardStore:
    """Build (not yet open) the store a URL names (schemes: :mod:`serving.urls`)."""
    kind = urls.kind_of(url, what="guard store", field="store")
    if kind == urls.MEMORY:
        from guard.stores.memory import MemoryStore

        return MemoryStore()
    if kind == urls.SQLITE:
        from guard.stores.sqlite import SQLiteStore

        return SQLiteStore(sqlite_path(url))
    if kind == urls.POSTGRES:
        with needs_extra("postgres", "the PostgreSQL guard store"):
            from guard.stores.postgres import PostgresStore

        return PostgresStore(url)
    with needs_extra("redis", "the Redis guard store"):
        from guard.stores.redis import RedisStore

    return RedisStore(url)


__all__ = ["GuardStore", "StoreWriteResult", "open_store"]
