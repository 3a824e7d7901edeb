"""Rewrapping grpc.aio method handlers: what every server interceptor here shares.

A grpc.aio interceptor only sees the method name and metadata; to see the request,
the status and the time a call took it must wrap the handler's behavior. ``around``
does that for every kind of RPC with one async context manager, entered before the
behavior runs (with the request, or None for client-streaming calls) and exited
with whatever the behavior raised. :class:`HandlerInterceptor` is the interceptor
around it: a subclass says which methods it applies to and how it wraps a handler.

``decoding`` makes a request that cannot be decoded (a string field that is not
UTF-8, a truncated frame) an ``INVALID_ARGUMENT`` naming the field, logged as one
line. grpc.aio calls the deserializer outside every handler, so without it the
protobuf ``DecodeError`` escapes as ``UNKNOWN`` with a traceback in the log.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, TypeAlias

import grpc
import grpc.aio
from google.protobuf import descriptor as _descriptor
from google.protobuf import empty_pb2
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from fencing import _status
from fencing.errors import InvalidArgumentError

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
#: ``around(request, context)``: entered before the behavior, exited after it.
Around = Callable[[Any, Context], AbstractAsyncContextManager[None]]
#: ``requests(stream, context)``: the request stream a streaming behavior reads instead.
Requests = Callable[[AsyncIterator[Any], Context], AsyncIterator[Any]]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


def rpc_type(handler: grpc.RpcMethodHandler[Any, Any]) -> str:
    """go-grpc-prometheus's ``grpc_type`` label of a handler."""
    if handler.request_streaming and handler.response_streaming:
        return "bidi_stream"
    if handler.request_streaming:
        return "client_stream"
    if handler.response_streaming:
        return "server_stream"
    return "unary"


class _Layers:
    """What ``around`` calls wrapped a handler in: the handler none of them made, the
    context managers (outermost first), the request-stream replacements (in the order
    they apply: outermost first) and the request deserializer."""

    __slots__ = ("base", "request_deserializer", "requests", "wraps")

    def __init__(
        self,
        base: Handler,
        wraps: tuple[Around, ...],
        requests: tuple[Requests, ...],
        request_deserializer: Callable[[bytes], Any] | None,
    ) -> None:
        self.base = base
        self.wraps = wraps
        self.requests = requests
        self.request_deserializer = request_deserializer


_LAYERS = "_fencing_layers"


def _behavior(handler: Handler) -> Any:
    return (
        handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    )


def _layers_of(handler: Handler) -> _Layers:
    found = getattr(_behavior(handler), _LAYERS, None)
    if isinstance(found, _Layers):
        return found
    return _Layers(handler, (), (), handler.request_deserializer)


def _responses(result: Any) -> AsyncIterator[Any]:
    """A streaming behavior's responses as an async iterator: an async generator as it
    is (no generator of ours in between), a plain iterator or a coroutine that writes
    with ``context.write`` wrapped."""
    if hasattr(result, "__aiter__"):
        return result  # type: ignore[no-any-return]
    return _wrapped_responses(result)


async def _wrapped_responses(result: Any) -> AsyncIterator[Any]:
    if hasattr(result, "__iter__"):
        for item in result:
            yield item
    else:  # it writes with context.write
        await result


async def _answer(result: Any) -> Any:
    """A unary behavior's answer, whether it was a coroutine or a plain function."""
    return await result if inspect.isawaitable(result) else result


