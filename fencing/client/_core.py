"""The I/O-free half of the SDK, shared by the sync and asyncio clients.

Request builders, response converters, the rules for retrying an acquire
(:class:`AcquirePlan`), for judging a failed renewal (:func:`renewal_failure`),
everything a lease handle knows without a network (:class:`LeaseBase`), and every
multi-step exchange written once as *steps* (:class:`LeaseSteps`, :func:`unary`):
a generator that yields what to do next (:class:`Call` this stub method with this
request and deadline, or :class:`Sleep`) and is sent back the reply, or has the
failure thrown in. The twins (``lease.py``/``async_lease.py``,
``guard.py``/``async_guard.py``, ``queue.py``/``async_queue.py``) only run those
steps (:mod:`fencing.client._calls`: one blocking loop, one awaiting loop), so a
rule such as "what leaving ``hold`` releases, within which deadline, and what a
refusal means" exists once, and both flavours follow it by construction.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, NamedTuple, Protocol, Self, TypeVar

import grpc
import grpc.aio

from fencing import _status
from fencing._backoff import Backoff
from fencing._renewal import RenewalPolicy, RenewalSchedule
from fencing.errors import (
    AcquireTimeoutError,
    BackendUnavailableError,
    DeadlineExceededError,
    FencingError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLost,
)
from fencing.limits import MAX_MESSAGE_BYTES, MAX_RENEW_MANY, MAX_WAIT_MS
from fencing.tls import UNIX_SCHEMES, TLSConfig, is_local_target
from fencing.types import (
    WATCH_LOG_KEY,
    WATCH_START_KEY,
    Delete,
    Fenced,
    LeaseState,
    Op,
    Put,
    Record,
)
from fencing.v1 import guard_pb2, lease_pb2

log = logging.getLogger("fencing.client")

#: A monotonic clock in seconds (``time.monotonic``; a fake in tests).
Clock = Callable[[], float]

#: Per-call deadline for calls that do not wait (seconds).
DEFAULT_RPC_TIMEOUT = 5.0
#: Retries of idempotent calls on transient failures: 50 ms doubling to 0.8 s, five
#: times at most, without jitter (a retry is one client's, not a crowd's).
RETRY_BACKOFF = Backoff(base=0.05, cap=0.8, factor=2.0, jitter=0.0, retries=5)
#: Retries after a refused connection (no server at the address, nothing sent): one
#: quick one for a server restarting on its port, not the whole backoff.
MAX_REFUSED_RETRIES = 1
#: Grants an acquire may see expire before their late reply could be renewed, before
#: it gives up: with a round trip longer than the ttl no grant can ever be kept.
MAX_LOST_ON_ARRIVAL = 3
#: Bound on the release that leaving ``hold``/``hold_many`` sends (seconds), retries
#: included: an unreachable server must not hang the exit (the lease expires anyway).
DEFAULT_RELEASE_TIMEOUT = 2.0


def channel_options(tls: TLSConfig | None = None) -> list[tuple[str, int | str]]:
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
    ]
    if tls is not None:
        options.extend(tls.channel_options())
    return options


def channel_credentials(
    target: str,
    *,
    tls: TLSConfig | None = None,
    token: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> grpc.ChannelCredentials | None:
    """What a client channel to ``target`` is secured with; None means plaintext.

    ``tls`` verifies the server (and presents a client certificate for mTLS);
    ``token`` is sent as ``authorization: Bearer <token>`` on every call, and only
    over TLS or to a loopback address (never in the clear across a network).
    ``credentials`` are taken as they are, for anything else.
    """
    if credentials is not None:
        if tls is not None or token:
            raise InvalidArgumentError(
                "give either credentials or tls/token, not both", field="credentials"
            )
        return credentials
    secure = tls.channel_credentials() if tls is not None else None
    if not token:
        return secure
    if secure is None:
        if not is_local_target(target):
            raise InvalidArgumentError(
                f"a bearer token is only sent over TLS or to a loopback address; "
                f"{target} needs tls=TLSConfig(...)",
                field="token",
            )
        unix = target.startswith(UNIX_SCHEMES)
        secure = grpc.local_channel_credentials(
            grpc.LocalConnectionType.UDS if unix else grpc.LocalConnectionType.LOCAL_TCP
        )
    return grpc.composite_channel_credentials(secure, grpc.access_token_call_credentials(token))


def open_channel(
    target: str,
    *,
    tls: TLSConfig | None = None,
    token: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> grpc.Channel:
    """A blocking channel to ``target``, secured as :func:`channel_credentials` says."""
    secure = channel_credentials(target, tls=tls, token=token, credentials=credentials)
    options = channel_options(tls)
    if secure is not None:
        return grpc.secure_channel(target, secure, options)
    return grpc.insecure_channel(target, options)


def open_aio_channel(
    target: str,
    *,
    tls: TLSConfig | None = None,
    token: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to ``target`` (create it in a running loop); see :func:`open_channel`."""
    secure = channel_credentials(target, tls=tls, token=token, credentials=credentials)
    options = channel_options(tls)
    if secure is not None:
        return grpc.aio.secure_channel(target, secure, options)
    return grpc.aio.insecure_channel(target, options)


