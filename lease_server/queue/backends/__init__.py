"""Queue backends, chosen by URL like the lease backend: ``memory://``, ``sqlite:///path``,
``postgres://``/``postgresql://`` (see :mod:`serving.postgres_db` for the URL's parameters).
See :mod:`lease_server.queue.backends.base` for the Protocol.

The lease server hosts the queue service; unless told otherwise it keeps jobs
next to its leases (:func:`queue_url_for`): ``memory://`` -> in memory, a SQLite
file ``.../leases.db`` -> the sibling file ``.../leases-queue.db``, a PostgreSQL
URL -> the same database and schema. Lease backends without a queue backend
(Redis) host no queue service unless one is named. ``fencing serve`` keeps its
``leases.db`` in its data directory and derives its queue the same way, so the two
servers on one directory share their jobs; a ``queue.db`` beside ``leases.db`` (the
name ``fencing serve`` used before) is still read while it is the only queue file there.
"""

from __future__ import annotations

from pathlib import Path

from lease_server.clock import Clock
from lease_server.queue.backends.base import QueueBackend
from serving import urls
from serving.extras import needs_extra
from serving.sqlite_db import sqlite_path

#: The queue file ``fencing serve`` kept beside its ``leases.db`` before it derived it
#: as the lease server does; read while it is the only one, so no job is left behind.
FORMER_QUEUE_FILE = "queue.db"

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
        p = Path(path)
        queue = p.with_name(p.stem + "-queue" + (p.suffix or ".db"))
        former = p.with_name(FORMER_QUEUE_FILE)
        if p.name == "leases.db" and former.exists() and not queue.exists():
            queue = former
        return f"sqlite:{queue}"
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
    with needs_extra("postgres", "the PostgreSQL queue backend"):
        from lease_server.queue.backends.postgres import PostgresQueue

    return PostgresQueue(url)


__all__ = ["QueueBackend", "open_queue", "queue_url_for"]
