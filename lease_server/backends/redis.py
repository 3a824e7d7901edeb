"""Redis lease backend (``redis://``, ``rediss://``, ``redis+cluster://``), on redis-py asyncio.

Acquire, renew, release and describe are each one Lua script
(``lease_server/lua/*.lua``, registered once per client), so each is one atomic
step on one Redis, by Redis's clock: a lease is a hash that Redis expires itself
(``PEXPIRE``). Keys, URL options, retries and error mapping: :mod:`fencing._redis`.
Every key of a resource shares its hash tag, so the same code runs on a Redis
Cluster, one slot per resource.

**Tokens never go backwards, even when Redis forgets** (restart without
persistence, failover to a replica that missed writes, ``FLUSHALL``). A token is
``max(counter + 1, TIME in microseconds)`` (the *clock floor*): while grants of a
resource are more than 1 µs apart and the clock does not step back, every token
is the grant's Redis time in µs, and a counter lost with Redis restarts at the
clock, above every earlier token. Tokens are therefore not consecutive (they look
like 1_795_943_218_629_996 and grow by about the time between grants) and stay far
below 2**63 - 1 (the clock reaches that in the year 294,000).

*Assumption, exactly:* the first token of a resource after a loss is the clock
reading ``t`` of the Redis that grants it, and every earlier token is at most
``H + g``, where ``H`` is the highest clock reading at any earlier grant of the
resource and ``g`` the number of grants made while the counter ran ahead of the
clock (0 unless the clock stepped back or grants came faster than one per µs). So
G1 holds across the loss iff ``t > H + g``. In words: the clock of the Redis that
serves the resource (after a failover, the new primary's) must not step back by
more than the time between the last grant before the loss and the first grant
after it (the outage: seconds at least for a restart). NTP slewing is harmless; an
NTP step, a VM snapshot restore or a failover to a host whose clock is behind by
more than the outage breaks G1, and nothing detects it.

The guard's fences kept in the same Redis are *not* protected by this: a Redis
that forgets forgets fences too. Hence :attr:`RedisBackend.durability_warning`
(read from ``CONFIG GET appendonly appendfsync save`` at open and logged as a
warning) and ``require_durable=True`` (or ``?require_durable=1``), which refuses
to open a Redis without AOF (``appendfsync always`` or ``everysec``). Replication
is asynchronous: a failover can lose acknowledged writes even with AOF.

**Wake-ups.** Release publishes the resource on ``<prefix>:released`` inside its
script; :meth:`RedisBackend.on_release` subscribes and calls the callbacks on the
event loop, so waiters in other lease-server processes wake at once. Messages
sent while the subscriber is reconnecting are lost: waiters also poll (see
:mod:`lease_server.waiters`).

**Failures.** Nothing is re-sent automatically. A script that timed out may or may
not have run: the caller gets ``BackendUnavailableError``; the SDK retries an
acquire with the same ``request_id``, which the script replays.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from fencing import _redis
from fencing._redis import Client, RedisTarget, ResourceKeys, driver_errors, text
from fencing.errors import LeaseLost
from lease_server.leases import Grant, Held, LeaseInfo

log = logging.getLogger(__name__)

_LUA = "lease_server.lua"
ACQUIRE_LUA = _redis.load_lua(_LUA, "acquire")
RENEW_LUA = _redis.load_lua(_LUA, "renew")
RELEASE_LUA = _redis.load_lua(_LUA, "release")
DESCRIBE_LUA = _redis.load_lua(_LUA, "describe")

#: How long the release listener waits before it re-subscribes after an error (s).
LISTEN_BACKOFF = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
#: Idle seconds after which the listener PINGs its subscription.
LISTEN_PING_INTERVAL = 5.0


class RedisBackend:
    """Lease state in Redis or a Redis Cluster.

    ``url``: see :mod:`fencing._redis`. ``prefix`` overrides the URL's key prefix
    (several independent lease spaces can share one Redis). ``require_durable``
    (also ``?require_durable=1``) makes :meth:`open` raise ``InvalidArgumentError``
    when the Redis persistence settings do not make counters durable.
    ``clock_floor=False`` turns the never-backwards clock floor off (tokens 1, 2, ...
    that restart at 1 when Redis forgets): only for tests that show why it exists.

    After :meth:`open`: ``durability_warning`` is None or says why tokens and fences
    may be forgotten; ``cluster`` says whether a Redis Cluster answered.
    """

    name = "redis"

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str | None = None,
        require_durable: bool | None = None,
        clock_floor: bool = True,
    ) -> None:
        target = _redis.parse_url(url)
        self.target: RedisTarget = target
        self.prefix = _redis.check_prefix(prefix) if prefix is not None else target.prefix
        self.require_durable = (
            target.require_durable if require_durable is None else require_durable
        )
        self.clock_floor = clock_floor
        self.durability_warning: str | None = None
        self.cluster = False
        self.channel = _redis.release_channel(self.prefix)
        self._client: Client | None = None
        self._scripts: dict[str, AsyncScript] = {}
        self._callbacks: list[Callable[[str], None]] = []
        self._listener: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        if self._client is not None:
            return
        target = dataclasses.replace(self.target, require_durable=self.require_durable)
        client, self.durability_warning = await _redis.open_client(target, "redis lease backend")
        if not self.clock_floor:
            log.warning(
                "redis lease backend: clock floor OFF: tokens restart at 1 if Redis forgets"
            )
        self.cluster = isinstance(client, RedisCluster)
        self._client = client
        self._scripts = {
            "acquire": client.register_script(ACQUIRE_LUA),
            "renew": client.register_script(RENEW_LUA),
            "release": client.register_script(RELEASE_LUA),
            "describe": client.register_script(DESCRIBE_LUA),
        }
        self._start_listener()

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def healthy(self) -> bool:
        """Redis answers PING (see ``fencing._storage.HealthProbe``)."""
        if self._client is None:
            return False
        try:
            return bool(await self._client.ping())
        except Exception:
            return False

    async def _run(self, script: str, what: str, keys: list[str], args: list[Any]) -> Any:
        if self._client is None:
            raise RuntimeError("RedisBackend is not open")
        with driver_errors(what):
            return await self._scripts[script](keys=keys, args=args)

    # -- the Protocol --------------------------------------------------------------------

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, request_id: str
    ) -> Grant | Held:
        keys = ResourceKeys(self.prefix, resource)
        outcome, token, ms, who = await self._run(
            "acquire",
            "acquire",
            [keys.lease, keys.counter],
            [holder, ttl_ms, request_id, "1" if self.clock_floor else "0"],
        )
        kind = text(outcome)
        if kind == "held":
            return Held(resource, text(who), int(token), max(0, int(ms)))
        return Grant(resource, text(who), int(token), max(0, int(ms)), kind == "replayed")

    async def renew(self, resource: str, token: int, holder: str, ttl_ms: int) -> Grant:
        keys = ResourceKeys(self.prefix, resource)
        outcome, who = await self._run("renew", "renew", [keys.lease], [str(token), holder, ttl_ms])
        if text(outcome) != "renewed":
            raise LeaseLost(resource=resource, token=token)
        return Grant(resource, text(who), token, ttl_ms)

    async def release(self, resource: str, token: int, holder: str) -> None:
        keys = ResourceKeys(self.prefix, resource)
        outcome = await self._run(
            "release", "release", [keys.lease], [str(token), holder, self.channel, resource]
        )
        if text(outcome) != "released":
            raise LeaseLost(resource=resource, token=token)

    async def describe(self, resource: str) -> LeaseInfo:
        keys = ResourceKeys(self.prefix, resource)
        who, token, ms, last = await self._run(
            "describe", "describe", [keys.lease, keys.counter], []
        )
        held = int(token) != 0
        return LeaseInfo(
            resource=resource,
            held=held,
            holder=text(who) if held else "",
            token=int(token),
            remaining_ms=max(0, int(ms)) if held else 0,
            last_token=int(last),
        )

    # -- wake-ups ------------------------------------------------------------------------

    def on_release(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(resource)`` on the event loop for every release on this Redis
        (this process's own releases included: a spurious wake-up only re-asks)."""
        self._callbacks.append(callback)
        self._start_listener()

    def _start_listener(self) -> None:
        if self._client is None or not self._callbacks or self._listener is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # started by open(), which runs on the loop
        self._listener = loop.create_task(self._listen(), name=f"redis-release-{self.prefix}")

    def _pubsub(self, attempt: int) -> tuple[PubSub, Redis | None]:
        """A pub/sub connection, and the client to close with it if it has its own."""
        assert self._client is not None
        if isinstance(self._client, RedisCluster):
            # Classic pub/sub is cluster-wide: every node hears every PUBLISH. Subscribe
            # through one node; after a failure, the next one.
            nodes = self._client.get_nodes()
            node = nodes[attempt % len(nodes)]
            own = _redis.standalone_client(
                _redis.url_for_node(self.target.url, node.host, int(node.port))
            )
            return own.pubsub(), own
        return self._client.pubsub(), None

    async def _listen(self) -> None:
        failures = 0
        attempt = 0
        while True:
            pubsub, own = self._pubsub(attempt)
            try:
                with driver_errors("subscribe"):
                    await pubsub.subscribe(self.channel)
                    failures = 0
                    unanswered = 0
                    while True:
                        message = await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=LISTEN_PING_INTERVAL
                        )
                        if message is None:
                            # A connection that died without a FIN shows up as PINGs
                            # that stay unanswered.
                            if unanswered >= 2:
                                raise ConnectionError("release subscription stopped answering")
                            unanswered += 1
                            await pubsub.ping()
                            continue
                        unanswered = 0
                        if message.get("type") != "message":
                            continue
                        resource = text(message["data"])
                        for callback in list(self._callbacks):
                            try:
                                callback(resource)
                            except Exception:
                                log.exception("on_release callback failed")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = LISTEN_BACKOFF[min(failures, len(LISTEN_BACKOFF) - 1)]
                failures += 1
                attempt += 1
                log.info("release listener lost its subscription (%s); again in %.2f s", exc, delay)
                await asyncio.sleep(delay)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                if own is not None:
                    with contextlib.suppress(Exception):
                        await own.aclose()
