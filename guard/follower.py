"""Watch mode: the guard follows the lease server's event stream and fences by itself (G4).

A :class:`LeaseFollower` runs inside the guard (``--fence-mode watch --lease-addr
ADDR``). It keeps one ``Watch`` stream open on a prefix (default: every resource)
and advances the store's fences through the ordinary ``GuardStore.fence`` (the
promise; it never lowers a fence):

- ACQUIRED(t) and RENEWED(t): fence to t (t is the live token: every older one is dead);
- RELEASED(t) and EXPIRED(t): fence to t + 1 (t is dead too; the next grant is >= t + 1).

So a former holder is rejected from the moment its successor's grant (or its own
expiry) reaches the guard, even before the successor writes. What is left open
is the delivery delay of the event (and, for EXPIRED, the sweeper's <= ~100 ms).

**Resuming.** The follower remembers the last revision it applied and reconnects
after any failure with exponential backoff (50 ms doubling to 5 s, jittered),
asking for ``after_revision`` = that revision, so a restart of the lease server
(or a switch to another server on the same backend) misses nothing the log still
holds. A revision means something only in the log it came from, so the follower
also sends the log's identity (``log_id``, learned from the stream's first headers):
a server whose log is another one answers RESYNC instead of serving the same number
from the wrong log.

**Its own cursor.** The revision is also stored, at most every second and on stop,
as the fence of a reserved resource name that no request can use (it starts with a
control character) and that names what this guard follows: the lease server's log
identity and the prefix (:func:`cursor_resource`). So several guards can share one
store, on different prefixes or different lease servers, and a restarted guard
resumes from its own cursor, never from another guard's (which may be past its own
takeovers). On its first stream after a start the follower learns the log's identity
from the headers, reads its cursor for that log and prefix, and reopens the stream
after it. Guards with the same lease server and prefix on one store (replicas of one
guard) share a cursor, which is right: fences are shared too, and a cursor only goes
up once its events are applied to the store. Only the ``GuardStore`` Protocol is
needed for that. A store written by an older guard, which kept one cursor per store
(:data:`SHARED_CURSOR`), is resumed from that one once, when no cursor of its own
exists yet: never later than starting from now would be.

**RESYNC.** If the log no longer holds the revision (pruned, or the cursor belongs
to another log), the server sends RESYNC and continues live. The follower then
re-reads, with Describe, the resources it has fenced in this run (at most
``MAX_KNOWN`` of them) and fences each to the live token, or past the last token
if none is live. Resources it knows nothing about are left as they are: fences
only ever go up, so nothing is lost; for such a resource the guard is back to the
monotonic rule until its next event arrives.

**Tokens nobody was granted.** The follower also remembers, per resource of its
prefix, the highest token it has seen granted (from events, and from the lease
server's answers below). A write or ``Fence`` with a higher token is either a grant
whose event is still in delivery or a token nobody was granted; the guard cannot
tell them apart by itself, so before it admits such a token it asks the lease server
(:meth:`LeaseFollower.vouch`: ``Describe(resource).last_token``, one call in flight
per resource however many writes wait on it) and refuses one above that counter with
``LEASE_LOST`` (the token is not, and never was, a current lease): one bad client
cannot raise a fence to 2**63 - 1 and lock every real holder out. A real fresh grant
costs one ``Describe`` at the guard's first write of it, and is admitted before its
event arrives. While the lease server cannot be asked, such a token is refused with
``BACKEND_UNAVAILABLE`` (retry); tokens the guard has seen granted are judged as
always. Resources outside the prefix are not followed, so not vouched for either:
they keep the monotonic rule alone. That is where a job's default resources
(``job/<queue>/<id>``) belong: the queue's claim tokens are its own, not in the lease
server's log, so a watch guard that also fences such job effects follows a prefix that
leaves them out. (A job naming its own resource holds the lease on it: its tokens are
the lease's, in the log.)

**Disconnected.** While the stream is down the guard keeps serving and still
enforces the monotonic rule (token >= fence) on every write (a token above those
seen granted is still asked about, as above), but fences no longer move on
takeovers. It says so: a warning in the log at each disconnect,
:attr:`LeaseFollower.status` (``state`` is ``"following"`` only while a stream is
open), and the guard's own health entry ``fencing.v1.GuardService/watch``
(NOT_SERVING while disconnected; the guard's other entries stay SERVING).
A stream counts as open once the server said where it starts (its headers) or sent
an event: a call the lease server refused at once (no credentials, no ``watch``
grant) is a failed attempt, so reconnects back off instead of looping. Why it is not
following is in ``status.last_error`` (the lease server's reason first, e.g.
``UNAUTHENTICATED: ...``, with a hint for a credential problem), in the health entry's
reason (``fencing healthcheck`` prints it), in the warning logged, and in the
``BACKEND_UNAVAILABLE`` of a write whose token it cannot vouch for.

**Credentials.** With auth on at the lease server the guard needs its own principal
there, allowed ``watch`` and ``describe`` on the prefix: a bearer token
(``--lease-token``) and/or TLS with a client certificate (``--lease-tls-ca``,
``--lease-tls-cert``, ``--lease-tls-key``), by flag, ``FENCING_LEASE_*`` or the TOML file.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import grpc
import grpc.aio

from fencing._backoff import Backoff
from fencing.client import _core
from fencing.client._core import EventKind, LeaseEvent
from fencing.client.async_lease import AsyncLeaseClient, AsyncWatchStream
from fencing.errors import BackendUnavailableError, FencingError, LeaseLost, StaleTokenError
from fencing.tls import TLSConfig
from guard.stores.base import GuardStore

log = logging.getLogger(__name__)

#: The guard's health entry for the follower (the lead may expose it elsewhere too).
HEALTH_SERVICE = "fencing.v1.GuardService/watch"
#: Where older guards kept the last applied revision, one per store whatever they
#: followed: read once, as a starting point, when a guard has no cursor of its own yet.
SHARED_CURSOR = "\x1ffencing-watch-revision"
#: Resources remembered for a RESYNC re-read.
MAX_KNOWN = 100_000
#: Seconds between writes of the cursor to the store.
CURSOR_SAVE_INTERVAL = 1.0
INITIAL_BACKOFF = 0.05
MAX_BACKOFF = 5.0
#: Reconnects: doubling from 50 ms to 5 s, jittered down by up to half so that many
#: guards do not reconnect in step; never giving up.
RECONNECT_BACKOFF = Backoff(base=INITIAL_BACKOFF, cap=MAX_BACKOFF, factor=2.0, jitter=0.5)

State = Literal["connecting", "following", "disconnected", "stopped"]


def cursor_resource(log_id: str, prefix: str) -> str:
    """The reserved fence name under which a guard following ``prefix`` of the log
    ``log_id`` keeps its cursor. No request can name it: limits reject control
    characters in resource names. (``log_id`` is empty for a server that sends none.)"""
    return f"\x1ffencing-watch\x1f{log_id}\x1f{prefix}"


def fence_for(event: LeaseEvent) -> int | None:
    """The fence an event calls for, or None (RESYNC, or an unknown kind)."""
    if event.kind in (EventKind.ACQUIRED, EventKind.RENEWED):
        return event.token
    if event.kind in (EventKind.RELEASED, EventKind.EXPIRED):
        return event.token + 1
    return None


def _from_lease_server(exc: FencingError) -> bool:
    """Whether ``exc`` is the lease server's answer (the client's translation of a
    failed call, the ``grpc.RpcError`` its cause) rather than the store's."""
    return isinstance(exc.__cause__, grpc.RpcError)


