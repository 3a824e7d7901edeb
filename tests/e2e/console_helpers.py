"""The console's tests: its operator, and a console in process (console.testing) that
knows that operator when actions are allowed."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

from console import testing

CHROMIUM = "/usr/bin/chromium"
OPERATOR = "alice"
PASSWORD = "correct horse"
OPERATORS = f"{OPERATOR}:sha256:{hashlib.sha256(PASSWORD.encode()).hexdigest()}"


@contextlib.contextmanager
def running_console(
    lease_addr: str, guard_addr: str, *, allow_actions: bool = False
) -> Iterator[str]:
    """A console on a free port; with ``allow_actions``, :data:`OPERATOR` may log in."""
    with testing.running_console(
        lease_addr,
        guard_addr,
        allow_actions=allow_actions,
        operators=OPERATORS if allow_actions else None,
    ) as url:
        yield url
