"""Waiting for a condition in tests, with a generous hang guard and no timing threshold."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

#: Seconds before a wait that should have ended is called a hang.
HANG_GUARD = 30.0


async def eventually(check: Callable[[], bool | Awaitable[bool]], what: str = "condition") -> None:
    """Poll ``check`` (sync or async) until it is true; ``TimeoutError`` after the hang guard."""
    try:
        async with asyncio.timeout(HANG_GUARD):
            while True:
                result = check()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise TimeoutError(f"{what}: still false after {HANG_GUARD:g} s") from None


def wait_until(check: Callable[[], bool], what: str = "condition") -> None:
    """:func:`eventually` for synchronous tests: poll ``check`` until it is true."""
    deadline = time.monotonic() + HANG_GUARD
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: still false after {HANG_GUARD:g} s")
        time.sleep(0.02)
