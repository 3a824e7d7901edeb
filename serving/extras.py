"""Optional extras: a backend whose driver is not installed is a settings error.

``fencing-guard`` installs the embedded backends only; PostgreSQL and Redis need an
extra (``pip install 'fencing-guard[postgres]'``, ``[redis]``). Every place that
imports a driver for a URL does it inside :func:`needs_extra`, which turns the
``ModuleNotFoundError`` of that extra's driver into a :class:`MissingExtraError`
naming the pip command; the commands report it in one line with exit 2 (USAGE).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

#: extra -> the top-level modules it installs that our code imports.
MODULES: Final = {
    "postgres": ("psycopg", "psycopg_pool"),
    "redis": ("redis", "hiredis"),
    "mysql": ("asyncmy",),
    "uvloop": ("uvloop",),
}


class MissingExtraError(ValueError):
    """``what`` needs ``extra``, whose module ``module`` is not installed."""

    def __init__(self, what: str, extra: str, module: str) -> None:
        self.what = what
        self.extra = extra
        self.module = module
        self.hint = f"pip install 'fencing-guard[{extra}]'"
        super().__init__(f"{what} needs the {extra} extra ({module} is not installed): {self.hint}")


@contextmanager
def needs_extra(extra: str, what: str) -> Iterator[None]:
    """Run an import of ``what`` (e.g. "the PostgreSQL lease backend"); a missing module
    of ``extra`` becomes :class:`MissingExtraError`, any other failure stays as it is."""
    try:
        yield
    except ModuleNotFoundError as exc:
        module = (exc.name or "").split(".")[0]
        if module not in MODULES[extra]:
            raise
        raise MissingExtraError(what, extra, module) from exc


__all__ = ["MODULES", "MissingExtraError", "needs_extra"]
