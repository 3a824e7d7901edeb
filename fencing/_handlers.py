"""Rewrapping grpc.aio method handlers: what every server interceptor here shares.

A grpc.aio interceptor only sees the method name and metadata; to see the request,
the status and the time a call took it must wrap the handler's behavior. ``around``
does that for every kind of RPC with one async context manager, entered before the
behavior runs (with the request, or None for client-streaming calls) and exited
with whatever the behavior raised.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc
import grpc.aio

Context = grpc.aio.ServicerContext[Any, Any]
#: ``around(request, context)``: entered before the behavior, exited after it.
Around = Callable[[Any, Context], AbstractAsyncContextManager[None]]


def rpc_type(handler: grpc.RpcMethodHandler[Any, Any]) -> str:
    """go-grpc-prometheus's ``grpc_type`` label of a handler."""
    if handler.request_streaming and handler.response_streaming:
        return "bidi_stream"
    if handler.request_streaming:
        return "client_stream"
    if handler.response_streaming:
        return "server_stream"
    return "unary"


async def _items(result: Any) -> AsyncIterator[Any]:
    """A streaming behavior either is an async generator or awaits ``context.write``."""
    if hasattr(result, "__aiter__"):
        async for item in result:
            yield item
    else:
        await result


def around(
    handler: grpc.RpcMethodHandler[Any, Any], wrap: Around
) -> grpc.RpcMethodHandler[Any, Any]:
    """The same handler with every call run inside ``wrap(request, context)``."""
    common = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        uu: Any = handler.unary_unary

        async def unary_unary(request: Any, context: Context) -> Any:
            async with wrap(request, context):
                return await uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **common)
    if handler.unary_stream is not None:
        us: Any = handler.unary_stream

        async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
            async with wrap(request, context):
                async for item in _items(us(request, context)):
                    yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, **common)
    if handler.stream_unary is not None:
        su: Any = handler.stream_unary

        async def stream_unary(requests: Any, context: Context) -> Any:
            async with wrap(None, context):
                return await su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **common)
    ss: Any = handler.stream_stream
    assert ss is not None

    async def stream_stream(requests: Any, context: Context) -> AsyncIterator[Any]:
        async with wrap(None, context):
            async for item in _items(ss(requests, context)):
                yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, **common)


def split_method(method: str) -> tuple[str, str]:
    """``/fencing.v1.LeaseService/Acquire`` -> ``("fencing.v1.LeaseService", "Acquire")``."""
    service, _, name = method.lstrip("/").partition("/")
    return service, name
