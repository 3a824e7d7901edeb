"""The sync and asyncio twins offer the same public API, parameter for parameter.

The twins are written by hand over shared I/O-free cores; this check is what keeps
them from drifting: every public method of one exists on the other with the same
parameters (names, kinds, defaults), except the few differences listed below, each
with its reason. A method added to one twin only fails here until the other has it
(or the difference is listed, with why).
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from fencing.client import (
    AsyncGuardClient,
    AsyncLease,
    AsyncLeaseClient,
    AsyncQueueClient,
    AsyncWatchStream,
    AsyncWriteStream,
    GuardClient,
    Lease,
    LeaseClient,
    QueueClient,
    WatchStream,
    WriteStream,
)
from fencing.worker import AsyncWorker, Worker

TWINS: list[tuple[type[Any], type[Any]]] = [
    (LeaseClient, AsyncLeaseClient),
    (GuardClient, AsyncGuardClient),
    (QueueClient, AsyncQueueClient),
    (WriteStream, AsyncWriteStream),
    (WatchStream, AsyncWatchStream),
    (Lease, AsyncLease),
    (Worker, AsyncWorker),
]

#: Names that differ on purpose: (sync name, async name). ``close``/``aclose`` follow
#: the asyncio convention (httpx, httpcore).
RENAMED = {("close", "aclose")}

#: Every other difference, with its reason; anything not here is drift.
#: ``(twin class name, member)``: the member exists on that twin only, or (for
#: ``__init__`` and members on both) its parameters differ.
KNOWN: dict[tuple[str, str], str] = {
    ("AsyncLease", "wait_lost"): "the awaitable form of lease.lost.wait(); the sync "
    "twin's lost is a threading.Event",
    ("WriteStream", "submit"): "a thread needs a future to keep many writes in flight; "
    "asyncio callers get that from tasks around write()",
    ("WriteStream", "write"): "a per-write timeout; asyncio callers bound it with "
    "asyncio.timeout()",
    ("WriteStream", "close"): "a bounded drain; asyncio callers bound aclose() with "
    "asyncio.timeout()",
    ("WriteStream", "__init__"): "made by GuardClient.stream() over its stub; the async "
    "twin over its channel: not constructed by users",
    ("AsyncWriteStream", "start"): "an asyncio stream's tasks need a running loop, so "
    "it starts when entered (or by start()); the sync twin starts its thread at once",
    ("AsyncWorker", "client"): "the sync twin's client is an instance attribute, set in "
    "__init__; the async one opens with run() and is a property that says so",
}


def known(sync: type[Any], aio: type[Any], name: str) -> bool:
    return (sync.__name__, name) in KNOWN or (aio.__name__, name) in KNOWN


def public(cls: type[Any]) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def shape(obj: Any) -> list[tuple[str, Any, Any]] | None:
    """Parameter names, kinds and defaults of a callable (None: not a callable)."""
    if not callable(obj):
        return None
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize(("sync", "aio"), TWINS, ids=lambda c: c.__name__)
def test_twins_have_the_same_public_names(sync: type[Any], aio: type[Any]) -> None:
    sync_names = public(sync) - {s for s, _ in RENAMED}
    async_names = public(aio) - {a for _, a in RENAMED}
    only_sync = {n for n in sync_names - async_names if not known(sync, aio, n)}
    only_async = {n for n in async_names - sync_names if not known(sync, aio, n)}
    assert only_sync == set(), f"only on {sync.__name__}"
    assert only_async == set(), f"only on {aio.__name__}"


@pytest.mark.parametrize(("sync", "aio"), TWINS, ids=lambda c: c.__name__)
def test_twins_take_the_same_parameters(sync: type[Any], aio: type[Any]) -> None:
    pairs = [(name, name) for name in public(sync) & public(aio)]
    pairs += [(s, a) for s, a in RENAMED if hasattr(sync, s) and hasattr(aio, a)]
    pairs.append(("__init__", "__init__"))
    pairs = [(s, a) for s, a in pairs if not inspect.isbuiltin(getattr(sync, s))]
    differ = {
        s: (shape(getattr(sync, s)), shape(getattr(aio, a)))
        for s, a in pairs
        if shape(getattr(sync, s)) != shape(getattr(aio, a)) and not known(sync, aio, s)
    }
    assert differ == {}


@pytest.mark.parametrize(("sync", "aio"), TWINS, ids=lambda c: c.__name__)
def test_every_async_method_of_the_twin_is_a_coroutine_or_a_context(
    sync: type[Any], aio: type[Any]
) -> None:
    """Where the sync twin blocks, the async twin must not: its method is awaitable,
    an async context manager, or an async iterator (never a plain blocking call)."""
    blocking = []
    for name in sorted(public(sync) & public(aio)):
        member = inspect.getattr_static(aio, name)
        if isinstance(member, property | staticmethod | classmethod) or not callable(member):
            continue
        sync_member = inspect.getattr_static(sync, name)
        if inspect.isfunction(sync_member) and inspect.isfunction(member):
            sync_returns_value = not inspect.isgeneratorfunction(sync_member)
            async_kind = (
                inspect.iscoroutinefunction(member)
                or inspect.isasyncgenfunction(member)
                or getattr(member, "__wrapped__", None) is not None
            )
            if sync_returns_value and not async_kind and _blocks(sync_member):
                blocking.append(name)
    assert blocking == []


def _blocks(func: Any) -> bool:
    """Whether a sync method does I/O (talks to a server): it has an RPC in its body."""
    try:
        source = inspect.getsource(func)
    except OSError:
        return False
    return any(call in source for call in ("self._call(", "self._run(", "self._stub."))


def test_every_known_difference_is_still_a_difference() -> None:
    """A listed difference that was fixed must leave the list (it would hide drift)."""
    names = {cls.__name__: cls for pair in TWINS for cls in pair}
    twin_of = {s.__name__: a for s, a in TWINS} | {a.__name__: s for s, a in TWINS}
    stale = []
    for cls_name, member in KNOWN:
        cls, other = names[cls_name], twin_of[cls_name]
        if member == "__init__" or (hasattr(cls, member) and hasattr(other, member)):
            if shape(getattr(cls, member)) == shape(getattr(other, member)):
                stale.append((cls_name, member))
        elif not hasattr(cls, member) or hasattr(other, member):
            stale.append((cls_name, member))
    assert stale == []
