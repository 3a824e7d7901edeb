"""serving.handlers.HandlerInterceptor: one wrapper around every kind of RPC.

Each kind (unary, server stream, client stream, bidi), written as a coroutine, a
plain function, an async generator or a plain iterator, runs inside the
interceptor's context manager: entered before the behavior with the request (None
for client-streaming calls), exited after it with what it raised, and a context
variable set on entry is what the behavior sees.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import grpc.aio
import pytest

from serving import handlers

SERVICE = "test.Wrapped"
seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="")


async def unary_async(request: bytes, context: Any) -> bytes:
    return request + seen.get().encode()


def unary_plain(request: bytes, context: Any) -> bytes:
    return request + seen.get().encode()


async def server_stream_async(request: bytes, context: Any) -> AsyncIterator[bytes]:
    yield request
    yield seen.get().encode()


def server_stream_plain(request: bytes, context: Any) -> Iterator[bytes]:
    return iter([request, seen.get().encode()])


async def client_stream(requests: AsyncIterator[bytes], context: Any) -> bytes:
    return b"".join([r async for r in requests]) + seen.get().encode()


async def bidi(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request + seen.get().encode()


async def failing(request: bytes, context: Any) -> bytes:
    raise RuntimeError("boom")


METHODS: dict[str, handlers.Handler] = {
    "UnaryAsync": grpc.unary_unary_rpc_method_handler(unary_async),
    "UnaryPlain": grpc.unary_unary_rpc_method_handler(unary_plain),
    "ServerStreamAsync": grpc.unary_stream_rpc_method_handler(server_stream_async),
    "ServerStreamPlain": grpc.unary_stream_rpc_method_handler(server_stream_plain),
    "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
    "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
    "Failing": grpc.unary_unary_rpc_method_handler(failing),
    "Skipped": grpc.unary_unary_rpc_method_handler(unary_async),
}


class Recording(handlers.HandlerInterceptor):
    def __init__(self) -> None:
        self.log: list[tuple[str, object, str]] = []

    def applies(self, method: str) -> bool:
        return not method.endswith("/Skipped")

    def wrap(self, handler: handlers.Handler, method: str) -> handlers.Handler:
        name = handlers.split_method(method)[1]

        @asynccontextmanager
        async def recorded(request: Any, context: handlers.Context) -> AsyncIterator[None]:
            self.log.append(("enter", name, repr(request)))
            token = seen.set(f"<{name}>")
            try:
                yield
            except Exception as exc:
                self.log.append(("raised", name, type(exc).__name__))
                raise
            finally:
                seen.reset(token)
            self.log.append(("exit", name, ""))

        return handlers.around(handler, recorded)


@pytest.fixture
async def server() -> AsyncIterator[tuple[grpc.aio.Channel, Recording]]:
    recording = Recording()
    srv = grpc.aio.server(interceptors=[recording])
    srv.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, METHODS)])
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel, recording
    finally:
        await srv.stop(0)


def _call(channel: grpc.aio.Channel, kind: str, name: str) -> Any:
    """The multi-callable of ``SERVICE``'s method ``name`` (``kind``: unary_unary, ...)."""
    return getattr(channel, kind)(f"/{SERVICE}/{name}")


async def _requests() -> AsyncIterator[bytes]:
    yield b"a"
    yield b"b"


async def test_every_kind_runs_inside_the_wrapper(
    server: tuple[grpc.aio.Channel, Recording],
) -> None:
    channel, recording = server
    assert await _call(channel, "unary_unary", "UnaryAsync")(b"x") == b"x<UnaryAsync>"
    assert await _call(channel, "unary_unary", "UnaryPlain")(b"x") == b"x<UnaryPlain>"
    for name in ("ServerStreamAsync", "ServerStreamPlain"):
        got = [r async for r in _call(channel, "unary_stream", name)(b"x")]
        assert got == [b"x", f"<{name}>".encode()]
    assert await _call(channel, "stream_unary", "ClientStream")(_requests()) == b"ab<ClientStream>"
    got = [r async for r in _call(channel, "stream_stream", "Bidi")(_requests())]
    assert got == [b"a<Bidi>", b"b<Bidi>"]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _call(channel, "unary_unary", "Failing")(b"x")
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert await _call(channel, "unary_unary", "Skipped")(b"x") == b"x"  # not wrapped
    assert recording.log == [
        ("enter", "UnaryAsync", "b'x'"),
        ("exit", "UnaryAsync", ""),
        ("enter", "UnaryPlain", "b'x'"),
        ("exit", "UnaryPlain", ""),
        ("enter", "ServerStreamAsync", "b'x'"),
        ("exit", "ServerStreamAsync", ""),
        ("enter", "ServerStreamPlain", "b'x'"),
        ("exit", "ServerStreamPlain", ""),
        ("enter", "ClientStream", "None"),
        ("exit", "ClientStream", ""),
        ("enter", "Bidi", "None"),
        ("exit", "Bidi", ""),
        ("enter", "Failing", "b'x'"),
        ("raised", "Failing", "RuntimeError"),
    ]


async def test_a_methods_handler_is_wrapped_once_and_again_when_it_changes() -> None:
    recording = Recording()
    first: handlers.Handler = grpc.unary_unary_rpc_method_handler(unary_async)
    second: handlers.Handler = grpc.unary_unary_rpc_method_handler(unary_async)
    current = first

    async def continuation(details: grpc.HandlerCallDetails) -> handlers.Handler:
        return current

    details: Any = type("Details", (), {"method": f"/{SERVICE}/Unary"})()
    wrapped = await recording.intercept_service(continuation, details)
    assert wrapped is not first
    assert await recording.intercept_service(continuation, details) is wrapped
    current = second
    rewrapped = await recording.intercept_service(continuation, details)
    assert rewrapped is not wrapped and rewrapped is not second
