"""The server's edge: who is calling, may they, and how much at once. One interceptor.

Every call of every service passes :class:`AdmissionInterceptor` (health and
reflection are exempt). With authentication on it:

1. names the caller's principal from a bearer token or the mTLS client certificate
   (:mod:`serving.auth`), or ends the call ``UNAUTHENTICATED``;
2. finds the call's action (:data:`serving.auth.METHOD_ACTIONS`) and scope (the
   request's ``resource``, ``queue`` or ``prefix``) and ends it ``PERMISSION_DENIED``
   unless a grant of the principal covers both;
3. binds the request's ``holder`` to the principal, so a lease is held by the
   principal that acquired it and only that principal can renew or release it, even
   knowing its token (the backend checks the holder; a mismatch is ``LEASE_LOST``).

With or without authentication it then applies per-client caps: a *client* is the
principal, or the peer address (one connection) without authentication. A client
may have at most ``max_waiters`` Acquire calls with ``wait_ms > 0`` and at most
``max_watch_streams`` Watch streams in flight; beyond that a call ends at once with
``RESOURCE_EXHAUSTED`` (reason ``RESOURCE_EXHAUSTED``, metadata ``limit``), so one
client flooding the server cannot take every waiter slot from the others.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from fencing import _status
from fencing.errors import (
    FencingError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
)
from serving import handlers
from serving.auth import (
    EXEMPT_PREFIXES,
    LEASE_ACTIONS,
    METHOD_ACTIONS,
    PER_ITEM_METHODS,
    Action,
    AuthPolicy,
    Scope,
    bearer_token,
    bind_holder,
    certificate_identities,
    job_resources_of,
    scopes_of,
)

log = logging.getLogger(__name__)

#: Default caps per client.
DEFAULT_MAX_WAITERS = 64
DEFAULT_MAX_WATCH_STREAMS = 16
#: Default cap on the calls in flight on one lease Session stream.
DEFAULT_MAX_SESSION_IN_FLIGHT = 256

_principal: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "fencing_principal", default=None
)


def current_principal() -> str | None:
    """The authenticated principal of the call being handled (None with auth off)."""
    return _principal.get()


@dataclass(frozen=True)
class _Stream:
    """The edge of one :data:`~serving.auth.PER_ITEM_METHODS` call: it was authenticated
    (``principal``; None with authentication off) and each item is judged by the service."""

    admission: Admission
    metrics: EdgeMetrics
    method: str
    action: Action | None
    client: str
    principal: str | None
    peer: str


_stream: contextvars.ContextVar[_Stream | None] = contextvars.ContextVar(
    "fencing_stream_edge", default=None
)


def authorize_item(resource: str) -> None:
    """Inside a call of a :data:`~serving.auth.PER_ITEM_METHODS` method: raise
    ``PermissionDeniedError`` unless the caller's grants cover ``resource`` for the
    call's action. Does nothing with authentication off."""
    stream = _stream.get()
    if stream is not None and stream.principal is not None:
        stream.admission.check(stream.principal, stream.action, Scope(resource))


@contextmanager
def admit_call(method: str, request: Any) -> Iterator[None]:
    """Inside a call of a :data:`~serving.auth.PER_ITEM_METHODS` method: admit one call
    it carries exactly as the edge admits the unary ``method`` with ``request``
    (authorization of every resource, ``holder`` bound to the principal, the per-client
    caps held until the block ends), refused and counted and logged the same way: the
    ``FencingError`` is raised for the service to answer as that call's verdict.
    Outside such a stream (a servicer without the edge), admits everything."""
    stream = _stream.get()
    if stream is None:
        yield
        return
    with ExitStack() as stack:
        try:
            stream.admission.admit(
                stack, stream.client, stream.principal, method, METHOD_ACTIONS.get(method), request
            )
        except FencingError as exc:
            _refused(stream.metrics, method, stream.peer, exc)
            raise
        yield


def _refused(metrics: EdgeMetrics, method: str, peer: str, exc: FencingError) -> None:
    """Count and log a call the edge refuses."""
    # A flooding client is routine (INFO); a credential problem is not.
    level = logging.WARNING
    if isinstance(exc, ResourceExhaustedError):
        metrics.limit_rejections.labels(exc.limit).inc()
        level = logging.INFO
    else:
        metrics.auth_failures.labels(exc.reason.lower()).inc()
    log.log(
        level,
        "refused %s from %s: %s",
        method,
        peer,
        exc,
        extra={"method": method, "peer": peer, "reason": exc.reason},
    )