def around(
    handler: Handler,
    wrap: Around,
    *,
    requests: Requests | None = None,
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> Handler:
    """The same handler with every call run inside ``wrap(request, context)``.

    ``requests`` replaces the request stream a client- or bidi-streaming behavior
    reads (see :func:`decoding`); ``request_deserializer`` replaces the handler's own.
    A behavior may be a coroutine function, an async generator, a plain function or
    iterator, or a coroutine that writes with ``context.write``: the wrapper is
    always async and handles each.

    Wrapping a handler ``around`` made does not nest a second wrapper: the new one
    enters every context manager, outermost first, around the one behavior, so a
    streamed message passes one async generator whatever the number of interceptors
    (nested, each layer cost a generator hop per message, both ways).
    """
    inner = _layers_of(handler)
    layers = _Layers(
        inner.base,
        (wrap, *inner.wraps),
        ((requests,) if requests is not None else ()) + inner.requests,
        request_deserializer or handler.request_deserializer,
    )
    built = _build(layers)
    setattr(_behavior(built), _LAYERS, layers)
    return built


def _build(layers: _Layers) -> Handler:
    base, wraps, transforms = layers.base, layers.wraps, layers.requests
    common = {
        "request_deserializer": layers.request_deserializer,
        "response_serializer": base.response_serializer,
    }
    (only,) = wraps if len(wraps) == 1 else (None,)

    def entered(request: Any, context: Context) -> AbstractAsyncContextManager[Any]:
        if only is not None:
            return only(request, context)
        return _entered_all(wraps, request, context)

    def stream_of(incoming: Any, context: Context) -> Any:
        for replace in transforms:
            incoming = replace(incoming, context)
        return incoming

    if base.unary_unary is not None:
        uu: Any = base.unary_unary

        async def answer(request: Any, context: Context) -> Any:
            return await _answer(uu(request, context))

        unary_unary: Callable[[Any, Context], Awaitable[Any]] = answer
        # A unary call pays the layers once, not per message: nested coroutines are
        # cheaper then than entering the managers through an exit stack.
        for wrap in reversed(wraps):
            unary_unary = _within_unary(wrap, unary_unary)
        return grpc.unary_unary_rpc_method_handler(unary_unary, **common)
    if base.unary_stream is not None:
        us: Any = base.unary_stream

        async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
            async with entered(request, context):
                async for item in _responses(us(request, context)):
                    yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, **common)
    if base.stream_unary is not None:
        su: Any = base.stream_unary

        async def stream_unary(incoming: Any, context: Context) -> Any:
            async with entered(None, context):
                return await _answer(su(stream_of(incoming, context), context))

        return grpc.stream_unary_rpc_method_handler(stream_unary, **common)
    ss: Any = base.stream_stream
    assert ss is not None

    async def stream_stream(incoming: Any, context: Context) -> AsyncIterator[Any]:
        async with entered(None, context):
            async for item in _responses(ss(stream_of(incoming, context), context)):
                yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, **common)


def _within_unary(
    wrap: Around, call: Callable[[Any, Context], Awaitable[Any]]
) -> Callable[[Any, Context], Awaitable[Any]]:
    async def unary_unary(request: Any, context: Context) -> Any:
        async with wrap(request, context):
            return await call(request, context)

    return unary_unary


@asynccontextmanager
async def _entered_all(
    wraps: tuple[Around, ...], request: Any, context: Context
) -> AsyncIterator[None]:
    """Every one of ``wraps`` entered, the first outermost: as if nested."""
    async with AsyncExitStack() as stack:
        for wrap in wraps:
            await stack.enter_async_context(wrap(request, context))
        yield


class HandlerInterceptor(grpc.aio.ServerInterceptor):
    """A server interceptor that rewraps the handler of every method it applies to.

    Subclasses override :meth:`wrap` (usually ``around(handler, ...)``) and, to leave
    some methods alone, :meth:`applies`. An unknown method (no handler) is passed on
    untouched: gRPC answers it UNIMPLEMENTED itself.
    """

    #: Per method: the handler last wrapped and its wrapper (made on first use, so a
    #: subclass's ``__init__`` need not call this one's).
    _wrapped: dict[str, tuple[Handler, Handler]] | None = None

    def applies(self, method: str) -> bool:
        """Whether calls of ``method`` (``/package.Service/Method``) are wrapped."""
        return True

    def wrap(self, handler: Handler, method: str) -> Handler:
        """``handler`` of ``method``, rewrapped."""
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None:
            return None
        # A method's handler is the same object call after call: wrap it once (the
        # wrapper keeps no state of a call), not again for every call.
        if self._wrapped is None:
            self._wrapped = {}
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self.wrap(handler, method) if self.applies(method) else handler
        self._wrapped[method] = (handler, wrapped)
        return wrapped


