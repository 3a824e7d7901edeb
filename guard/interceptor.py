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

import logging
from collections.abc import AsyncIterator, Collection, Iterable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import grpc.aio

from fencing import _status, propagation
from fencing.errors import FencingError, InvalidArgumentError, StaleTokenError
from fencing.types import Claim
from guard.stores.base import GuardStore
from serving import handlers

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


class FenceInterceptor(handlers.HandlerInterceptor):
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
        self, metadata: Iterable[tuple[str, str | bytes]] | None, context: Context
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

    def applies(self, method: str) -> bool:
        return self.fences(method)

    def wrap(self, handler: handlers.Handler, method: str) -> handlers.Handler:
        """``handler`` with the claim admitted first and current while it runs."""

        @asynccontextmanager
        async def admitted(request: Any, context: Context) -> AsyncIterator[None]:
            claim = await self.admit(context.invocation_metadata(), context)
            token = propagation.set_current(claim)
            try:
                yield
            finally:
                propagation.reset_current(token)

        # Outermost: a request that cannot be decoded is refused (INVALID_ARGUMENT
        # naming the field) before its claim is judged, so it never moves a fence.
        return handlers.decoding(handlers.around(handler, admitted), method)


__all__ = ["FenceInterceptor"]
