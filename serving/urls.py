"""Storage URLs: which kind of storage a URL names, by its scheme, in one table.

Every opener of a store or backend (the guard's stores, the lease backends, the
queue backends) and the chaos harness read :data:`SCHEMES`; each opener says which
kinds it has an implementation of, and :func:`kind_of` refuses any other URL with
one clear error naming the setting it came from.

==================================================  ============
scheme                                              kind
==================================================  ============
``memory://``                                       ``memory``
``sqlite:///path`` (``sqlite://`` = in memory)      ``sqlite``
``postgres://``, ``postgresql://``                  ``postgres``
``redis://``, ``rediss://``, ``redis+cluster://``,  ``redis``
``rediss+cluster://``
==================================================  ============
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Final
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from fencing.errors import InvalidArgumentError

MEMORY: Final = "memory"
SQLITE: Final = "sqlite"
POSTGRES: Final = "postgres"
REDIS: Final = "redis"

#: Every kind of storage, in the order error messages list them.
KINDS: Final = (MEMORY, SQLITE, POSTGRES, REDIS)

#: URL scheme -> kind of storage.
SCHEMES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "memory": MEMORY,
        "sqlite": SQLITE,
        "postgres": POSTGRES,
        "postgresql": POSTGRES,
        "redis": REDIS,
        "rediss": REDIS,
        "redis+cluster": REDIS,
        "rediss+cluster": REDIS,
    }
)

#: How an error message shows a URL of each kind.
_EXAMPLES: Final = {
    MEMORY: "memory://",
    SQLITE: "sqlite:///path",
    POSTGRES: "postgresql://...",
    REDIS: "redis://...",
}


def kind(url: str) -> str | None:
    """The kind of storage ``url`` names, or None for a scheme no opener knows."""
    return SCHEMES.get(urlsplit(url).scheme)


def kind_of(url: str, *, what: str, field: str, kinds: Collection[str] = KINDS) -> str:
    """The kind of storage ``url`` names, one of ``kinds``.

    Anything else is an :class:`InvalidArgumentError` naming ``field`` (the setting
    the URL came from), the unsupported scheme, and the URLs ``what`` (e.g. "lease
    backend") accepts.
    """
    found = kind(url)
    if found is not None and found in kinds:
        return found
    scheme = urlsplit(url).scheme
    examples = [_EXAMPLES[k] for k in KINDS if k in kinds]
    accepted = (
        ", ".join(examples[:-1]) + " or " + examples[-1] if len(examples) > 1 else examples[0]
    )
    raise InvalidArgumentError(
        f"unsupported {what} {scheme + '://' if scheme else url!r}: use {accepted}",
        field=field,
    )


def split_params(
    url: str,
    ours: Collection[str],
    *,
    driver: Collection[str] = (),
    driver_hint: str = "",
    what: str,
    field: str,
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The query parameters of ``url``: ours (a dict) and the driver's (pairs, in order).

    A parameter that is neither ours nor one the driver takes (``driver``, described
    in messages by ``driver_hint``, e.g. "a libpq parameter (sslmode, ...)") is a
    typo: an :class:`InvalidArgumentError` naming ``field``, the parameter and the
    known ones, raised before anything connects (a typo'd ``?schem=`` must not fall
    back to the default schema, nor fail later as something else).
    """
    query = parse_qsl(urlsplit(url).query, keep_blank_values=True)
    unknown = [k for k, _ in query if k not in ours and k not in driver]
    if unknown:
        known = ", ".join(ours)
        if driver_hint:
            known += f", or {driver_hint}"
        raise InvalidArgumentError(
            f"unknown parameter {unknown[0]!r} in the {what} URL; known: {known}", field=field
        )
    return {k: v for k, v in query if k in ours}, [(k, v) for k, v in query if k not in ours]


def redact(url: str) -> str:
    """The URL without its password, for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


__all__ = [
    "KINDS",
    "MEMORY",
    "POSTGRES",
    "REDIS",
    "SCHEMES",
    "SQLITE",
    "kind",
    "kind_of",
    "redact",
    "split_params",
]
