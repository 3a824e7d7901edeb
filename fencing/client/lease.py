"""``LeaseClient``: acquire, renew and release leases; ``hold`` keeps one alive (blocking).

Liveness is kept apart from proof: the :class:`Lease` handle knows whether it still
*believes* it holds the lease (``lost``, ``check()``), but only a guard judges the
token. Renewal runs in a background thread every ttl/3, measured from each send on
the monotonic clock, and marks the lease lost when a renewal is refused or the local
deadline (send time + ttl - margin) passes, whichever comes first.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType

import grpc

from fencing._renewal import RenewalPolicy, RenewalSchedule
from fencing.client import _core
from fencing.client._core import LeaseState
from fencing.errors import AcquireTimeoutError, FencingError, LeaseHeldError, LeaseLost
from fencing.tls import TLSConfig
from fencing.v1 import lease_pb2, lease_pb2_grpc

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class Lease:
    """A granted lease: ``resource``, ``holder``, ``token`` (the proof) and local liveness.

    ``lost`` is a :class:`threading.Event` set once the lease can no longer be
    trusted; :meth:`check` raises :class:`LeaseLost` from then on (and also as soon as
    the local deadline passes, even before the renewal thread notices).
    """

    def __init__(
        self,
        client: LeaseClient,
        msg: lease_pb2.Lease,
        sent_at: float,
        policy: RenewalPolicy,
        clock: Clock,
    ) -> None:
        self.resource: str = msg.resource
        self.holder: str = msg.holder
        self.token: int = msg.token
        self.ttl_ms: int = msg.ttl_ms
        self.lost = threading.Event()
        self.released = False
        self._client = client
        self._clock = clock
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[Lease], None]] = []
        self.schedule = RenewalSchedule(msg.ttl_ms, sent_at, policy)

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else "live"
        return f"<Lease {self.resource!r} token={self.token} holder={self.holder!r} {state}>"

    def remaining(self) -> float:
        """Seconds until the local deadline (0 once lost)."""
        if self.lost.is_set():
            return 0.0
        with self._lock:
            return self.schedule.remaining(self._clock())

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost or its local deadline has passed."""
        if not self.lost.is_set():
            with self._lock:
                expired = self.schedule.expired(self._clock())
            if expired:
                self._mark_lost("local deadline passed")
        if self.lost.is_set():
            raise LeaseLost(resource=self.resource, token=self.token)

    def on_lost(self, callback: Callable[[Lease], None]) -> None:
        """Call ``callback(lease)`` once, from the renewal thread, when the lease is lost."""
        with self._lock:
            self._callbacks.append(callback)
            fire = self.lost.is_set()
        if fire:
            callback(self)

    def _mark_lost(self, why: str) -> None:
        with self._lock:
            if self.lost.is_set():
                return
            self.lost.set()
            callbacks = list(self._callbacks)
        log.warning("lease lost resource=%s token=%d: %s", self.resource, self.token, why)
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("on_lost callback failed")

    def renew(self, ttl: float | None = None) -> None:
        """Renew now (``ttl`` seconds, default the granted ttl); ``LeaseLost`` if refused."""
        self.check()
        ttl_ms = _core.ttl_ms_of(ttl) if ttl is not None else round(self.schedule.ttl * 1000)
        sent_at = self._clock()
        with self._lock:
            timeout = self.schedule.rpc_timeout(sent_at, self._client.rpc_timeout)
        try:
            msg = self._client._renew(self, ttl_ms, timeout)
        except LeaseLost:
            self._mark_lost("renewal refused")
            raise
        with self._lock:
            self.schedule.renewed(sent_at, msg.ttl_ms)

    def release(self) -> None:
        """Give the lease up now; ``LeaseLost`` if it was no longer ours."""
        if self.released:
            return
        self.released = True
        try:
            self._client._release(self)
        except LeaseLost:
            self._mark_lost("release refused")
            raise
        finally:
            self.lost.set()