class EdgeMetrics:
    """Refusals at the edge, and the streams it admitted."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.auth_failures = Counter(
            "fencing_auth_failures_total",
            "Calls refused by authentication or authorization.",
            ("reason",),
            registry=registry,
        )
        self.limit_rejections = Counter(
            "fencing_client_limit_rejections_total",
            "Calls refused because the client hit a per-client cap.",
            ("limit",),
            registry=registry,
        )
        self.watch_streams = Gauge(
            "fencing_lease_watch_streams",
            "Watch streams open on this server.",
            registry=registry,
        )


class ClientSlots:
    """At most ``cap`` concurrent calls of one kind per client."""

    def __init__(self, limit: str, cap: int) -> None:
        self.limit = limit
        self.cap = cap
        self._held: dict[str, int] = {}

    @contextmanager
    def hold(self, client: str) -> Iterator[None]:
        count = self._held.get(client, 0)
        if count >= self.cap:
            raise ResourceExhaustedError(
                f"this client already has {count} {self.limit.replace('_', ' ')} in flight; "
                f"the limit is {self.cap} per client: wait for some to finish",
                limit=self.limit,
            )
        self._held[client] = count + 1
        try:
            yield
        finally:
            left = self._held[client] - 1
            if left:
                self._held[client] = left
            else:
                del self._held[client]


@dataclass
class Admission:
    """The edge's settings: the auth policy (None = auth off) and the per-client caps."""

    policy: AuthPolicy | None = None
    max_waiters: int = DEFAULT_MAX_WAITERS
    max_watch_streams: int = DEFAULT_MAX_WATCH_STREAMS

    def __post_init__(self) -> None:
        self.waiters = ClientSlots("waiters", self.max_waiters)
        self.watch_streams = ClientSlots("watch_streams", self.max_watch_streams)

    def authenticate(self, context: handlers.Context) -> str:
        """The caller's principal; ``UnauthenticatedError`` if there is none."""
        assert self.policy is not None
        token = bearer_token(context.invocation_metadata() or ())
        if token is not None:
            if not token:
                raise UnauthenticatedError(
                    "malformed authorization metadata: expected 'Bearer <token>'"
                )
            principal = self.policy.by_token(token)
            if principal is None:
                raise UnauthenticatedError("unknown bearer token")
            return principal
        identities = certificate_identities(context.auth_context())
        if not identities:
            raise UnauthenticatedError(
                "no credentials: send a bearer token or present a client certificate"
            )
        principal = self.policy.by_identities(identities)
        if principal is None:
            raise UnauthenticatedError(
                f"certificate identity {identities[0]!r} is not a principal of the auth policy"
            )
        return principal

    def authorize(self, principal: str, method: str, action: Action | None, request: Any) -> None:
        """``PermissionDeniedError`` unless a grant covers the call; binds ``holder``.

        A :data:`~serving.auth.PER_ITEM_METHODS` stream is only authenticated here: the
        service judges each item (:func:`authorize_item`, :func:`admit_call`)."""
        assert self.policy is not None
        if action is None:
            raise PermissionDeniedError(f"{method} is not covered by the auth policy")
        if method in PER_ITEM_METHODS:
            return
        scopes = scopes_of(request) if request is not None else [Scope("", is_prefix=True)]
        for scope in scopes:
            self.check(principal, action, scope)
        if request is not None:
            for scope in job_resources_of(request):
                for needed in LEASE_ACTIONS:
                    self.check(principal, needed, scope)
            bind_holder(request, principal)

    def check(self, principal: str, action: Action | None, scope: Scope) -> None:
        """``PermissionDeniedError`` unless a grant of ``principal`` covers ``action`` on
        ``scope`` (no action: a method the policy does not cover)."""
        assert self.policy is not None
        if action is None:
            raise PermissionDeniedError(f"{scope} is not covered by the auth policy")
        if not self.policy.allows(principal, action, scope):
            raise PermissionDeniedError(f"principal {principal!r} may not {action} {scope}")

    def admit(
        self,
        stack: ExitStack,
        client: str,
        principal: str | None,
        method: str,
        action: Action | None,
        request: Any,
    ) -> ClientSlots | None:
        """Authorize a call (with authentication on: ``principal`` is set) and hold its
        per-client slot on ``stack``; raises the refusal. Returns the slots held."""
        if principal is not None:
            self.authorize(principal, method, action, request)
        slots = self.slots_for(action, request)
        if slots is not None:
            stack.enter_context(slots.hold(client))
        return slots

    def slots_for(self, action: Action | None, request: Any) -> ClientSlots | None:
        if action is Action.ACQUIRE and request is not None and request.wait_ms > 0:
            return self.waiters
        if action is Action.WATCH:
            return self.watch_streams
        return None


class AdmissionInterceptor(handlers.HandlerInterceptor):
    """Applies an :class:`Admission` to every call (see the module docstring)."""

    def __init__(self, admission: Admission, metrics: EdgeMetrics) -> None:
        self.admission = admission
        self.metrics = metrics

    def applies(self, method: str) -> bool:
        return not method.startswith(EXEMPT_PREFIXES)

    def wrap(self, handler: handlers.Handler, method: str) -> handlers.Handler:
        admission = self.admission
        metrics = self.metrics
        action = METHOD_ACTIONS.get(method)

        @asynccontextmanager
        async def admit(request: Any, context: handlers.Context) -> AsyncIterator[None]:
            with ExitStack() as stack:
                try:
                    principal = None
                    if admission.policy is not None:
                        principal = client = admission.authenticate(context)
                    else:
                        client = context.peer()
                    slots = admission.admit(stack, client, principal, method, action, request)
                    if principal is not None:
                        _principal.set(principal)
                except FencingError as exc:
                    _refused(metrics, method, context.peer(), exc)
                    await _status.abort(context, exc)
                if method in PER_ITEM_METHODS:
                    peer = context.peer()
                    _stream.set(
                        _Stream(admission, metrics, method, action, client, principal, peer)
                    )
                if slots is admission.watch_streams:
                    stack.enter_context(metrics.watch_streams.track_inprogress())
                yield

        return handlers.around(handler, admit)


__all__ = [
    "DEFAULT_MAX_SESSION_IN_FLIGHT",
    "DEFAULT_MAX_WAITERS",
    "DEFAULT_MAX_WATCH_STREAMS",
    "Admission",
    "AdmissionInterceptor",
    "ClientSlots",
    "EdgeMetrics",
    "admit_call",
    "authorize_item",
    "current_principal",
]
