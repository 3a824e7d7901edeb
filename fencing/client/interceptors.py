"""Client interceptors that carry the current lease's token to your own gRPC services.

Inside ``hold(...)`` every call made through an intercepted channel gets the
metadata ``fencing-resource`` and ``fencing-token`` of the held lease (see
:mod:`fencing.propagation`); a call that already carries ``fencing-token`` is left
as it is, and outside any ``hold`` nothing is added. On the server,
:class:`guard.interceptor.FenceInterceptor` enforces the fence::

    channel = grpc.intercept_channel(grpc.insecure_channel(addr), TokenInterceptor())
    with leases.hold("ledger", ttl=10):
        ledger.Append(entry)                       # carries ledger's token

    channel = grpc.aio.insecure_channel(addr, interceptors=async_token_interceptors())
    async with leases.hold("ledger", ttl=10):
        await ledger.Append(entry)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import grpc
import grpc.aio

from fencing import propagation


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: Any


class _ClientCallDetails(_CallDetails, grpc.ClientCallDetails):
    """A concrete ``grpc.ClientCallDetails`` (the grpc package only has the ABC)."""


def _metadata_with_token(
    metadata: Any,
) -> list[tuple[str, str | bytes]] | None:
    """The call's metadata plus the current token, or None if there is nothing to add."""
    fenced = propagation.current()
    pairs = list(metadata or ())
    if fenced is None or propagation.has_token(pairs):
        return None
    return [*pairs, *propagation.to_metadata(fenced)]


def _sync_details(details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
    metadata = _metadata_with_token(details.metadata)
    if metadata is None:
        return details
    return _ClientCallDetails(
        details.method,
        details.timeout,
        metadata,
        details.credentials,
        getattr(details, "wait_for_ready", None),
        getattr(details, "compression", None),
    )


class TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """For ``grpc.intercept_channel``: adds the current lease's token to every call."""

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return continuation(_sync_details(client_call_details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return continuation(_sync_details(client_call_details), request)

    def intercept_stream_unary(
        self,
        continuation: Callable[..., Any],
        client_call_details: Any,
        request_iterator: Iterator[Any],
    ) -> Any:
        return continuation(_sync_details(client_call_details), request_iterator)

    def intercept_stream_stream(
        self,
        continuation: Callable[..., Any],
        client_call_details: Any,
        request_iterator: Iterator[Any],
    ) -> Any:
        return continuation(_sync_details(client_call_details), request_iterator)


def _aio_details(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    metadata = _metadata_with_token(details.metadata)
    if metadata is None:
        return details
    return grpc.aio.ClientCallDetails(
        details.method,
        details.timeout,
        grpc.aio.Metadata(*metadata),
        details.credentials,
        details.wait_for_ready,
    )


class _AioUnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(_aio_details(client_call_details), request)


class _AioUnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(_aio_details(client_call_details), request)


class _AioStreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(_aio_details(client_call_details), request_iterator)


class _AioStreamStream(grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(_aio_details(client_call_details), request_iterator)


def async_token_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """For ``grpc.aio.*_channel(..., interceptors=...)``: one interceptor per call type
    (grpc.aio registers an object for one type only), each adding the current token."""
    return [_AioUnaryUnary(), _AioUnaryStream(), _AioStreamUnary(), _AioStreamStream()]


__all__ = ["TokenInterceptor", "async_token_interceptors"]
