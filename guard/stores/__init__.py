"""Fenced stores, found by the scheme of their URL.

Built in: ``memory://``, ``sqlite:///path``, ``postgres://``/``postgresql://`` (see
:mod:`serving.postgres_db` for the URL's parameters), ``redis://`` (and ``rediss://``,
``redis+cluster://``), ``mysql://``/``mariadb://`` (:mod:`guard.stores.mysql`, the
``mysql`` extra). Any installed distribution can add a scheme through the
``fencing.guard_stores`` entry-point group; the entry point's name is the scheme and its
object a :data:`StoreFactory` (a callable taking the whole URL and returning a store not
yet opened)::

    # the store package's pyproject.toml
    [project.entry-points."fencing.guard_stores"]
    foo = "fencing_store_foo:FooStore"

then ``fencing-guard --store foo://...`` opens it, with no change to this repository.
:func:`register_store` does the same in-process (tests, embedding). The interface a store
implements, and what each member must guarantee, is :mod:`guard.stores.base`
(:data:`~guard.stores.base.STORE_API_VERSION`); :mod:`fencing.testing.stores` is the
contract suite that proves a store honours it.

Lookup order for a scheme: :func:`register_store`, then the built-ins, then entry
points. A built-in scheme cannot be taken over by a package (an entry point naming one
is ignored with a warning), so installing a package never changes what an existing
``postgresql://`` URL opens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib import metadata
from urllib.parse import urlsplit

from fencing.errors import InvalidArgumentError
from guard.stores.base import STORE_API_VERSION, GuardStore, StoreWriteResult, missing_members
from serving.extras import needs_extra
from serving.sqlite_db import sqlite_path

log = logging.getLogger(__name__)

#: The entry-point group a store package registers its URL schemes under.
ENTRY_POINT_GROUP = "fencing.guard_stores"

#: Builds a store (not yet opened) from its whole URL.
StoreFactory = Callable[[str], GuardStore]


def _memory(url: str) -> GuardStore:
    from guard.stores.memory import MemoryStore

    return MemoryStore()


def _sqlite(url: str) -> GuardStore:
    from guard.stores.sqlite import SQLiteStore

    return SQLiteStore(sqlite_path(url))


def _postgres(url: str) -> GuardStore:
    with needs_extra("postgres", "the PostgreSQL guard store"):
        from guard.stores.postgres import PostgresStore

    return PostgresStore(url)


def _redis(url: str) -> GuardStore:
    with needs_extra("redis", "the Redis guard store"):
        from guard.stores.redis import RedisStore

    return RedisStore(url)


def _mysql(url: str) -> GuardStore:
    with needs_extra("mysql", "the MySQL guard store"):
        from guard.stores.mysql import MySQLStore

    return MySQLStore(url)


#: The stores this repository ships, by scheme: found without entry points, so they work
#: from a source checkout and no installed package can shadow them.
BUILTIN: dict[str, StoreFactory] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "postgres": _postgres,
    "postgresql": _postgres,
    "redis": _redis,
    "rediss": _redis,
    "redis+cluster": _redis,
    "rediss+cluster": _redis,
    "mysql": _mysql,
    "mariadb": _mysql,
}

_registered: dict[str, StoreFactory] = {}


def register_store(scheme: str, factory: StoreFactory) -> None:
    """Open ``scheme://`` URLs with ``factory`` in this process (wins over everything).

    For tests and programs that embed the guard; a store package registers an entry
    point instead (module doc), so every process finds it."""
    if not scheme or scheme != scheme.lower() or "://" in scheme:
        raise InvalidArgumentError(
            f"store scheme {scheme!r} must be a lower-case URL scheme", field="scheme"
        )
    _registered[scheme] = factory


def unregister_store(scheme: str) -> None:
    """Undo :func:`register_store` (no error if it was not registered)."""
    _registered.pop(scheme, None)


def _entry_points() -> dict[str, metadata.EntryPoint]:
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTIN:
            if not ep.value.startswith("guard.stores"):
                log.warning(
                    "ignoring store entry point %s = %s: %r is a built-in scheme",
                    ep.name,
                    ep.value,
                    ep.name,
                )
            continue
        found.setdefault(ep.name, ep)
    return found


def installed_schemes() -> list[str]:
    """Every scheme :func:`open_store` can open here, sorted."""
    return sorted({*_registered, *BUILTIN, *_entry_points()})


def _factory(scheme: str) -> StoreFactory | None:
    if scheme in _registered:
        return _registered[scheme]
    if scheme in BUILTIN:
        return BUILTIN[scheme]
    ep = _entry_points().get(scheme)
    if ep is None:
        return None
    try:
        loaded = ep.load()
    except Exception as exc:  # a broken package: say which, not a bare ImportError
        raise InvalidArgumentError(
            f"store scheme {scheme!r}: cannot load entry point {ep.value} "
            f"({type(exc).__name__}: {exc})",
            field="store",
        ) from exc
    if not callable(loaded):
        raise InvalidArgumentError(
            f"store scheme {scheme!r}: entry point {ep.value} is not callable", field="store"
        )
    factory: StoreFactory = loaded
    return factory


def open_store(url: str) -> GuardStore:
    """Build (not yet open) the store a URL names, by its scheme (module doc).

    An unknown scheme is an :class:`InvalidArgumentError` on field ``store`` naming the
    installed schemes; so is a store that lacks a member of the
    :class:`~guard.stores.base.GuardStore` Protocol or declares another ``api_version``.
    """
    scheme = urlsplit(url).scheme
    factory = _factory(scheme)
    if factory is None:
        shown = f"{scheme}://" if scheme else url
        raise InvalidArgumentError(
            f"unsupported guard store {shown!r}: installed store schemes are "
            f"{', '.join(s + '://' for s in installed_schemes())} (a store package adds "
            f"one through the {ENTRY_POINT_GROUP!r} entry-point group)",
            field="store",
        )
    store = factory(url)
    missing = missing_members(store)
    if missing:
        raise InvalidArgumentError(
            f"store for {scheme}:// ({type(store).__name__}) lacks {', '.join(missing)} "
            "of the GuardStore interface",
            field="store",
        )
    version = getattr(store, "api_version", STORE_API_VERSION)
    if version != STORE_API_VERSION:
        raise InvalidArgumentError(
            f"store for {scheme}:// implements store API version {version}; this guard "
            f"speaks version {STORE_API_VERSION}",
            field="store",
        )
    return store


__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "STORE_API_VERSION",
    "GuardStore",
    "StoreFactory",
    "StoreWriteResult",
    "installed_schemes",
    "open_store",
    "register_store",
    "unregister_store",
]