#: What to do about the lease server's refusals of the guard's own calls.
_CREDENTIAL_HINTS = {
    "UNAUTHENTICATED": (
        "give the guard its credentials to the lease server: --lease-token "
        "(FENCING_LEASE_TOKEN) or a client certificate (--lease-tls-cert/--lease-tls-key)"
    ),
    "PERMISSION_DENIED": (
        "grant the guard's principal watch and describe on the followed prefix in the "
        "lease server's auth policy"
    ),
}


def refusal(exc: FencingError) -> str:
    """Why a call to the lease server failed, its reason first, with what to do about a
    credential problem (the follower's ``last_error``, logs, write errors)."""
    hint = _CREDENTIAL_HINTS.get(exc.reason)
    text = f"{exc.reason}: {exc}"
    return f"{text}; {hint}" if hint else text


def reconnect_delay(attempt: int, rng: Callable[[], float] = random.random) -> float:
    """Seconds before reconnect ``attempt`` (0-based) under :data:`RECONNECT_BACKOFF`;
    ``rng() == 1`` gives the whole delay, ``0`` half of it."""
    return RECONNECT_BACKOFF.delay(attempt + 1, 1.0 - rng())


@dataclass(frozen=True, slots=True)
class FollowerStatus:
    """What the follower is doing, for logs, health and metrics."""

    state: State
    lease_server: str
    prefix: str
    #: The last revision applied (0: none yet in this run and none stored).
    revision: int = 0
    events_applied: int = 0
    resyncs: int = 0
    #: Streams lost after they were open (failed reconnect attempts are not counted).
    disconnects: int = 0
    #: Why the last stream ended or could not be opened ('' while following).
    last_error: str = ""
    #: ``time.monotonic()`` when ``state`` last changed.
    since: float = field(default_factory=time.monotonic)

    @property
    def following(self) -> bool:
        return self.state == "following"


