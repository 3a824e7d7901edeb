"""``FenceInterceptor``: fence your own gRPC service with the token the caller carries.

A ``grpc.aio`` server interceptor over any :class:`~guard.stores.base.GuardStore`.
For each call of a fenced method it reads ``fencing-resource`` and
``fencing-token`` from the call's metadata (put there by
:mod:`fencing.client.interceptors` inside ``hold``), and *before* the handler runs
it checks and advances the resource's fence in one transaction of the store
(``store.fence``: reject if token < fence, else raise the fence to token). A stale
call ends with ``FAILED_PRECONDITION`` and an ``ErrorInfo`` ``STALE_TOKEN`` carrying
``current_token`` (the SDK raises ``StaleTokenError``), and its handler never runs.
An admitted call's handler sees the claim as :func:`fencing.propagation.current`.

**What it does not make atomic.** The check and the handler's own effect are
*not* one transaction, unless the handler makes its effect through the same
store, in a transaction that checks the token again (``store.write(resource,
token, ops)`` does check, apply and advance atomically). Otherwise the check
commits first and the handler acts afterwards, so:

- once a call with token t' has been admitted (or the fence reached t' any other
  way: a write, a promise, watch mode), no call with a token < t' is admitted;
- but a call with t < t' admitted *before* that may still be running its handler,
  and its effect may land after the effect of t'. The window is the handler's
  run time after its check; a handler that must not act late should re-check in
  its own transaction of the same store (or keep its effect in that store).

Methods: every method of the server except the ``grpc.*`` services (health,
reflection), or exactly those named in ``methods`` (full names,
``/package.Service/Method``). A fenced call without the metadata is refused with
``INVALID_ARGUMENT`` (``field`` = ``fencing-token``) unless ``require=False``,
which lets it through unchecked. A fenced call whose request cannot be decoded (a
string that is not UTF-8) is ``INVALID_ARGUMENT`` naming the field, before its claim
is judged, as on the lease server and the guard.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar, cast

import grpc
import grpc.aio

from fencing import _status, propagation
from fencing.errors import FencingError, InvalidArgumentError, StaleTokenError
from fencing.types import Claim
from guard.stores.base import GuardStore
from serving import handlers

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
Req = TypeVar("Req")
Resp = TypeVar("Resp")


async def _finish(result: Any) -> Any:
    """A handler's outcome, whether it was written as a coroutine or a plain function."""
    return await result if inspect.isawaitable(result) else result


class FenceInterceptor(grpc.aio.ServerInterceptor):
    """Check and advance the fence of the caller's (resource, token) before each handler."""

    def __init__(
        self,
        store: GuardStore,
        *,
        methods: Collection[str] | None = None,
        require: bool = True,
    ) -> None:
        self.store = store
        self.methods = frozenset(methods) if methods is not None else None
        self.require = require
        self.stale_rejections = 0

    def fences(self, method: str) -> bool:
        if self.methods is not None:
            return method in self.methods
        return not method.startswith("/grpc.")

    async def admit(
        self, metadata: Sequence[tuple[str, str | bytes]] | None, context: Context
    ) -> Claim | None:
        """Check and advance the fence for the call's claim; abort the call if refused."""
        try:
            claim = propagation.from_metadata(metadata)
            if claim is None:
                if self.require:
                    raise InvalidArgumentError(
                        f"this method is fenced: the call must carry {propagation.RESOURCE_KEY} "
                        f"and {propagation.TOKEN_KEY} metadata",
                        field=propagation.TOKEN_KEY,
                    )
                return None
            await self.store.fence(claim.resource, claim.token)
        except StaleTokenError as exc:
            self.stale_rejections += 1
            log.warning(
                "stale call rejected",
                extra={"resource": exc.resource, "token": exc.token, "fence": exc.current_token},
            )
            await _status.abort(context, exc)
        except FencingError as exc:
            await _status.abort(context, exc)
        return claim

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Req, Resp] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Req, Resp] | None:
        handler = await continuation(handler_call_details)
        if handler is None or not self.fences(handler_call_details.method):
            return handler
        metadata = handler_call_details.invocation_metadata
        fenced = _wrap(handler, lambda context: self.admit(metadata, context))
        # Outermost: a request that cannot be decoded is refused (INVALID_ARGUMENT
        # naming the field) before its claim is judged, so it never moves a fence.
        decoded = handlers.decoding(fenced, handler_call_details.method)
        return cast("grpc.RpcMethodHandler[Req, Resp]", decoded)


Admit = Callable[[Context], Awaitable[Claim | None]]


def _wrap(
    handler: grpc.RpcMethodHandler[Req, Resp], admit: Admit
) -> grpc.RpcMethodHandler[Req, Resp]:
    """The same handler, with ``admit`` run first and the claim current while it runs.

    On a grpc.aio server a behaviour may be a coroutine function, an async
    generator, or a plain function; the wrapper is always async and handles each.
    """
    kwargs: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        inner_uu: Callable[..., Any] = handler.unary_unary

        async def unary_unary(request: Any, context: Context) -> Any:
            claim = await admit(context)
            token = propagation.set_current(claim)
            try:
                return await _finish(inner_uu(request, context))
            finally:
                propagation.reset_current(token)

        return cast(
            "grpc.RpcMethodHandler[Req, Resp]",
            grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs),
        )
    if handler.stream_unary is not None:
        inner_su: Callable[..., Any] = handler.stream_unary

        async def stream_unary(requests: Any, context: Context) -> Any:
            claim = await admit(context)
            token = propagation.set_current(claim)
            try:
                return await _finish(inner_su(requests, context))
            finally:
                propagation.reset_current(token)

        return cast(
            "grpc.RpcMethodHandler[Req, Resp]",
            grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs),
        )

    inner_stream: Callable[..., Any] | None = handler.unary_stream or handler.stream_stream
    assert inner_stream is not None

    async def streaming(request_or_requests: Any, context: Context) -> AsyncIterator[Any]:
        claim = await admit(context)
        token = propagation.set_current(claim)
        try:
            result = inner_stream(request_or_requests, context)
            if hasattr(result, "__aiter__"):
                async for response in result:
                    yield response
            elif hasattr(result, "__iter__"):
                for response in result:
                    yield response
            else:  # a coroutine that writes with context.write()
                await _finish(result)
        finally:
            propagation.reset_current(token)

    if handler.unary_stream is not None:
        return cast(
            "grpc.RpcMethodHandler[Req, Resp]",
            grpc.unary_stream_rpc_method_handler(streaming, **kwargs),
        )
    return cast(
        "grpc.RpcMethodHandler[Req, Resp]",
        grpc.stream_stream_rpc_method_handler(streaming, **kwargs),
    )


__all__ = ["FenceInterceptor"]