class _KeepAlive(threading.Thread):
    """Renews one lease until stopped or lost."""

    def __init__(self, lease: Lease) -> None:
        super().__init__(name=f"fencing-keepalive-{lease.resource}", daemon=True)
        self.lease = lease
        self.stopping = threading.Event()

    def run(self) -> None:
        lease = self.lease
        while not self.stopping.is_set() and not lease.lost.is_set():
            with lease._lock:
                delay = lease.schedule.sleep_for(lease._clock())
            if self.stopping.wait(delay):
                return
            now = lease._clock()
            with lease._lock:
                expired = lease.schedule.expired(now)
            if expired:
                lease._mark_lost("local deadline passed before a renewal succeeded")
                return
            try:
                lease.renew()
            except LeaseLost:
                return
            except FencingError as exc:
                if not _core.is_transient(exc):
                    lease._mark_lost(f"renewal failed: {exc}")
                    return
                log.info("renewal of %s failed, retrying: %s", lease.resource, exc)
                with lease._lock:
                    lease.schedule.failed(lease._clock())
            except Exception as exc:  # the thread must never die silently
                log.exception("renewal of %s crashed", lease.resource)
                lease._mark_lost(f"renewal crashed: {exc}")
                return


class LeaseClient:
    """A blocking client of ``fencing.v1.LeaseService``.

    ::

        leases = LeaseClient("127.0.0.1:50051")
        with leases.hold("orders", ttl=10) as lease:   # renewed every ttl/3
            guard.put(lease, "k", b"v")                # fenced by lease.token
            lease.check()                              # LeaseLost once it is gone

    ``holder`` names this client in leases (default: host-pid-random); a server with
    authentication on names the holder after the caller's principal instead. Times
    are seconds. Acquire retries on transient failures with one ``request_id``, so a
    retry never takes a second token.

    ``tls=TLSConfig(ca=..., cert=..., key=...)`` secures the channel (mTLS with a
    cert), ``token=...`` authenticates every call with a bearer token, or pass any
    ``credentials``.
    """

    def __init__(
        self,
        target: str,
        *,
        holder: str | None = None,
        tls: TLSConfig | None = None,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        rpc_timeout: float = _core.DEFAULT_RPC_TIMEOUT,
        policy: RenewalPolicy | None = None,
        clock: Clock = time.monotonic,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.target = target
        self.holder = holder or _core.default_holder()
        self.rpc_timeout = rpc_timeout
        self.policy = policy or RenewalPolicy()
        self._clock = clock
        if channel is not None:
            self._channel = channel
        else:
            secure = _core.channel_credentials(
                target, tls=tls, token=token, credentials=credentials
            )
            options = _core.channel_options(tls)
            if secure is not None:
                self._channel = grpc.secure_channel(target, secure, options)
            else:
                self._channel = grpc.insecure_channel(target, options)
        self._stub = lease_pb2_grpc.LeaseServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> LeaseClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- acquiring ---------------------------------------------------------------------------

    def acquire(self, resource: str, ttl: float, timeout: float | None = None) -> Lease:
        """Acquire ``resource`` for ``ttl`` seconds, waiting up to ``timeout`` (None: forever).

        Raises :class:`AcquireTimeoutError` (a ``TimeoutError`` and a ``LeaseHeldError``)
        when the timeout runs out. The returned lease is *not* renewed: use :meth:`hold`
        or call ``lease.renew()``.
        """
        ttl_ms = _core.ttl_ms_of(ttl)
        request_id = _core.new_request_id()
        end = None if timeout is None else self._clock() + max(0.0, timeout)
        attempt = 0
        while True:
            remaining = None if end is None else max(0.0, end - self._clock())
            wait_ms = _core.wait_ms_of(remaining)
            try:
                return self._acquire_once(resource, ttl_ms, wait_ms, request_id)
            except LeaseHeldError as exc:
                if end is not None and self._clock() >= end:
                    raise AcquireTimeoutError(
                        resource=resource, holder=exc.holder, remaining_ms=exc.remaining_ms
                    ) from None
                # The server waited its maximum; ask again with the same request id.
            except FencingError as exc:
                if not _core.is_transient(exc) or attempt >= len(_core.RETRY_BACKOFF):
                    raise
                if end is not None and self._clock() >= end:
                    raise
                time.sleep(_core.RETRY_BACKOFF[attempt])
                attempt += 1

    def acquire_nowait(self, resource: str, ttl: float) -> Lease:
        """Acquire only if free now; :class:`LeaseHeldError` at once otherwise."""
        ttl_ms = _core.ttl_ms_of(ttl)
        request_id = _core.new_request_id()
        for attempt in range(len(_core.RETRY_BACKOFF) + 1):
            try:
                return self._acquire_once(resource, ttl_ms, 0, request_id)
            except FencingError as exc:
                if not _core.is_transient(exc) or attempt == len(_core.RETRY_BACKOFF):
                    raise
                time.sleep(_core.RETRY_BACKOFF[attempt])
        raise AssertionError("unreachable")  # pragma: no cover

    def _acquire_once(self, resource: str, ttl_ms: int, wait_ms: int, request_id: str) -> Lease:
        request = _core.acquire_request(resource, self.holder, ttl_ms, wait_ms, request_id)
        sent_at = self._clock()
        try:
            msg = self._stub.Acquire(request, timeout=wait_ms / 1000 + self.rpc_timeout)
        except grpc.RpcError as err:
            raise _core.translate(err) from err
        return Lease(self, msg, sent_at, self.policy, self._clock)

    @contextlib.contextmanager
    def hold(
        self,
        resource: str,
        ttl: float,
        *,
        timeout: float | None = None,
        on_lost: Callable[[Lease], None] | None = None,
    ) -> Iterator[Lease]:
        """Acquire, keep renewed in a background thread, and release on exit.

        If the lease is lost while the block runs, ``lease.lost`` is set, ``on_lost``
        is called, ``lease.check()`` raises, and the block ends with :class:`LeaseLost`
        (unless it raised something else). Python cannot interrupt the block from
        outside: call ``lease.check()`` between steps, and let the guard reject what a
        paused holder sends late.
        """
        lease = self.acquire(resource, ttl, timeout)
        if on_lost is not None:
            lease.on_lost(on_lost)
        keepalive = _KeepAlive(lease)
        keepalive.start()
        body_failed = False
        try:
            yield lease
        except BaseException:
            body_failed = True
            raise
        finally:
            keepalive.stopping.set()
            keepalive.join()
            was_lost = lease.lost.is_set()
            if not was_lost:
                try:
                    lease.release()
                except LeaseLost:
                    was_lost = True
                except FencingError as exc:
                    # The lease expires by itself; the guard fences any late writer.
                    log.warning("release of %s failed: %s", resource, exc)
            if was_lost and not body_failed:
                raise LeaseLost(resource=lease.resource, token=lease.token)

    # -- the other calls ---------------------------------------------------------------------

    def _renew(self, lease: Lease, ttl_ms: int, timeout: float) -> lease_pb2.Lease:
        request = lease_pb2.RenewRequest(
            resource=lease.resource, token=lease.token, ttl_ms=ttl_ms, holder=lease.holder
        )
        try:
            return self._stub.Renew(request, timeout=timeout)
        except grpc.RpcError as err:
            raise _core.translate(err) from err

    def _release(self, lease: Lease) -> None:
        request = lease_pb2.ReleaseRequest(
            resource=lease.resource, token=lease.token, holder=lease.holder
        )
        try:
            self._stub.Release(request, timeout=self.rpc_timeout)
        except grpc.RpcError as err:
            raise _core.translate(err) from err

    def describe(self, resource: str) -> LeaseState:
        """Who holds ``resource`` now, with which token, and the last token ever issued."""
        try:
            msg = self._stub.Describe(
                lease_pb2.DescribeRequest(resource=resource), timeout=self.rpc_timeout
            )
        except grpc.RpcError as err:
            raise _core.translate(err) from err
        return _core.lease_state(msg)

    def renew(self, resource: str, token: int, ttl: float) -> int:
        """Renew by (resource, token) without a handle; returns the granted ttl in ms."""
        request = lease_pb2.RenewRequest(
            resource=resource, token=token, ttl_ms=_core.ttl_ms_of(ttl)
        )
        try:
            return self._stub.Renew(request, timeout=self.rpc_timeout).ttl_ms
        except grpc.RpcError as err:
            raise _core.translate(err) from err

    def release(self, resource: str, token: int) -> None:
        """Release by (resource, token) without a handle."""
        try:
            self._stub.Release(
                lease_pb2.ReleaseRequest(resource=resource, token=token), timeout=self.rpc_timeout
            )
        except grpc.RpcError as err:
            raise _core.translate(err) from err