class LeaseFollower:
    """Follows ``Watch(prefix)`` on ``lease_server`` and fences ``store`` accordingly."""

    def __init__(
        self,
        store: GuardStore,
        lease_server: str,
        *,
        prefix: str = "",
        credentials: grpc.ChannelCredentials | None = None,
        tls: TLSConfig | None = None,
        token: str | None = None,
        on_state: Callable[[FollowerStatus], Awaitable[None]] | None = None,
        rpc_timeout: float = _core.DEFAULT_RPC_TIMEOUT,
    ) -> None:
        self.store = store
        self.lease_server = lease_server
        self.prefix = prefix
        self.rpc_timeout = rpc_timeout
        self._credentials = credentials
        self._tls = tls
        self._token = token
        self._on_state = on_state
        self.status = FollowerStatus("connecting", lease_server, prefix)
        # Fences this follower set in this run: skips repeats, and is the RESYNC list.
        self._known: dict[str, int] = {}
        #: The identity of the log followed (None until the first stream's headers).
        self.log_id: str | None = None
        #: Per resource of the prefix, the highest token seen granted (events, Describe).
        self._granted: dict[str, int] = {}
        self._asking: dict[str, asyncio.Future[int]] = {}
        self._leases: AsyncLeaseClient | None = None
        self._saved_revision = 0
        self._saved_at = 0.0
        self._connected = asyncio.Event()

    async def wait_following(self) -> None:
        """Return once a stream is open (for tests and orderly startup)."""
        await self._connected.wait()

    async def _set(self, **changes: object) -> None:
        old = self.status
        new = replace(old, **changes)  # type: ignore[arg-type]
        if new.state != old.state:
            new = replace(new, since=time.monotonic())
            if new.state == "following":
                self._connected.set()
            else:
                self._connected.clear()
        self.status = new
        changed = new.state != old.state or new.last_error != old.last_error
        if changed and self._on_state is not None:
            await self._on_state(new)

    async def run(self) -> None:
        """Follow until cancelled; never raises otherwise."""
        leases = AsyncLeaseClient(
            self.lease_server,
            tls=self._tls,
            token=self._token,
            credentials=self._credentials,
            rpc_timeout=self.rpc_timeout,
        )
        self._leases = leases
        retries = RECONNECT_BACKOFF.attempts(random.random)
        try:
            while True:
                try:
                    await self._follow(leases)
                    error = "stream ended"
                except FencingError as exc:  # the stream, or the store: reconnect, re-apply
                    error = refusal(exc) if _from_lease_server(exc) else f"store: {exc}"
                except Exception as exc:  # the follower must never die silently
                    log.exception("watch follower crashed; reconnecting")
                    error = f"crashed: {exc!r}"
                dropped = self.status.following
                if dropped:
                    retries.reset()
                    log.warning(
                        "watch stream to %s lost (%s): fences no longer follow takeovers; "
                        "writes are still held to the monotonic rule until it is back",
                        self.lease_server,
                        error,
                    )
                elif retries.failures == 0:
                    log.warning(
                        "cannot follow lease events on %s (%s): fences do not follow "
                        "takeovers, writes are held to the monotonic rule; retrying",
                        self.lease_server,
                        error,
                    )
                else:
                    log.debug("watch reconnect to %s failed: %s", self.lease_server, error)
                await self._set(
                    state="disconnected",
                    last_error=error,
                    disconnects=self.status.disconnects + int(dropped),
                )
                await self._save_revision(force=True)
                await asyncio.sleep(retries.pause())
        finally:
            self._leases = None
            self.status = replace(self.status, state="stopped", since=time.monotonic())
            self._connected.clear()
            await leases.aclose()
            await self._save_revision(force=True)

    async def _open(self, leases: AsyncLeaseClient) -> AsyncWatchStream:
        """Open a stream after this follower's cursor.

        The first stream of a run asks "from now" to learn which log the server keeps,
        then, if this guard stored a cursor for that log and prefix, reopens after it.
        """
        if self.log_id is None:
            stream = await leases.watch_stream(prefix=self.prefix)
            try:
                stored = await self._load_revision(stream.log_id)
            except BaseException:
                await stream.aclose()
                raise
            self.log_id = stream.log_id
            self._saved_revision = stored
            if not stored or stored == stream.start_revision:
                return stream
            await stream.aclose()
            await self._set(revision=stored)
        return await leases.watch_stream(
            prefix=self.prefix, after_revision=self.status.revision, log_id=self.log_id
        )

    def _switch_log(self, log_id: str) -> None:
        """The server follows another log now (it said so with RESYNC or its headers):
        store the cursor under that log's name from here on."""
        if log_id and log_id != self.log_id:
            log.warning(
                "lease server %s keeps another event log now (%s, was %s): the stored "
                "cursor follows it",
                self.lease_server,
                log_id,
                self.log_id,
            )
            self.log_id = log_id
            self._saved_revision = 0

    async def _follow(self, leases: AsyncLeaseClient) -> None:
        stream = await self._open(leases)
        try:
            announced = stream.log_id
            if announced and not self.log_id:
                # A server that sent no identity before does now (upgraded): keep the
                # cursor under it from here on. (A different one comes with RESYNC.)
                self.log_id = announced
                self._saved_revision = 0
            # The server sends headers as soon as it streams; they say where it starts,
            # so a follower that asked "from now" can resume from there after a drop.
            start = stream.start_revision
            if start is not None and start > self.status.revision:
                await self._set(revision=start)
            # Open once the server said where it starts; a call it refused at once ends
            # without headers, and is a failed attempt (backoff), not a dropped stream.
            if start is not None:
                await self._opened()
            async for event in stream:
                if not self.status.following:
                    await self._opened()
                if event.kind is EventKind.RESYNC:
                    self._switch_log(event.log_id)
                    await self._resync(leases, event)
                else:
                    await self._apply(event)
                await self._set(
                    revision=event.revision, events_applied=self.status.events_applied + 1
                )
                await self._save_revision()
        finally:
            await stream.aclose()

    async def _opened(self) -> None:
        log.info(
            "following lease events on %s (prefix %r, log %s) after revision %d",
            self.lease_server,
            self.prefix,
            self.log_id or "without identity",
            self.status.revision,
        )
        await self._set(state="following", last_error="")

    async def _fence(self, resource: str, token: int) -> None:
        if token <= self._known.get(resource, 0):
            return
        try:
            fence = await self.store.fence(resource, token)
        except StaleTokenError as exc:
            fence = exc.current_token  # already past it: fences only go up
        if resource in self._known or len(self._known) < MAX_KNOWN:
            self._known[resource] = fence
        log.debug("watch fenced", extra={"resource": resource, "token": token, "fence": fence})

    def _note_granted(self, resource: str, token: int) -> None:
        if token > self._granted.get(resource, 0) and (
            resource in self._granted or len(self._granted) < MAX_KNOWN
        ):
            self._granted[resource] = token

    async def _apply(self, event: LeaseEvent) -> None:
        self._note_granted(event.resource, event.token)
        token = fence_for(event)
        if token is not None:
            await self._fence(event.resource, token)

    async def _resync(self, leases: AsyncLeaseClient, event: LeaseEvent) -> None:
        log.warning(
            "lease server cannot resume after revision %d (continuing after %d): "
            "re-reading the %d resources fenced in this run; others keep their fences",
            self.status.revision,
            event.revision,
            len(self._known),
        )
        await self._set(resyncs=self.status.resyncs + 1)
        for resource in list(self._known):
            state = await leases.describe(resource)
            self._note_granted(resource, max(state.token, state.last_token))
            if state.held:
                await self._fence(resource, state.token)
            elif state.last_token:
                await self._fence(resource, state.last_token + 1)

    # -- tokens nobody was granted ------------------------------------------------------------

    def vouched(self, resource: str, token: int) -> bool:
        """True if ``token`` needs no question to the lease server: it is not above the
        highest seen granted for ``resource``, or ``resource`` is not followed."""
        return token <= self._granted.get(resource, 0) or not resource.startswith(self.prefix)

    async def vouch(self, resource: str, token: int) -> None:
        """Return if ``token`` was granted for ``resource`` as far as this guard can know;
        raise ``LeaseLost`` if the lease server never granted it.

        Asks the lease server (``Describe``) only for a token above the highest seen
        granted; ``BackendUnavailableError`` if it cannot be asked.
        """
        if self.vouched(resource, token):
            return
        pending = self._asking.get(resource)
        if pending is None:
            pending = asyncio.ensure_future(self._last_granted(resource))
            self._asking[resource] = pending
            pending.add_done_callback(functools.partial(self._answered, resource))
        # Shielded: a caller that goes away must not cancel the answer others wait for.
        last = await asyncio.shield(pending)
        if token > last:
            hint = (
                "; a job's tokens come from the queue, not the lease log: follow a "
                "--watch-prefix that leaves job resources out"
                if last == 0
                else ""
            )
            raise LeaseLost(
                f"token {token} of {resource!r} was never granted: the lease server "
                f"{self.lease_server} has granted up to {last} (watch mode){hint}",
                resource=resource,
                token=token,
            )

    def _answered(self, resource: str, answer: asyncio.Future[int]) -> None:
        self._asking.pop(resource, None)
        if not answer.cancelled():
            answer.exception()  # retrieved here too: every waiter may have gone

    async def _last_granted(self, resource: str) -> int:
        leases = self._leases
        if leases is None:
            raise BackendUnavailableError(
                f"cannot check with the lease server {self.lease_server} that a token of "
                f"{resource!r} was granted: the watch follower is not running"
            )
        try:
            state = await leases.describe(resource)
        except FencingError as exc:
            raise BackendUnavailableError(
                f"cannot check with the lease server {self.lease_server} that a token of "
                f"{resource!r} was granted: {refusal(exc)}"
            ) from exc
        last = max(state.token, state.last_token)
        self._note_granted(resource, last)
        return last

    # -- the stored cursor ---------------------------------------------------------------------

    async def _load_revision(self, log_id: str) -> int:
        try:
            own = await self.store.describe_fence(cursor_resource(log_id, self.prefix))
            if own:
                return own
            shared = await self.store.describe_fence(SHARED_CURSOR)
        except FencingError as exc:
            log.warning("cannot read the stored watch revision, starting from now: %s", exc)
            return 0
        if shared:
            log.warning(
                "no watch cursor of this guard's own in the store yet: resuming once from "
                "the one an older guard kept for the whole store (revision %d)",
                shared,
            )
        return shared

    async def _save_revision(self, *, force: bool = False) -> None:
        revision = self.status.revision
        if self.log_id is None or revision <= self._saved_revision:
            return
        now = time.monotonic()
        if not force and now - self._saved_at < CURSOR_SAVE_INTERVAL:
            return
        self._saved_at = now
        try:
            self._saved_revision = await self.store.fence(
                cursor_resource(self.log_id, self.prefix), revision
            )
        except StaleTokenError as exc:
            # A higher revision is stored for this log: a replica of this guard got
            # further, or the log went back (restored). Keep following this one.
            self._saved_revision = exc.current_token
        except FencingError as exc:
            log.warning("cannot store the watch revision: %s", exc)
