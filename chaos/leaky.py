"""A deliberately leaking server, for the soak's growth-check control only.

``python -m chaos.leaky KIND MODULE ARGS...`` runs ``python -m MODULE ARGS...`` (the
lease server or the guard) with one extra gRPC server interceptor that keeps one
object per call and never lets go of it:

- ``task``: an asyncio task waiting forever (``fencing_asyncio_tasks`` climbs);
- ``fd``: an open file descriptor on ``/dev/null`` (open descriptors climb);
- ``memory``: 64 KiB of bytes (resident memory climbs).

The soak's health check must flag it (:func:`chaos.health.growth`), or it could not
catch a real leak either. This lives in the harness, not in the servers: no build
anyone runs can switch it on.
"""

from __future__ import annotations

import asyncio
import os
import runpy
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc
import grpc.aio

from serving.handlers import Handler

KINDS: Final = ("task", "fd", "memory")

_kept: list[object] = []


def _keep(kind: str) -> None:
    if kind == "task":
        _kept.append(asyncio.get_running_loop().create_task(asyncio.Event().wait()))
    elif kind == "fd":
        _kept.append(os.open(os.devnull, os.O_RDONLY))
    else:
        _kept.append(bytes(64 * 1024))


class LeakingInterceptor(grpc.aio.ServerInterceptor):
    """Keeps one object of ``kind`` per call it sees, then hands the call on."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        _keep(self.kind)
        return await continuation(handler_call_details)


def install(kind: str) -> None:
    """Make every ``grpc.aio.server`` built from now on leak one ``kind`` per call."""
    if kind not in KINDS:
        raise SystemExit(f"chaos.leaky: unknown leak {kind!r} (expected one of {KINDS})")
    build = grpc.aio.server

    def leaking_server(*args: Any, **kwargs: Any) -> grpc.aio.Server:
        kwargs["interceptors"] = [LeakingInterceptor(kind), *(kwargs.get("interceptors") or [])]
        return build(*args, **kwargs)

    grpc.aio.server = leaking_server


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: python -m chaos.leaky KIND MODULE [ARGS...]")
    kind, module, *rest = argv
    install(kind)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
