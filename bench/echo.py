"""A bare grpc.aio echo server: the transport's own floor, with nothing of ours in it.

``python -m bench.echo --listen 127.0.0.1:0`` prints ``listening on ADDR`` (as our
servers do, so :func:`bench.harness.server` starts it) and answers two methods with
raw bytes (no protobuf, no interceptor, no logging):

* ``/bench.Echo/Unary``: a unary call answered with its request;
* ``/bench.Echo/Stream``: a bidirectional stream answering each message with itself.

What a message costs here is what grpc.aio and asyncio cost on this machine; a row of
ours over it is what our code adds.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator

import grpc
import grpc.aio

UNARY = "/bench.Echo/Unary"
STREAM = "/bench.Echo/Stream"


async def _unary(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def _stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


async def serve(listen: str) -> None:
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(_unary),
            "Stream": grpc.stream_stream_rpc_method_handler(_stream),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(listen)
    await server.start()
    host = listen.rsplit(":", 1)[0]
    print(f"listening on {host}:{port}", flush=True)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.echo", description=__doc__)
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--log-level", default="WARNING", help="accepted, unused (nothing logs)")
    args = p.parse_args(argv)
    asyncio.run(serve(args.listen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
