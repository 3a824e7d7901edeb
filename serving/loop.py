"""The event loop a server process runs on: the standard asyncio loop, or uvloop.

uvloop (libuv under asyncio's API) is an opt-in extra (``pip install
'fencing-guard[uvloop]'``, then ``--event-loop uvloop`` or ``FENCING_EVENT_LOOP=uvloop``):
gRPC's asyncio server runs on it unchanged and spends less CPU per call in the loop
itself (``python -m bench --only cpu`` measures both loops side by side). The default
stays the standard loop, which every platform has.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

from serving.extras import needs_extra

T = TypeVar("T")

#: The loops ``--event-loop`` accepts.
EVENT_LOOPS: Final = ("asyncio", "uvloop")


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop named ``name`` (``None``: asyncio's own). uvloop missing is
    a :class:`serving.extras.MissingExtraError` naming the pip command."""
    if name == "asyncio":
        return None
    if name != "uvloop":
        raise ValueError(f"event_loop: {name!r} is not one of {', '.join(EVENT_LOOPS)}")
    with needs_extra("uvloop", "--event-loop uvloop"):
        import uvloop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], event_loop: str = "asyncio") -> T:
    """``asyncio.run(main)`` on the loop named ``event_loop``."""
    try:
        factory = loop_factory(event_loop)
    except BaseException:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


__all__ = ["EVENT_LOOPS", "loop_factory", "run"]
