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
from urllib.parse import urlsplit

from fencing.errors import InvalidArgumentError
from lease_server.clock import Clock
from lease_server.queue.backends.base import QueueBackend
from serving.sqlite_db import sqlite_path

#: Schemes :func:`open_queue` knows.
SCHEMES = ("memory", "sqlite", "postgres", "postgresql")


def queue_url_for(lease_url: str) -> str:
    """The queue backend URL that goes with a lease backend URL (see the module docstring);
    "" when that kind of lease backend has no queue backend beside it."""
    scheme = urlsplit(lease_url).scheme
    if scheme == "sqlite":
        path = sqlite_path(lease_url)
        if path == ":memory:":
            return "sqlite://"
        p = PurePath(path)
        suffix = p.suffix or ".db"
        return f"sqlite:{p.with_name(p.stem + '-queue' + suffix)}"
    return lease_url if scheme in SCHEMES else ""


def open_queue(url: str, clock: Clock | None = None) -> QueueBackend:
    """Build (not yet open) the queue backend a URL names.

    ``clock`` drives the embedded backends; PostgreSQL always uses its own clock.
    """
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        from lease_server.queue.backends.memory import MemoryQueue

        return MemoryQueue(clock)
    if scheme == "sqlite":
        from lease_server.queue.backends.sqlite import SQLiteQueue

        return SQLiteQueue(sqlite_path(url), clock)
    if scheme in ("postgres", "postgresql"):
        from lease_server.queue.backends.postgres import PostgresQueue

        return PostgresQueue(url)
    raise InvalidArgumentError(
        f"unsupported queue backend {scheme + '://' if scheme else url!r}: use memory://, "
        "sqlite:///path or postgresql://...",
        field="queue",
    )


__all__ = ["QueueBackend", "open_queue", "queue_url_for"]
