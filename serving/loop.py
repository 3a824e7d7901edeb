"""The event loop a server process runs on: the standard asyncio loop, or uvloop.

uvloop (libuv under asyncio's API) is an opt-in extra (``pip install
'fencing-guard[uvloop]'``, then ``--event-loop uvloop`` or ``FENCING_EVENT_LOOP=uvloop``):
gRPC's asyncio server runs on it unchanged and spends less CPU per call in the loop
itself (``python -m bench --only cpu`` measures both loops side by side). The default
stays the standard loop, which every platform has.

Either way :func:`run` first tunes the process's garbage collector for a server
(:func:`tune_gc`): a server's heap is mostly what it loaded at start, and its calls
allocate in bursts.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

from serving.extras import needs_extra

T = TypeVar("T")

#: The youngest generation's collection threshold in a server process (CPython's default
#: is 700 container allocations). A lease call allocates a few dozen containers and a
#: RenewMany of 10,000 leases a few hundred thousand that live until its answer, so at
#: the default the collector runs every few calls, and its older generations walk every
#: live object (a server holding 100,000 leases tracks that many): about a tenth of
#: such a server's CPU. Cycles are still collected, a few hundred calls later.
GC_THRESHOLD: Final = (50_000, 10, 10)

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
    tune_gc()
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def tune_gc() -> None:
    """A server process's collector: what is loaded by now (modules, the configuration)
    lives as long as the process, so it moves out of the collector's walks
    (``gc.freeze``), and young collections come every :data:`GC_THRESHOLD` allocations."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


__all__ = ["EVENT_LOOPS", "GC_THRESHOLD", "loop_factory", "run", "tune_gc"]
