"""Queue backends, chosen by URL like the lease backend: ``memory://``, ``sqlite:///path``,
``postgres://``/``postgresql://`` (see :mod:`serving.postgres_db` for the URL's parameters).
See :mod:`lease_server.queue.backends.base` for the Protocol.

The lease server hosts the queue service; unless told otherwise it keeps jobs
next to its leases (:func:`queue_url_for`): ``memory://`` -> in memory, a SQLite
file ``.../leases.db`` -> the sibling file ``.../leases-queue.db``, a PostgreSQL
URL -> the same database and schema. Lease backends without a queue backend
(Redis) host no queue service unless one is named.
"""

from __future__ import annotations

from pathlib import PurePath

from lease_server.clock import Clock
from lease_server.queue.backends.base import QueueBackend
from serving import urls
from serving.sqlite_db import sqlite_path

#: Kinds of storage (:mod:`serving.urls`) :func:`open_queue` has a queue backend of.
KINDS = (urls.MEMORY, urls.SQLITE, urls.POSTGRES)


def queue_url_for(lease_url: str) -> str:
    """The queue backend URL that goes with a lease backend URL (see the module docstring);
    "" when that kind of lease backend has no queue backend beside it."""
    kind = urls.kind(lease_url)
    if kind == urls.SQLITE:
        path = sqlite_path(lease_url)
        if path == ":memory:":
            return "sqlite://"
        p = PurePath(path)
        suffix = p.suffix or ".db"
        return f"sqlite:{p.with_name(p.stem + '-queue' + suffix)}"
    return lease_url if kind in KINDS else ""


def open_queue(url: str, clock: Clock | None = None) -> QueueBackend:
    """Build (not yet open) the queue backend a URL names (schemes: :mod:`serving.urls`).

    ``clock`` drives the embedded backends; PostgreSQL always uses its own clock.
    """
    kind = urls.kind_of(url, what="queue backend", field="queue", kinds=KINDS)
    if kind == urls.MEMORY:
        from lease_server.queue.backends.memory import MemoryQueue

        return MemoryQueue(clock)
    if kind == urls.SQLITE:
        from lease_server.queue.backends.sqlite import SQLiteQueue

        return SQLiteQueue(sqlite_path(url), clock)
    from lease_server.queue.backends.postgres import PostgresQueue

    return PostgresQueue(url)


__all__ = ["QueueBackend", "open_queue", "queue_url_for"]