def split_method(method: str) -> tuple[str, str]:
    """``/fencing.v1.LeaseService/Acquire`` -> ``("fencing.v1.LeaseService", "Acquire")``."""
    service, _, name = method.lstrip("/").partition("/")
    return service, name


# -- requests that cannot be decoded -------------------------------------------------------

_LENGTH_DELIMITED = 2
#: protobuf's default recursion limit: no request we accept nests deeper.
_MAX_DEPTH = 100


class UndecodableRequestError(InvalidArgumentError):
    """The bytes of a request are not a message of its type; ``field`` names the
    string field that is not UTF-8 where one is to blame."""


def not_utf8_field(
    message: _descriptor.Descriptor, raw: bytes, path: str = "", depth: int = 0
) -> str | None:
    """The path (``writes[0].ops[1].put.key``) of the first string field of ``raw`` whose
    bytes are not UTF-8, read as a ``message``; None if there is none or ``raw`` is not
    even well-formed protobuf.

    The frame is parsed as an empty message, which keeps every field as raw unknown
    bytes (no UTF-8 check), and walked with ``message``'s descriptor, no deeper than
    protobuf's own recursion limit (a recursive type could otherwise nest without end).
    """
    if depth > _MAX_DEPTH:
        return None
    probe = empty_pb2.Empty()
    try:
        probe.ParseFromString(raw)
    except DecodeError:
        return None
    seen: dict[int, int] = {}
    fields = UnknownFieldSet(probe)
    for n in range(len(fields)):
        item = fields[n]
        field = message.fields_by_number.get(item.field_number)
        if field is None or item.wire_type != _LENGTH_DELIMITED:
            continue
        index = seen[item.field_number] = seen.get(item.field_number, -1) + 1
        name = f"{path}{field.name}[{index}]" if field.is_repeated else f"{path}{field.name}"
        if field.type == _descriptor.FieldDescriptor.TYPE_STRING:
            try:
                bytes(item.data).decode("utf-8")
            except UnicodeDecodeError:
                return name
        elif field.type == _descriptor.FieldDescriptor.TYPE_MESSAGE and field.message_type:
            found = not_utf8_field(field.message_type, bytes(item.data), f"{name}.", depth + 1)
            if found is not None:
                return found
    return None


class _Undecodable:
    """What the wrapped deserializer returns in place of a request it cannot decode."""

    __slots__ = ("error",)

    def __init__(self, error: UndecodableRequestError) -> None:
        self.error = error


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None
    message_class = getattr(deserializer, "__self__", None)
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    type_name = descriptor.full_name if descriptor is not None else "request"

    def decode(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except DecodeError as exc:
            known = descriptor  # a local: mypy narrows no captured name
            field = None if known is None else not_utf8_field(known, raw)
            if field is not None:
                error = UndecodableRequestError(
                    f"{field} is not valid UTF-8 (protobuf string fields must be)", field=field
                )
            else:
                error = UndecodableRequestError(f"the request is not a valid {type_name}: {exc}")
            return _Undecodable(error)

    return decode


def decoding(handler: Handler, method: str) -> Handler:
    """``handler`` answering a request (or a streamed message) it cannot decode with
    ``INVALID_ARGUMENT`` (see :class:`UndecodableRequestError`), logged as one line."""

    def note(error: UndecodableRequestError, context: Context) -> UndecodableRequestError:
        log.warning(
            "refused %s from %s: %s",
            method,
            context.peer(),
            error,
            extra={"method": method, "peer": context.peer(), "field": error.field},
        )
        return error

    async def checked(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
        # Raised inside the servicer's own loop: a servicer that turns our errors
        # into statuses itself (WriteStream does) answers with it; otherwise the
        # wrapper below does.
        async for request in requests:
            if isinstance(request, _Undecodable):
                raise note(request.error, context)
            yield request

    @asynccontextmanager
    async def refusing(request: Any, context: Context) -> AsyncIterator[None]:
        if isinstance(request, _Undecodable):
            await _status.abort(context, note(request.error, context))
        try:
            yield
        except UndecodableRequestError as exc:
            await _status.abort(context, exc)

    return around(
        handler,
        refusing,
        requests=checked,
        request_deserializer=_safe(handler.request_deserializer),
    )