def default_holder() -> str:
    """A holder name unique to this process: ``host-pid-random``."""
    return f"{socket.gethostname()[:64]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def new_request_id() -> str:
    """A fresh acquire's request id: 128 random bits as 32 hex digits (one per acquire,
    made on every call's path, so not a ``uuid.UUID`` object built and dropped)."""
    return secrets.token_hex(16)


def ttl_ms_of(ttl: float, field: str = "ttl") -> int:
    """Seconds (the SDK's unit) -> milliseconds (the wire's)."""
    if ttl <= 0:
        raise InvalidArgumentError(f"{field} must be positive seconds, got {ttl}", field=field)
    return round(ttl * 1000)


def renew_ttl_ms_of(ttl: float | None) -> int:
    """A renewal's ttl on the wire: None -> 0, which the server reads as the lease's own
    ttl (the one it was granted, or last renewed, with)."""
    return 0 if ttl is None else ttl_ms_of(ttl)


def release_timeout_of(seconds: float) -> float:
    """Check the ``release_timeout`` option (seconds, positive)."""
    if not seconds > 0:
        raise InvalidArgumentError(
            f"release_timeout must be positive seconds, got {seconds}", field="release_timeout"
        )
    return float(seconds)


def refused(exc: BaseException) -> bool:
    """No server accepted the connection; see :func:`fencing._status.refused`."""
    return _status.refused(exc)


def retry_fits(
    exc: FencingError, now: float, pause: float, last_attempt: float, end: float
) -> bool:
    """Whether one more attempt after ``exc`` fits a call's budget ending at ``end``.

    For BACKEND_UNAVAILABLE (the server answered: its store is down, and a store that
    times out takes as long every time) the pause plus an attempt as long as the last
    one must end before ``end``: the call fails within its budget, not a retry plan
    later. A passed deadline is not judged so: each attempt is bounded by its own
    deadline already, and a paused server must still see the retries that replay it."""
    if not isinstance(exc, BackendUnavailableError):
        return True
    return now + pause + last_attempt <= end


class Retries:
    """The retry decision of one idempotent call: transient failures only, after
    :data:`RETRY_BACKOFF`'s pauses up to its bound, a refused connection at most
    :data:`MAX_REFUSED_RETRIES` times, and BACKEND_UNAVAILABLE only while another attempt
    as long as the last one fits the call's budget ending at ``end`` (:func:`retry_fits`)."""

    def __init__(self, end: float) -> None:
        self._attempts = RETRY_BACKOFF.attempts()
        self._refusals = 0
        self._end = end

    def pause(self, exc: FencingError, now: float, last_attempt: float) -> float | None:
        """Seconds to pause before trying again after ``exc``, or None to give up."""
        if not is_transient(exc):
            return None
        pause = self._attempts.next()
        self._refusals += refused(exc)
        if pause is None or self._refusals > MAX_REFUSED_RETRIES:
            return None
        return pause if retry_fits(exc, now, pause, last_attempt, self._end) else None


def exit_release_pause(exc: FencingError, attempt: int, now: float, end: float) -> float | None:
    """After the exit's release failed: seconds to pause before the next try, or None
    to give up (not transient, out of retries, or the pause would pass ``end``)."""
    if not is_transient(exc) or not RETRY_BACKOFF.allows(attempt + 1):
        return None
    if refused(exc) and attempt >= MAX_REFUSED_RETRIES:  # attempt counts from 0
        return None
    pause = RETRY_BACKOFF.delay(attempt + 1, 0.0)
    return pause if now + pause < end else None


def wait_ms_of(remaining: float | None) -> int:
    """How long the server should wait in this Acquire call (capped at the server's limit)."""
    if remaining is None:
        return MAX_WAIT_MS
    return max(0, min(MAX_WAIT_MS, int(remaining * 1000)))


def translate(err: grpc.RpcError) -> Exception:
    """The SDK exception for a failed call (callers chain ``from err``)."""
    return _status.from_rpc_error(err)


def is_transient(exc: BaseException) -> bool:
    """Failures where the request may not have reached a decision: safe to retry idempotently."""
    return isinstance(exc, BackendUnavailableError | DeadlineExceededError)


# -- lease messages -------------------------------------------------------------------------


