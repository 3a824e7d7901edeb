"""SQL of the queue backends as named assets: one ``.sql`` file per backend.

A file is a sequence of blocks, each starting with a ``-- name: <name>`` line and a
header comment saying what the statement takes and returns (procrastinate's
``queries.sql`` shape)::

    -- name: claim_ready
    -- Ready, due jobs of a queue in claim order. Takes queue, now_ms, limit.
    SELECT ...

:func:`load` returns ``{name: statement}`` with the comments kept (SQLite and
PostgreSQL ignore them), so a statement seen in a log or ``pg_stat_statements``
still says what it is.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def load(file: str) -> dict[str, str]:
    """The named statements of ``lease_server/queue/backends/sql/<file>``."""
    text = resources.files(__package__).joinpath(file).read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"{file}: query {name} is defined twice")
        queries[name] = body.strip()
    return queries
