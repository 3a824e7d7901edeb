"""Ending a server's background tasks: cancelled until they end.

A task is cancelled by one ``CancelledError`` thrown at its current ``await``; code that
catches it and goes on swallows the cancellation for good. On Python 3.11,
``asyncio.wait_for`` does so by itself: when the awaited work finishes in the same loop
turn as the cancellation arrives, it returns the result instead of raising (fixed in
3.12). redis-py sends every command through ``wait_for`` when a socket timeout is set,
as ours are, so a task cancelled while a Redis command is being written carried on as
if it had never been cancelled: a guard's watch follower went back to waiting for the
next lease event and a guard on Redis never finished stopping. Our Redis connections
(:mod:`serving.redis_db`) now raise such a cancellation again. Every background task of
a server is still cancelled again, every :data:`RECANCEL_S`, until it ends, for any other
code that swallows one; re-cancelling alone is no cure for a swallow that recurs, though:
under load each re-cancel tends to land at the same point of the task's loop (the
process gets the CPU back with the task's I/O and the re-cancel timer both due, and the
task runs first), so the same swallow can repeat for as long as one waits.
"""

from __future__ import annotations

import asyncio
from typing import Any

#: Seconds between cancellations of a task that has not ended yet: the time a task has
#: for its own cleanup after a cancellation (a watch follower stores its cursor) before
#: it is cancelled again.
RECANCEL_S = 0.5


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and return once every one has ended, cancelling again each
    :data:`RECANCEL_S` the ones that went on. A task that failed on its own (not by the
    cancellation) has its exception raised here, the first one's, after all have ended."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            task.result()