def acquire_request(
    resource: str, holder: str, ttl_ms: int, wait_ms: int, request_id: str
) -> lease_pb2.AcquireRequest:
    return lease_pb2.AcquireRequest(
        resource=resource, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms, request_id=request_id
    )


def renew_request(
    resource: str, token: int, ttl_ms: int, holder: str = ""
) -> lease_pb2.RenewRequest:
    return lease_pb2.RenewRequest(resource=resource, token=token, ttl_ms=ttl_ms, holder=holder)


def release_request(resource: str, token: int, holder: str = "") -> lease_pb2.ReleaseRequest:
    return lease_pb2.ReleaseRequest(resource=resource, token=token, holder=holder)


def describe_request(resource: str) -> lease_pb2.DescribeRequest:
    return lease_pb2.DescribeRequest(resource=resource)


def list_request(prefix: str, page_size: int, page_token: str) -> lease_pb2.ListRequest:
    return lease_pb2.ListRequest(prefix=prefix, page_size=page_size, page_token=page_token)


def watch_request(
    resource: str, prefix: str, after_revision: int | None, log_id: str = ""
) -> lease_pb2.WatchRequest:
    """None: from now; a revision (0 too: from the start of the log) is sent as set."""
    if after_revision is None:
        return lease_pb2.WatchRequest(resource=resource, prefix=prefix, log_id=log_id)
    if after_revision < 0:
        raise InvalidArgumentError(
            f"after_revision must be >= 0, got {after_revision}", field="after_revision"
        )
    return lease_pb2.WatchRequest(
        resource=resource, prefix=prefix, after_revision=after_revision, log_id=log_id
    )


@dataclass(frozen=True, slots=True)
class WatchStart:
    """Where an open ``watch`` stream starts, as its first headers say."""

    #: The revision the stream starts after: the server's head when the stream asked
    #: "from now" (resume from it if no event came yet); None if the server did not say.
    after_revision: int | None
    #: The identity of the server's event log, which revisions belong to ('' if none).
    log_id: str


def _header(headers: object, name: str) -> str | None:
    for key, value in headers or ():  # type: ignore[attr-defined]
        if key == name:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def watch_start(headers: object) -> WatchStart:
    """Read a Watch stream's initial metadata (``WATCH_START_KEY``, ``WATCH_LOG_KEY``)."""
    start = _header(headers, WATCH_START_KEY)
    return WatchStart(
        int(start) if start is not None and start.isdigit() else None,
        _header(headers, WATCH_LOG_KEY) or "",
    )


class AcquirePlan:
    """The rules of one ``acquire`` call, shared by both twins.

    One ``request_id`` for every attempt (a retry that reaches the server after the
    grant gets the same token back); how long to ask the server to wait in each
    attempt; and, after a failure, how long to pause before the next attempt or
    whether to give up. The twins loop::

        plan = AcquirePlan(...)
        while True:
            try:
                return send(plan.request())
            except FencingError as exc:
                pause = plan.retry_after(exc)   # may raise AcquireTimeoutError
                if pause is None:
                    raise
            sleep(pause)
    """

    def __init__(
        self,
        resource: str,
        holder: str,
        ttl: float,
        timeout: float | None,
        clock: Clock,
        *,
        nowait: bool = False,
        rpc_timeout: float = DEFAULT_RPC_TIMEOUT,
    ) -> None:
        self.resource = resource
        self.holder = holder
        self.ttl_ms = ttl_ms_of(ttl)
        self.request_id = new_request_id()
        self.nowait = nowait
        self._clock = clock
        self._end = None if timeout is None else clock() + max(0.0, timeout)
        self._retries: Retries | None = None  # from the first transient failure
        self._rpc_timeout = rpc_timeout
        self._sent_at = clock()  # when the last attempt was sent
        self._lost_on_arrival = 0

    def request(self) -> lease_pb2.AcquireRequest:
        """The next attempt's request (``wait_ms`` is what is left of the timeout)."""
        self._sent_at = self._clock()
        if self.nowait:
            wait_ms = 0
        else:
            wait_ms = wait_ms_of(None if self._end is None else max(0.0, self._end - self._clock()))
        return acquire_request(self.resource, self.holder, self.ttl_ms, wait_ms, self.request_id)

    def rpc_timeout(self, request: lease_pb2.AcquireRequest, cap: float) -> float:
        """The attempt's gRPC deadline: the server's wait plus an ordinary call's."""
        return request.wait_ms / 1000 + cap

    def _timed_out(self) -> bool:
        return self._end is not None and self._clock() >= self._end

    def retry_after(self, exc: FencingError) -> float | None:
        """Seconds to pause before trying again, or None to re-raise ``exc``.

        A held lease is asked for again at once (the server waited its maximum)
        until the timeout runs out, then :class:`AcquireTimeoutError` is raised.
        Transient failures are retried with backoff, within the timeout; after
        BACKEND_UNAVAILABLE only while another attempt as long as the last one fits
        the budget: the timeout, and at most ``rpc_timeout`` from the first transient
        failure's attempt (so an acquire that waits without end still fails fast when
        the server's store is down). A refused connection is retried once at most. A grant
        that expired before its late reply could be renewed (:class:`LeaseLost` from
        that renewal) is asked for again, within the timeout.
        """
        if isinstance(exc, LeaseLost):
            self._lost_on_arrival += 1
            if self.nowait or self._timed_out() or self._lost_on_arrival > MAX_LOST_ON_ARRIVAL:
                exc.add_note(
                    f"{self._lost_on_arrival} grant(s) of {self.resource!r} expired before "
                    "their reply could be used: is the round trip longer than the ttl?"
                )
                return None
            return 0.0
        if isinstance(exc, LeaseHeldError) and not self.nowait:
            if self._timed_out():
                raise AcquireTimeoutError(
                    # The held one (AcquireMany names which of its resources it was).
                    resource=exc.resource or self.resource,
                    holder=exc.holder,
                    remaining_ms=exc.remaining_ms,
                ) from None
            return 0.0
        if not is_transient(exc) or self._timed_out():
            return None
        if self._retries is None:  # the budget of transient retries starts now
            end = self._sent_at + self._rpc_timeout
            self._retries = Retries(end if self._end is None else min(end, self._end))
        now = self._clock()
        return self._retries.pause(exc, now, now - self._sent_at)


