"""Carrying the current lease's token to your own gRPC services.

Inside ``hold(...)`` (sync or asyncio) the lease is the *current* fenced claim of
this thread or task: :func:`current` returns it. A client interceptor
(:mod:`fencing.client.interceptors`) adds it to every gRPC call made there as
metadata, ``fencing-resource`` and ``fencing-token``; on the server,
:class:`guard.interceptor.FenceInterceptor` reads it back with
:func:`from_metadata`, enforces the fence, and makes the request's claim the
current one for the handler. Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token

from fencing import limits
from fencing.errors import InvalidArgumentError
from fencing.types import Claim, Fenced

#: Metadata keys (gRPC metadata keys are lowercase ASCII).
RESOURCE_KEY = "fencing-resource"
TOKEN_KEY = "fencing-token"

_current: ContextVar[Fenced | None] = ContextVar("fencing_current", default=None)


def current() -> Fenced | None:
    """The lease (client side) or claim (server side) this code acts under, if any."""
    return _current.get()


def set_current(fenced: Fenced | None) -> Token[Fenced | None]:
    """Make ``fenced`` current until :func:`reset_current` with the returned token."""
    return _current.set(fenced)


def reset_current(token: Token[Fenced | None]) -> None:
    _current.reset(token)


@contextmanager
def bound(fenced: Fenced) -> Iterator[Fenced]:
    """Make ``fenced`` current for the block (and for tasks and threads started with a
    copy of this context inside it)."""
    token = _current.set(fenced)
    try:
        yield fenced
    finally:
        _current.reset(token)


def to_metadata(fenced: Fenced) -> tuple[tuple[str, str], tuple[str, str]]:
    return ((RESOURCE_KEY, fenced.resource), (TOKEN_KEY, str(fenced.token)))


def has_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    """True if ``metadata`` already names a token (an explicit one wins over the current)."""
    return any(key == TOKEN_KEY for key, _ in metadata or ())


def from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> Claim | None:
    """The claim a call carries, or None if it carries neither key.

    Raises :class:`InvalidArgumentError` (``field`` = the metadata key) when only one
    key is present, a key is repeated, or a value is out of its limits.
    """
    found: dict[str, list[str]] = {}
    for key, value in metadata or ():
        if key in (RESOURCE_KEY, TOKEN_KEY):
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            found.setdefault(key, []).append(text)
    if not found:
        return None
    for key in (RESOURCE_KEY, TOKEN_KEY):
        values = found.get(key, [])
        if len(values) != 1:
            raise InvalidArgumentError(
                f"metadata {key} must appear exactly once, found {len(values)}", field=key
            )
    resource = limits.check_resource(found[RESOURCE_KEY][0], RESOURCE_KEY)
    raw = found[TOKEN_KEY][0]
    if not raw.isascii() or not raw.isdigit():
        raise InvalidArgumentError(
            f"metadata {TOKEN_KEY} is not a number: {raw!r}", field=TOKEN_KEY
        )
    return Claim(resource, limits.check_token(int(raw), TOKEN_KEY))


__all__ = [
    "RESOURCE_KEY",
    "TOKEN_KEY",
    "bound",
    "current",
    "from_metadata",
    "has_token",
    "reset_current",
    "set_current",
    "to_metadata",
]