def unimplemented(exc: BaseException) -> bool:
    """True for a call the server does not have (an older server: fall back)."""
    code = getattr(exc, "code", None)
    return callable(code) and code() == grpc.StatusCode.UNIMPLEMENTED


def renewal_failure(exc: FencingError) -> str | None:
    """Why a failed renewal means the lease is lost, or None if it is worth retrying.

    Transient failures (the server unreachable, a deadline) are retried until the
    local deadline; anything else the server said is final.
    """
    if isinstance(exc, LeaseLost):
        return "renewal refused"
    if is_transient(exc):
        return None
    return f"renewal failed: {exc}"


def promise_note(target: str, fenced: Fenced) -> str:
    """The note added to the error of a guard that could not be fenced on acquire."""
    return (
        f"fencing guard {target} to token {fenced.token} of {fenced.resource!r} failed; "
        "the lease was released"
    )


class _Flag(Protocol):
    """``threading.Event`` or ``asyncio.Event``: what LeaseBase needs of ``lost``."""

    def is_set(self) -> bool: ...

    def set(self) -> None: ...


FlagT = TypeVar("FlagT", bound=_Flag)


class LeaseBase(Generic[FlagT]):
    """Everything a lease handle knows without a network, for both twins.

    ``resource``, ``holder``, ``token`` (the proof, judged only by guards), the
    renewal schedule on the injected monotonic clock, and local liveness: ``lost``
    (a ``threading.Event`` or an ``asyncio.Event``), set once the lease can no
    longer be trusted, with ``on_lost`` callbacks. ``released`` is set once this
    holder gave the lease up: a released lease is not lost (``lost`` stays clear and
    nothing marks it lost later), but it is no longer ours to act on. ``_guard``
    protects the schedule (a lock in the threaded twin, nothing in the asyncio one).

    The local deadline starts at the grant as the client can place it: the send
    time of the Acquire plus the wait the server reports (see
    :mod:`fencing._renewal`), so a lease that waited in line is not lost on arrival.
    """

    def __init__(
        self,
        msg: lease_pb2.Lease,
        sent_at: float,
        policy: RenewalPolicy,
        clock: Clock,
        lost: FlagT,
        guard: AbstractContextManager[object],
        *,
        received_at: float | None = None,
        ttl_ms: int | None = None,
    ) -> None:
        self.resource: str = msg.resource
        self.holder: str = msg.holder
        self.token: int = msg.token
        self.ttl_ms: int = msg.ttl_ms
        #: What renewals ask for: the ttl the acquire asked for (a replayed grant
        #: reports only what is left of it).
        self.renew_ttl_ms: int = ttl_ms or msg.ttl_ms
        self.lost: FlagT = lost
        self.released = False
        self.schedule = RenewalSchedule(
            msg.ttl_ms, sent_at, policy, waited_ms=msg.waited_ms, received_at=received_at
        )
        self._clock = clock
        self._guard = guard
        self._callbacks: list[Callable[[Self], object]] = []

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else "live"
        return (
            f"<{type(self).__name__} {self.resource!r} token={self.token} "
            f"holder={self.holder!r} {state}>"
        )

    def remaining(self) -> float:
        """Seconds until the local deadline (0 once lost or released)."""
        if self.lost.is_set() or self.released:
            return 0.0
        with self._guard:
            return self.schedule.remaining(self._clock())

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost or its local deadline has passed,
        or if it was released (then it is not lost, but no longer ours to act on)."""
        if not self.lost.is_set() and self._deadline_passed():
            self._mark_lost("local deadline passed")
        if self.lost.is_set():
            raise LeaseLost(resource=self.resource, token=self.token)
        if self.released:
            raise LeaseLost(
                f"lease on {self.resource!r} with token {self.token} was released",
                resource=self.resource,
                token=self.token,
            )

    def on_lost(self, callback: Callable[[Self], object]) -> None:
        """Call ``callback(lease)`` once when the lease is lost (now, if it already is)."""
        with self._guard:
            self._callbacks.append(callback)
            fire = self.lost.is_set()
        if fire:
            callback(self)

    # -- for the twins -----------------------------------------------------------------------

    def _deadline_passed(self) -> bool:
        if self.released:  # given up: nothing left to lose
            return False
        with self._guard:
            return self.schedule.expired(self._clock())

    def _due_on_arrival(self) -> bool:
        """The grant arrived with its first renewal already due (a late reply, or a
        server that does not report its wait): renew before handing it out."""
        with self._guard:
            return self.schedule.due_on_arrival(self._clock())

    def _next_sleep(self) -> float:
        """How long the keepalive sleeps before its next renewal (or the deadline)."""
        with self._guard:
            return self.schedule.sleep_for(self._clock())

    def _renewal(
        self, ttl: float | None, cap: float, *, on_arrival: bool = False
    ) -> tuple[int, float, float]:
        """Start a renewal: ``(ttl_ms, sent_at, rpc_timeout)``; raises if already lost.

        ``on_arrival``: the renewal of a grant not yet handed out, whose local deadline
        may have passed while the server still holds it: not checked, and given a
        whole call's time (the server judges whether it is still ours).
        """
        if not on_arrival:
            self.check()
        ttl_ms = ttl_ms_of(ttl) if ttl is not None else self.renew_ttl_ms
        sent_at = self._clock()
        with self._guard:
            timeout = cap if on_arrival else self.schedule.rpc_timeout(sent_at, cap)
        return ttl_ms, sent_at, timeout

    def _renewed(self, sent_at: float, msg: lease_pb2.Lease) -> None:
        with self._guard:
            self.schedule.renewed(sent_at, msg.ttl_ms)
            self.ttl_ms = msg.ttl_ms
            self.renew_ttl_ms = msg.ttl_ms

    def _renewal_due(self) -> bool:
        """The keepalive woke up to renew: False (the lease marked lost) if the local
        deadline passed before a renewal succeeded."""
        if self._deadline_passed():
            self._mark_lost("local deadline passed before a renewal succeeded")
            return False
        return True

    def _renewal_error(self, exc: Exception) -> bool:
        """Judge the keepalive's failed renewal; True when the keepalive must stop.

        Transient failures are retried sooner (never past the deadline); anything
        else marks the lease lost (a no-op when ``renew`` already did), including a
        crash, which is logged: the keepalive must never die silently.
        """
        if not isinstance(exc, FencingError):
            log.error("renewal of %s crashed", self.resource, exc_info=exc)
            self._mark_lost(f"renewal crashed: {exc}")
            return True
        why = renewal_failure(exc)
        if why is not None:
            self._mark_lost(why)
            return True
        log.info("renewal of %s failed, retrying: %s", self.resource, exc)
        with self._guard:
            self.schedule.failed(self._clock())
        return False

    def _mark_lost(self: Self, why: str, *, refused_release: bool = False) -> None:
        """Set ``lost`` once and run the callbacks. A released lease is not lost later
        (a renewal in flight refused after the release means nothing), unless the
        release itself was refused: then it had been lost before."""
        with self._guard:
            if self.lost.is_set() or (self.released and not refused_release):
                return
            self.lost.set()
            callbacks = list(self._callbacks)
        log.warning("lease lost resource=%s token=%d: %s", self.resource, self.token, why)
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("on_lost callback failed")


# -- steps: the exchanges written once, run by either twin ----------------------------------

T = TypeVar("T")


class Call(NamedTuple):
    """A step: call ``method`` (a stub's, blocking or asyncio) with ``request`` and a
    deadline of ``timeout`` seconds (None: the client's ``rpc_timeout``). The reply is
    sent back into the steps; a failure, as a :mod:`fencing.errors` exception, is
    thrown in."""

    method: Callable[..., Any]
    request: object
    timeout: float | None = None
    # A tuple, not a frozen dataclass: one is made per call, and that is cheaper.


class Sleep(NamedTuple):
    """A step: pause ``seconds`` (``time.sleep`` or ``asyncio.sleep``)."""

    seconds: float


#: An exchange as steps, returning ``T`` (see :mod:`fencing.client._calls` for the runners).
Steps = Generator[Call | Sleep, Any, T]


def unary(
    method: Callable[..., Any],
    request: object,
    timeout: float | None = None,
    *,
    retry: bool = False,
    budget: float = DEFAULT_RPC_TIMEOUT,
    clock: Clock = time.monotonic,
) -> Steps[Any]:
    """One unary call; with ``retry`` (an idempotent call), transient failures are tried
    again after :data:`RETRY_BACKOFF`'s pauses, up to its bound, while another attempt
    as long as the last one fits ``budget`` seconds (the client's ``rpc_timeout``)."""
    retries = Retries(clock() + budget) if retry else None
    while True:
        sent_at = clock()
        try:
            return (yield Call(method, request, timeout))
        except FencingError as exc:
            now = clock()
            pause = None if retries is None else retries.pause(exc, now, now - sent_at)
            if pause is None:
                raise
        yield Sleep(pause)


def hold_exit_error(
    leases: Sequence[LeaseBase[Any]], *, body_raised: bool, cancelled_by_loss: bool = False
) -> LeaseLost | None:
    """What leaving a ``hold``/``hold_many`` block raises, after its release: LeaseLost
    for the first lost lease, unless the body raised something of its own (a loss's
    own cancellation of the body, in the asyncio twin, is not the body's own)."""
    lost = [lease for lease in leases if lease.lost.is_set()]
    if not lost or (body_raised and not cancelled_by_loss):
        return None
    return LeaseLost(resource=lost[0].resource, token=lost[0].token)


L = TypeVar("L", bound=LeaseBase[Any])


class LeaseClientLike(Protocol):
    """What :class:`LeaseSteps` reads of a lease client (either twin), each time it
    needs it (so a changed ``rpc_timeout`` counts from the next call)."""

    target: str
    rpc_timeout: float
    release_timeout: float
    _clock: Clock

    @property
    def _stub(self) -> Any: ...


class LeaseSteps(Generic[L]):
    """The lease client's exchanges as steps: acquire (one or many, retried by
    :class:`AcquirePlan`), renewal on arrival, renew, release, release many, and
    the release on leaving ``hold``/``hold_many``.

    ``new_lease(msg, sent_at, received_at, ttl_ms)`` makes the twin's handle.
    """

    def __init__(
        self,
        client: LeaseClientLike,
        new_lease: Callable[[lease_pb2.Lease, float, float, int], L],
    ) -> None:
        self.client = client
        self._new_lease = new_lease

    def acquire(self, plan: AcquirePlan, resources: Sequence[str] | None = None) -> Steps[list[L]]:
        """Acquire ``plan.resource`` (``resources``: all of them, with AcquireMany) until
        granted or ``plan`` gives up; grants whose reply came too late to trust are
        renewed before they are handed out."""
        client = self.client
        while True:
            if resources is None:
                request: lease_pb2.AcquireRequest | lease_pb2.AcquireManyRequest = plan.request()
                method = client._stub.Acquire
            else:
                request = acquire_many_request(plan, resources)
                method = client._stub.AcquireMany
            sent_at = client._clock()
            try:
                reply = yield Call(method, request, request.wait_ms / 1000 + client.rpc_timeout)
                received_at = client._clock()
                grants = [reply] if resources is None else list(reply.leases)
                held = [self._new_lease(m, sent_at, received_at, plan.ttl_ms) for m in grants]
                if held and held[0]._due_on_arrival():
                    yield from self.renew_on_arrival(held)
                return held
            except FencingError as exc:
                pause = plan.retry_after(exc)
                if pause is None:
                    raise
            yield Sleep(pause)

    def renew_on_arrival(self, leases: Sequence[L]) -> Steps[None]:
        """Renew grants whose reply came too late to trust their first deadline.

        ``LeaseLost`` if any expired or was taken before the renewal reached the
        server (the others are released: an acquire is all or nothing), for the
        acquire to ask again; transient failures propagate to its retry.
        """
        client = self.client
        ttl_ms, sent_at, timeout = leases[0]._renewal(None, client.rpc_timeout, on_arrival=True)
        if len(leases) == 1:
            lease = leases[0]
            request = renew_request(lease.resource, lease.token, ttl_ms, lease.holder)
            lease._renewed(sent_at, (yield Call(client._stub.Renew, request, timeout)))
            return
        response = yield Call(client._stub.RenewMany, renew_on_arrival_request(leases), timeout)
        gone = [r.lost for r in response.results]
        if any(gone):
            yield from self.release_on_exit(
                [lease for lease, g in zip(leases, gone, strict=True) if not g]
            )
            lost = leases[gone.index(True)]
            raise LeaseLost(resource=lost.resource, token=lost.token)
        for lease, result in zip(leases, response.results, strict=True):
            lease._renewed(sent_at, result.lease)

    def renew(self, lease: L, ttl: float | None) -> Steps[None]:
        """``lease.renew(ttl)``: a refusal marks it lost (and is raised)."""
        client = self.client
        ttl_ms, sent_at, timeout = lease._renewal(ttl, client.rpc_timeout)
        request = renew_request(lease.resource, lease.token, ttl_ms, lease.holder)
        try:
            msg = yield Call(client._stub.Renew, request, timeout)
        except LeaseLost:
            lease._mark_lost("renewal refused")
            raise
        lease._renewed(sent_at, msg)

    def release(self, lease: L) -> Steps[None]:
        """``lease.release()``: released (not lost) once the server agrees; a refusal
        marks it lost (it had been lost before) and is raised; any other failure leaves
        it unreleased, for leaving ``hold`` to try again."""
        if lease.released:
            return
        lease.released = True
        request = release_request(lease.resource, lease.token, lease.holder)
        try:
            yield Call(self.client._stub.Release, request)
        except LeaseLost:
            lease._mark_lost("release refused", refused_release=True)
            raise
        except BaseException:
            lease.released = False
            raise

    def release_many(self, leases: Sequence[L]) -> Steps[list[L]]:
        """``release_many``: one call per 10,000; returns the refused (marked lost)."""
        refused: list[L] = []
        for chunk in chunked([lease for lease in leases if not lease.released]):
            msg = yield Call(self.client._stub.ReleaseMany, release_many_request(chunk))
            for lease, released in zip(chunk, msg.released, strict=True):
                lease.released = True
                if not released:
                    lease._mark_lost("release refused", refused_release=True)
                    refused.append(lease)
        return refused

    def release_on_exit(self, leases: Sequence[L]) -> Steps[None]:
        """Release what leaving ``hold``/``hold_many`` may still hold, lost or not.

        A lease believed lost may still be ours on the server (its local deadline is
        conservative, and a partition may have healed): the token-checked Release
        frees it for the next holder now instead of at its expiry, and is refused,
        harmlessly, if it was not ours any more. Bounded by ``release_timeout``,
        retries included; on failure the leases expire by themselves and the guard
        fences any late writer. A refusal marks a lease lost.
        """
        client = self.client
        pending = [lease for lease in leases if not lease.released]
        if not pending:
            return
        for lease in pending:
            lease.released = True
        end = client._clock() + client.release_timeout
        attempt = 0
        while True:
            timeout = max(0.001, end - client._clock())
            try:
                if len(pending) == 1:
                    lease = pending[0]
                    request = release_request(lease.resource, lease.token, lease.holder)
                    try:
                        yield Call(client._stub.Release, request, timeout)
                    except LeaseLost:
                        lease._mark_lost("release refused", refused_release=True)
                    return
                for chunk in chunked(pending):
                    msg = yield Call(client._stub.ReleaseMany, release_many_request(chunk), timeout)
                    for lease, released in zip(chunk, msg.released, strict=True):
                        if not released:
                            lease._mark_lost("release refused", refused_release=True)
                return
            except FencingError as exc:
                pause = exit_release_pause(exc, attempt, client._clock(), end)
                if pause is None:
                    log.warning("release of %d lease(s) on exit failed: %s", len(pending), exc)
                    return
            attempt += 1
            yield Sleep(pause)


def chunked(leases: Sequence[L], size: int = MAX_RENEW_MANY) -> list[list[L]]:
    return [list(leases[i : i + size]) for i in range(0, len(leases), size)]


def acquire_many_request(
    plan: AcquirePlan, resources: Sequence[str]
) -> lease_pb2.AcquireManyRequest:
    """The next AcquireMany attempt of ``plan`` (its request id, its wait) for ``resources``."""
    single = plan.request()
    return lease_pb2.AcquireManyRequest(
        resources=list(resources),
        holder=single.holder,
        ttl_ms=single.ttl_ms,
        wait_ms=single.wait_ms,
        request_id=single.request_id,
    )


def renew_on_arrival_request(leases: Sequence[L]) -> lease_pb2.RenewManyRequest:
    """One RenewMany for grants whose renewal was due when they arrived."""
    return lease_pb2.RenewManyRequest(
        renewals=[
            renew_request(lease.resource, lease.token, lease.renew_ttl_ms, lease.holder)
            for lease in leases
        ]
    )


def release_many_request(leases: Sequence[L]) -> lease_pb2.ReleaseManyRequest:
    return lease_pb2.ReleaseManyRequest(
        releases=[release_request(lease.resource, lease.token, lease.holder) for lease in leases]
    )


def lease_state(msg: lease_pb2.LeaseState) -> LeaseState:
    return LeaseState(
        msg.resource,
        msg.held,
        msg.holder,
        msg.token,
        msg.remaining_ms,
        msg.last_token,
        msg.ttl_ms,
    )


class EventKind(StrEnum):
    """What a watched lease did; RESYNC means "events were missed: re-read the state"."""

    ACQUIRED = "acquired"
    RENEWED = "renewed"
    RELEASED = "released"
    EXPIRED = "expired"
    RESYNC = "resync"


_EVENT_KINDS = {
    lease_pb2.LeaseEvent.ACQUIRED: EventKind.ACQUIRED,
    lease_pb2.LeaseEvent.RENEWED: EventKind.RENEWED,
    lease_pb2.LeaseEvent.RELEASED: EventKind.RELEASED,
    lease_pb2.LeaseEvent.EXPIRED: EventKind.EXPIRED,
    lease_pb2.LeaseEvent.RESYNC: EventKind.RESYNC,
}


@dataclass(frozen=True, slots=True)
class LeaseEvent:
    """One event of ``watch``. Resume a stream with ``after_revision=event.revision``
    (and the stream's ``log_id``). A RESYNC carries the ``log_id`` of the log the
    stream continues in, which later revisions belong to ('' if it has none)."""

    kind: EventKind
    resource: str
    token: int
    holder: str
    revision: int
    ttl_ms: int
    log_id: str = ""


def lease_event(msg: lease_pb2.LeaseEvent) -> LeaseEvent | None:
    """Convert a streamed event; None for a kind this SDK does not know (skip it)."""
    kind = _EVENT_KINDS.get(msg.kind)
    if kind is None:
        return None
    return LeaseEvent(
        kind, msg.resource, msg.token, msg.holder, msg.revision, msg.ttl_ms, msg.log_id
    )


# -- guard messages -------------------------------------------------------------------------


def op_to_proto(op: Op) -> guard_pb2.Op:
    if isinstance(op, Put):
        return guard_pb2.Op(put=guard_pb2.Put(key=op.key, value=op.value))
    if isinstance(op, Delete):
        return guard_pb2.Op(delete=guard_pb2.Delete(key=op.key))
    raise InvalidArgumentError(f"not an op: {op!r}", field="ops")


def write_request(
    fenced: Fenced, ops: Iterable[Op], idempotency_key: str = ""
) -> guard_pb2.WriteRequest:
    return guard_pb2.WriteRequest(
        resource=fenced.resource,
        token=fenced.token,
        ops=[op_to_proto(op) for op in ops],
        idempotency_key=idempotency_key,
    )


@dataclass(frozen=True, slots=True)
class WriteResult:
    """The fence after a write; ``replayed`` if an idempotency key matched an earlier one.

    A replay is answered only to a token that may write now (a stale one gets
    ``StaleTokenError``, whose ``key_applied``/``applied_by_token`` say whether and by
    whom the key was applied). ``replayed_by_token`` names the token that applied the
    recorded write: your own token means your earlier attempt landed; an older one
    means another holder's write with the same key did, and yours was not applied.
    """

    fence: int
    replayed: bool
    replayed_by_token: int = 0


def write_result(msg: guard_pb2.WriteResponse) -> WriteResult:
    return WriteResult(msg.fence, msg.replayed, msg.replayed_by_token)


def read_request(resource: str, key: str) -> guard_pb2.ReadRequest:
    return guard_pb2.ReadRequest(resource=resource, key=key)


def fence_request(fenced: Fenced) -> guard_pb2.FenceRequest:
    return guard_pb2.FenceRequest(resource=fenced.resource, token=fenced.token)


def describe_fence_request(resource: str) -> guard_pb2.DescribeFenceRequest:
    return guard_pb2.DescribeFenceRequest(resource=resource)


def read_result(msg: guard_pb2.ReadResponse) -> Record | None:
    return Record(msg.value, msg.written_by_token) if msg.found else None


def list_records_request(
    resource: str, prefix: str, page_size: int, page_token: str
) -> guard_pb2.ListRecordsRequest:
    return guard_pb2.ListRecordsRequest(
        resource=resource, prefix=prefix, page_size=page_size, page_token=page_token
    )


def key_records(msg: guard_pb2.ListRecordsResponse) -> list[tuple[str, Record]]:
    return [(r.key, Record(r.value, r.written_by_token)) for r in msg.records]


def ops_list(ops: Sequence[Op] | Op) -> list[Op]:
    return [ops] if isinstance(ops, Put | Delete) else list(ops)
