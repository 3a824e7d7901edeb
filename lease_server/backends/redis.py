"""Redis lease backend (``redis://``, ``rediss://``, ``redis+cluster://``), on redis-py asyncio.

Acquire, renew, release and describe are each one Lua script
(``lease_server/lua/*.lua``, registered once per client), so each is one atomic
step on one Redis, by Redis's clock: a lease is a hash that Redis expires itself
(``PEXPIRE``). Calls that arrive together (:mod:`lease_server.grouped`) go as one
pipeline of those scripts (:meth:`RedisBackend.lease_steps`): one round trip, each
script still its own atomic step. Keys, URL options, retries and error mapping:
:mod:`serving.redis_db`.
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
that forgets forgets fences too, and a Redis that evicts (``maxmemory`` set with any
``maxmemory-policy`` but ``noeviction``) deletes leases, and under ``allkeys-*``
fences and counters, while it runs. Hence :attr:`RedisBackend.durability_warning`
(read from ``CONFIG GET appendonly appendfsync save maxmemory maxmemory-policy`` at
open and on every health probe, logged as a warning when it turns bad) and
``require_durable=True`` (or ``?require_durable=1``), which refuses to open a Redis
without AOF (``appendfsync always`` or ``everysec``) or one that may evict, and
reports NOT_SERVING should it become so. Replication is asynchronous: a failover
can lose acknowledged writes even with AOF.

**Event log** (``Watch``, watch-mode guards; ``lease_server/lua/eventlog.lua``). Each
script that changes a lease appends its events in the same script: ``INCR`` of the
head and ``XADD`` to a stream, so appends are atomic with the change and revisions
appear in order (rules 1-3 of :mod:`lease_server.backends.base`). Redis expires a
lease by itself (``PEXPIREAT``) and runs nothing when it does, so each script also
keeps ``owed``: resource -> the token (and holder) whose end is not logged yet. Its
EXPIRED is appended by whichever comes first, each conditional on ``owed`` in one
script: the takeover (just before its ACQUIRED), or the expiry step below (rule 4).

- *One Redis:* one log for every resource, in keys outside every resource's
  (``<prefix>:events:*``; a script on one Redis may touch any key). ``due`` is a
  sorted set of the owed leases' expiries (the same instant the lease hash was
  given), where the sweeper (``expire_due``) finds what expired. The log is pruned
  by ``prune_events``; ``events_after`` is one read-only script (one consistent
  view). This is a full :class:`~lease_server.backends.base.EventLog`: Watch of a
  resource or a prefix, and guards in ``watch`` mode, work as on PostgreSQL.
- *Redis Cluster:* no script can touch one global log *and* a resource's keys, which
  live in the resource's slot, and a log appended in a second step could lose or
  reorder events. So each resource keeps **its own log, in its own slot**
  (``<prefix>:{<tag>}:events|revision|compacted|owed``), numbered 1, 2, 3 ... per
  resource, trimmed to its newest ``events_per_resource`` events at each append. The
  backend is then a :class:`~lease_server.backends.base.ResourceEventLog`, not an
  ``EventLog``: ``Watch`` of one resource works (with RESYNC and resume cursors of
  that resource's log); ``Watch`` of a prefix, which needs one order across
  resources, is refused with UNIMPLEMENTED, so guards in ``watch`` mode cannot follow
  a lease server on a cluster (use ``promise``, or ``strict`` with the guard's store
  in the same cluster). There is no sweeper either (nothing sees every slot's keys):
  reading a resource's log first logs its owed expiry, so no reader ever sees the log
  without it, and a resource nobody reads gets it at its next takeover.

A Redis that forgets (no AOF) forgets the log too, which starts again at revision 1
(revisions have no clock floor: they must stay dense), and forgets the log's identity
(``<prefix>:events:id``, a random id set with ``SET NX`` by the first reader that finds
none), so the new log gets a new one. A reader whose cursor is ahead of it is told
(RESYNC); so is one that comes back only after the new log passed its cursor, if it
names the log its cursor came from (``WatchRequest.log_id``, as guards do): a restart
of Redis ends every stream (the connection drops), and the reader's reconnect names
the old log. (A ``FLUSHALL`` under an open stream that no connection loss ends, with
the new log past the stream's cursor before the next read, is not seen.) All lease
servers on one Redis must run code that logs: an older one grants without events.

**Wake-ups.** Release publishes the resource on ``<prefix>:released`` inside its
script, and every append publishes on ``<prefix>:events`` (one Redis: the new head;
a cluster: ``<revision>:<resource>``). One subscriber per backend listens on both
(:meth:`RedisBackend.on_release`, ``on_events``, ``on_resource_events``) and calls
the callbacks on the event loop, so waiters and Watch streams in other lease-server
processes wake at once. Messages sent while the subscriber is reconnecting are lost:
waiters and Watch streams also poll (see :mod:`lease_server.waiters`,
:mod:`lease_server.watch`).

**Failures.** Nothing is re-sent automatically. A script that timed out may or may
not have run: the caller gets ``BackendUnavailableError``; the SDK retries an
acquire with the same ``request_id``, which the script replays.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.crc import key_slot

from fencing.errors import InvalidArgumentError, LeaseLost
from fencing.types import LeaseState
from lease_server.leases import (
    AcquireItem,
    EventPage,
    Grant,
    Held,
    LeaseStep,
    LoggedEvent,
    ReleaseItem,
    RenewItem,
    Scope,
    StepOutcome,
    TransitionKind,
)
from serving import redis_db
from serving.redis_db import (
    EventLogKeys,
    RedisTarget,
    ResourceKeys,
    driver_errors,
    glob_escape,
    run_pipelined,
    text,
    unescape_tag,
)
from serving.tasks import cancel_and_wait

log = logging.getLogger(__name__)

_LUA = "lease_server.lua"
_LOG = ("eventlog",)
ACQUIRE_LUA = redis_db.load_lua(_LUA, "acquire", helpers=(*_LOG, "lease"))
ACQUIRE_MANY_LUA = redis_db.load_lua(_LUA, "acquire_many", helpers=(*_LOG, "lease"))
#: Renewals or releases per pipeline: each is its own script (and its own events).
PIPELINE_CHUNK = 1000
#: Scripts in flight at once where a pipeline cannot carry them (a cluster's slots).
CLUSTER_CONCURRENCY = 32
RENEW_LUA = redis_db.load_lua(_LUA, "renew", helpers=_LOG)
RELEASE_LUA = redis_db.load_lua(_LUA, "release", helpers=_LOG)
DESCRIBE_LUA = redis_db.load_lua(_LUA, "describe")
EXPIRE_LUA = redis_db.load_lua(_LUA, "expire", helpers=_LOG)
EVENTS_LUA = redis_db.load_lua(_LUA, "events")
PRUNE_LUA = redis_db.load_lua(_LUA, "prune")
RESOURCE_EVENTS_LUA = redis_db.load_lua(_LUA, "resource_events", helpers=_LOG)

#: Events of the shared log one ``events_after`` examines at most (bounds the script
#: when a narrow scope matches few of many events; the page then ends where it stopped).
EVENTS_SCAN = 10_000
#: On a Redis Cluster, the newest events each resource's own log keeps. Per resource
#: and never deleted with it (like its counter): about 10 KB for a busy one. A watcher
#: that falls further behind (about 100 renewals) gets RESYNC.
EVENTS_PER_RESOURCE = 100

#: How long the listener (releases, events) waits before it re-subscribes after an error (s).
LISTEN_BACKOFF = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
#: Idle seconds after which the listener PINGs its subscription.
LISTEN_PING_INTERVAL = 5.0


class RedisBackend(redis_db.Probed):
    """Lease state in Redis or a Redis Cluster.

    ``url``: see :mod:`serving.redis_db`. ``prefix`` overrides the URL's key prefix
    (several independent lease spaces can share one Redis). ``require_durable``
    (also ``?require_durable=1``) makes :meth:`open` raise ``InvalidArgumentError``
    when the Redis persistence settings do not make counters durable.
    ``clock_floor=False`` turns the never-backwards clock floor off (tokens 1, 2, ...
    that restart at 1 when Redis forgets): only for tests that show why it exists.
    ``events_per_resource``: on a Redis Cluster, how many events each resource's own
    log keeps (the one log of a single Redis is bounded by ``prune_events`` instead).

    After :meth:`open`: ``durability_warning`` is None or says why tokens and fences
    may be forgotten; ``cluster`` says whether a Redis Cluster answered, and with it
    ``event_log_scope`` whether the event log is ``"global"`` or ``"resource"``.
    """

    name = "redis"

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str | None = None,
        require_durable: bool | None = None,
        clock_floor: bool = True,
        events_per_resource: int = EVENTS_PER_RESOURCE,
    ) -> None:
        target = redis_db.parse_url(url)
        self.target: RedisTarget = target
        self.prefix = redis_db.check_prefix(prefix) if prefix is not None else target.prefix
        self.require_durable = (
            target.require_durable if require_durable is None else require_durable
        )
        self.clock_floor = clock_floor
        self._probe("redis lease backend")
        self.cluster = False
        self.channel = redis_db.release_channel(self.prefix)
        self.events_channel = redis_db.events_channel(self.prefix)
        self.events_per_resource = max(1, events_per_resource)
        self._shared_log = EventLogKeys.shared(self.prefix)
        #: The one log's identity (rule 5 of the event log): lost with the log when Redis
        #: forgets, so the log that starts over draws a new one.
        self._log_id_key = f"{self.prefix}:events:id"
        self._scripts: dict[str, AsyncScript] = {}
        self._callbacks: list[Callable[[str], None]] = []
        self._event_callbacks: list[Callable[[int], None]] = []
        self._resource_callbacks: list[Callable[[str, int], None]] = []
        #: The highest head reported to the ``on_events`` callbacks (one Redis).
        self._reported = 0
        self._listener: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        if self._client is not None:
            return
        client = await self._connect()
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
            "acquire_many": client.register_script(ACQUIRE_MANY_LUA),
            "describe": client.register_script(DESCRIBE_LUA),
            "expire": client.register_script(EXPIRE_LUA),
            "events": client.register_script(EVENTS_LUA),
            "prune": client.register_script(PRUNE_LUA),
            "resource_events": client.register_script(RESOURCE_EVENTS_LUA),
        }
        self._start_listener()

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            # Cancelled again until it ends: redis-py can swallow a cancellation (see
            # serving.tasks), and the listener's loop would go on (a lease server's
            # drain then never finished). Its own failure, if it had one, is raised.
            await cancel_and_wait(listener)
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _run(self, script: str, what: str, keys: list[str], args: list[Any]) -> Any:
        if self._client is None:
            raise RuntimeError("RedisBackend is not open")
        with driver_errors(what):
            return await self._scripts[script](keys=keys, args=args)

    # -- the Protocol --------------------------------------------------------------------

    @property
    def event_log_scope(self) -> str:
        """``"global"`` (one log, an ``EventLog``) or, on a cluster, ``"resource"``."""
        return "resource" if self.cluster else "global"

    def _log_keys(self, keys: ResourceKeys) -> list[str]:
        return (EventLogKeys.of(keys) if self.cluster else self._shared_log).all()

    def _log_args(self) -> list[str]:
        """maxlen, channel, per-resource flag: the last ARGV of the changing scripts."""
        if self.cluster:
            return [str(self.events_per_resource), self.events_channel, "1"]
        return ["0", self.events_channel, "0"]

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, request_id: str
    ) -> Grant | Held:
        keys = ResourceKeys(self.prefix, resource)
        outcome, token, ms, who, revision = await self._run(
            "acquire",
            "acquire",
            [keys.lease, keys.counter, *self._log_keys(keys)],
            [
                holder,
                ttl_ms,
                request_id,
                "1" if self.clock_floor else "0",
                resource,
                *self._log_args(),
            ],
        )
        kind = text(outcome)
        self._appended(resource, int(revision))
        if kind == "held":
            return Held(resource, text(who), int(token), max(0, int(ms)))
        return Grant(resource, text(who), int(token), max(0, int(ms)), kind == "replayed")

    async def renew(self, resource: str, token: int, holder: str, ttl_ms: int) -> Grant:
        keys = ResourceKeys(self.prefix, resource)
        outcome, who, ttl = await self._run(
            "renew",
            "renew",
            [keys.lease, *self._log_keys(keys)],
            [str(token), holder, ttl_ms, resource, *self._log_args()],
        )
        if text(outcome) != "renewed":
            raise LeaseLost(resource=resource, token=token)
        return Grant(resource, text(who), token, int(ttl))

    async def release(self, resource: str, token: int, holder: str) -> None:
        keys = ResourceKeys(self.prefix, resource)
        outcome, revision = await self._run(
            "release",
            "release",
            [keys.lease, *self._log_keys(keys)],
            [str(token), holder, self.channel, resource, *self._log_args()],
        )
        if text(outcome) != "released":
            raise LeaseLost(resource=resource, token=token)
        self._appended(resource, int(revision))

    # -- many at once ------------------------------------------------------------------------

    async def acquire_many(
        self, resources: Sequence[str], holder: str, ttl_ms: int, request_id: str
    ) -> list[Grant] | Held:
        """One acquire_many.lua call: atomic on one Redis; on a cluster only when every
        resource hashes to one slot (``InvalidArgumentError`` otherwise)."""
        ordered = sorted(resources)
        resource_keys = [ResourceKeys(self.prefix, r) for r in ordered]
        if self.cluster and len({key_slot(k.lease.encode()) for k in resource_keys}) > 1:
            raise InvalidArgumentError(
                "on a Redis Cluster AcquireMany is atomic only within one hash slot, and "
                "these resources live in different slots: acquire them one by one, or use a "
                "standalone Redis or PostgreSQL",
                field="resources",
            )
        keys: list[str] = []
        for k in resource_keys:
            keys += [k.lease, k.counter]
        logs = [self._log_keys(k) for k in resource_keys]
        for log_keys in logs:
            keys += log_keys
        reply = await self._run(
            "acquire_many",
            "acquire_many",
            keys,
            [
                holder,
                ttl_ms,
                request_id,
                "1" if self.clock_floor else "0",
                len(ordered),
                len(logs[0]),
                *self._log_args(),
                *ordered,
            ],
        )
        if text(reply[0]) == "held":
            _, i, token, ms, who = reply
            return Held(ordered[int(i) - 1], text(who), int(token), max(0, int(ms)))
        got: dict[str, Grant] = {}
        for n, resource in enumerate(ordered):
            outcome, token, ms, revision = reply[1 + 4 * n : 5 + 4 * n]
            self._appended(resource, int(revision))
            got[resource] = Grant(
                resource, holder, int(token), max(0, int(ms)), text(outcome) == "replayed"
            )
        return [got[r] for r in resources]

    async def renew_many(self, items: Sequence[RenewItem]) -> list[Grant | LeaseLost]:
        """renew.lua per lease (no event: renewals are not logged), pipelined: one round trip per
        PIPELINE_CHUNK on one Redis; on a cluster the calls go out concurrently."""
        replies = await self._each(
            "renew",
            [
                (
                    [ResourceKeys(self.prefix, i.resource).lease],
                    i.resource,
                    [str(i.token), i.holder, i.ttl_ms, i.resource],
                )
                for i in items
            ],
        )
        outcomes: list[Grant | LeaseLost] = []
        for item, (outcome, who, ttl) in zip(items, replies, strict=True):
            if text(outcome) == "renewed":
                outcomes.append(Grant(item.resource, text(who), item.token, int(ttl)))
            else:
                outcomes.append(LeaseLost(resource=item.resource, token=item.token))
        return outcomes

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[LeaseLost | None]:
        """release.lua per lease (each with its RELEASED and wake-up), pipelined as
        :meth:`renew_many`."""
        replies = await self._each(
            "release",
            [
                (
                    [ResourceKeys(self.prefix, i.resource).lease],
                    i.resource,
                    [str(i.token), i.holder, self.channel, i.resource],
                )
                for i in items
            ],
        )
        outcomes: list[LeaseLost | None] = []
        for item, (outcome, revision) in zip(items, replies, strict=True):
            if text(outcome) == "released":
                self._appended(item.resource, int(revision))
                outcomes.append(None)
            else:
                outcomes.append(LeaseLost(resource=item.resource, token=item.token))
        return outcomes

    async def _each(self, script: str, calls: list[tuple[list[str], str, list[Any]]]) -> list[Any]:
        """Run ``script`` once per call (own keys, the resource, own args), every reply
        in order (:meth:`_pipelined`)."""
        return await self._pipelined([(script, *call) for call in calls])

    async def _pipelined(self, calls: list[tuple[str, list[str], str, list[Any]]]) -> list[Any]:
        """Run each call's script (the script, own keys, the resource, own args; the event
        log's keys and arguments added), every reply in order: pipelined on one Redis
        (one round trip per PIPELINE_CHUNK), concurrently on a cluster."""
        if self._client is None:
            raise RuntimeError("RedisBackend is not open")
        full = [
            (
                self._scripts[script],
                own + self._log_keys(ResourceKeys(self.prefix, resource)),
                args + self._log_args(),
            )
            for script, own, resource, args in calls
        ]
        with driver_errors(calls[0][0] if len({c[0] for c in calls}) == 1 else "lease steps"):
            if self.cluster:
                return await _in_order_per_resource(
                    [(resource, *f) for (_, _, resource, _), f in zip(calls, full, strict=True)]
                )
            replies: list[Any] = []
            for start in range(0, len(full), PIPELINE_CHUNK):
                replies += await run_pipelined(self._client, full[start : start + PIPELINE_CHUNK])
            return replies

    # -- lease calls of many callers in one pipeline -----------------------------------------

    #: One Redis runs one script at a time: one pipeline in flight, the next one forming.
    step_concurrency = 1

    async def lease_steps(self, steps: Sequence[LeaseStep]) -> list[StepOutcome]:
        """acquire.lua, renew.lua or release.lua per step, each its own atomic script (with
        its own events and wake-up), in one pipeline: one round trip on one Redis."""
        calls: list[tuple[str, list[str], str, list[Any]]] = []
        for op in steps:
            keys = ResourceKeys(self.prefix, op.resource)
            if isinstance(op, AcquireItem):
                floor = "1" if self.clock_floor else "0"
                args: list[Any] = [op.holder, op.ttl_ms, op.request_id, floor, op.resource]
                calls.append(("acquire", [keys.lease, keys.counter], op.resource, args))
            elif isinstance(op, RenewItem):
                args = [str(op.token), op.holder, op.ttl_ms, op.resource]
                calls.append(("renew", [keys.lease], op.resource, args))
            else:
                args = [str(op.token), op.holder, self.channel, op.resource]
                calls.append(("release", [keys.lease], op.resource, args))
        replies = await self._pipelined(calls)
        outcomes: list[StepOutcome] = []
        for op, reply in zip(steps, replies, strict=True):
            kind = text(reply[0])
            if isinstance(op, AcquireItem):
                _, token, ms, who, revision = reply
                self._appended(op.resource, int(revision))
                if kind == "held":
                    outcomes.append(Held(op.resource, text(who), int(token), max(0, int(ms))))
                else:
                    grant = Grant(
                        op.resource, text(who), int(token), max(0, int(ms)), kind == "replayed"
                    )
                    outcomes.append(grant)
            elif isinstance(op, RenewItem):
                if kind == "renewed":
                    outcomes.append(Grant(op.resource, text(reply[1]), op.token, int(reply[2])))
                else:
                    outcomes.append(LeaseLost(resource=op.resource, token=op.token))
            elif kind == "released":
                self._appended(op.resource, int(reply[1]))
                outcomes.append(None)
            else:
                outcomes.append(LeaseLost(resource=op.resource, token=op.token))
        return outcomes

    async def describe(self, resource: str) -> LeaseState:
        keys = ResourceKeys(self.prefix, resource)
        reply = await self._run("describe", "describe", [keys.lease, keys.counter], [])
        return _described(resource, reply)

    async def _describe_many(self, resources: Sequence[str]) -> list[LeaseState]:
        """``describe`` of each resource, pipelined (one Redis) or a bounded number at a
        time (a cluster), so a long list never takes more connections than the pool has."""
        if self._client is None:
            raise RuntimeError("RedisBackend is not open")
        registered = self._scripts["describe"]
        keys = [ResourceKeys(self.prefix, r) for r in resources]
        replies: list[Any] = []
        step = CLUSTER_CONCURRENCY if self.cluster else PIPELINE_CHUNK
        with driver_errors("list"):
            for start in range(0, len(keys), step):
                chunk = keys[start : start + step]
                if self.cluster:
                    replies += await asyncio.gather(
                        *(registered(keys=[k.lease, k.counter], args=[]) for k in chunk)
                    )
                    continue
                replies += await run_pipelined(
                    self._client, [(registered, [k.lease, k.counter], []) for k in chunk]
                )
        return [_described(r, reply) for r, reply in zip(resources, replies, strict=True)]

    async def list_held(self, prefix: str, after: str, limit: int) -> list[LeaseState]:
        """Redis keeps no index of resources (one would be a key outside every resource's
        slot, which a cluster's scripts cannot update with the lease): each page SCANs
        the lease hashes (every node of a cluster), sorts the names past ``after``, and
        reads them with ``describe`` until ``limit`` are held. O(keys) per page: an
        operator's call, not a hot path."""
        if self._client is None:
            raise RuntimeError("RedisBackend is not open")
        head = f"{self.prefix}:{{"
        tail = "}:lease"
        names: set[str] = set()
        with driver_errors("list"):
            async for raw in self._client.scan_iter(
                match=f"{glob_escape(head)}*{glob_escape(tail)}", count=1000
            ):
                key = text(raw)
                tag = key[len(head) : -len(tail)]
                if "{" in tag or "}" in tag:  # another key of a resource (idem:...)
                    continue
                resource = unescape_tag(tag)
                if resource.startswith(prefix) and resource > after:
                    names.add(resource)
        held: list[LeaseState] = []
        ordered = sorted(names)
        for start in range(0, len(ordered), limit):
            infos = await self._describe_many(ordered[start : start + limit])
            held += [info for info in infos if info.held]
            if len(held) >= limit:
                break
        return held[:limit]

    # -- the event log: one Redis (EventLog) ------------------------------------------------

    def _global_only(self, what: str) -> None:
        if self.cluster:
            raise RuntimeError(
                f"{what}: on a Redis Cluster each resource keeps its own event log "
                "(see ResourceEventLog): there is no global one"
            )

    async def head_revision(self) -> int:
        self._global_only("head_revision")
        if self._client is None:
            raise RuntimeError("RedisBackend is not open")
        known = self._reported
        with driver_errors("head_revision"):
            head = int(await self._client.get(self._shared_log.head) or 0)
        if head < known:
            # Every reported head was written before this read: Redis lost the log.
            # Report from here on, or no head would be news again until it passes.
            self._reported = head
        return head

    async def log_id(self) -> str:
        """The one log's id, drawn by the first reader that finds none (``SET NX``)."""
        self._global_only("log_id")
        if self._client is None:
            raise RuntimeError("RedisBackend is not open")
        with driver_errors("log_id"):
            await self._client.set(self._log_id_key, uuid.uuid4().hex, nx=True)
            found = await self._client.get(self._log_id_key)
        return text(found) if found is not None else ""

    async def events_after(self, revision: int, scope: Scope, limit: int) -> EventPage:
        self._global_only("events_after")
        keys = self._shared_log
        head, compacted, rows = await self._run(
            "events",
            "events_after",
            [keys.log, keys.head, keys.compacted],
            [revision, scope.resource, scope.prefix, max(1, limit), EVENTS_SCAN],
        )
        return EventPage(tuple(map(_event, rows)), int(head), int(compacted))

    async def expire_due(self, limit: int) -> list[LoggedEvent]:
        """One Redis: log what expired (``due`` <= now). A cluster has nothing to sweep:
        expiries are logged by the takeover or the next read of the resource's log."""
        if self.cluster:
            return []
        keys = self._shared_log
        assert keys.due is not None
        rows = await self._run(
            "expire",
            "expire_due",
            [keys.log, keys.head, keys.owed, keys.due],
            [max(1, limit), self.events_channel],
        )
        events = [
            LoggedEvent(int(rev), TransitionKind.EXPIRED, text(resource), int(token), text(holder))
            for rev, resource, token, holder in rows
        ]
        if events:
            self._appended("", events[-1].revision)
        return events

    async def prune_events(self, keep: int) -> int:
        """One Redis: keep the newest ``keep`` events. A cluster's per-resource logs are
        trimmed at each append (``events_per_resource``): nothing to do here."""
        if self.cluster:
            return 0
        keys = self._shared_log
        dropped = await self._run(
            "prune", "prune_events", [keys.log, keys.head, keys.compacted], [max(0, keep)]
        )
        return int(dropped)

    def on_events(self, callback: Callable[[int], None]) -> None:
        """One Redis: ``callback(head)`` after this object's appends, at once, and after
        other processes' (pub/sub). Heads only grow: none is reported twice."""
        self._event_callbacks.append(callback)
        self._start_listener()

    # -- the event log: Redis Cluster (ResourceEventLog) ------------------------------------

    async def resource_head(self, resource: str) -> int:
        if self._client is None:
            raise RuntimeError("RedisBackend is not open")
        keys = EventLogKeys.of(ResourceKeys(self.prefix, resource))
        with driver_errors("resource_head"):
            head = await self._client.get(keys.head)
        return int(head or 0)

    async def resource_events_after(self, resource: str, revision: int, limit: int) -> EventPage:
        keys = ResourceKeys(self.prefix, resource)
        log_keys = EventLogKeys.of(keys)
        head, compacted, rows, settled = await self._run(
            "resource_events",
            "resource_events_after",
            [keys.lease, log_keys.log, log_keys.head, log_keys.compacted, log_keys.owed],
            [revision, max(1, limit), resource, self.events_channel, self.events_per_resource],
        )
        self._appended(resource, int(settled))
        return EventPage(tuple(map(_event, rows)), int(head), int(compacted))

    def on_resource_events(self, callback: Callable[[str, int], None]) -> None:
        """Cluster: ``callback(resource, revision)`` after appends to a resource's log,
        this object's at once, other processes' through pub/sub."""
        self._resource_callbacks.append(callback)
        self._start_listener()

    def _appended(self, resource: str, revision: int) -> None:
        """Tell the callbacks that the log reached ``revision`` (0: nothing appended).
        One Redis: each head once, in increasing order (an own append's echo is not
        news); a cluster: as heard (callers keep the highest per resource)."""
        if revision <= 0:
            return
        if self.cluster:
            callbacks: list[Callable[[], None]] = [
                functools.partial(cb, resource, revision) for cb in self._resource_callbacks
            ]
        else:
            if revision <= self._reported:
                return
            self._reported = revision
            callbacks = [functools.partial(cb, revision) for cb in self._event_callbacks]
        for call in callbacks:
            try:
                call()
            except Exception:
                log.exception("event callback failed at revision %d", revision)

    def _heard(self, payload: str) -> None:
        """A message on the events channel (see the module docstring)."""
        revision, _, resource = payload.partition(":")
        if revision.isdigit() and (bool(resource) == self.cluster):
            self._appended(resource, int(revision))

    # -- wake-ups ------------------------------------------------------------------------

    def on_release(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(resource)`` on the event loop for every release on this Redis
        (this process's own releases included: a spurious wake-up only re-asks)."""
        self._callbacks.append(callback)
        self._start_listener()

    def _start_listener(self) -> None:
        wanted = self._callbacks or self._event_callbacks or self._resource_callbacks
        if self._client is None or not wanted or self._listener is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # started by open(), which runs on the loop
        self._listener = loop.create_task(self._listen(), name=f"redis-listen-{self.prefix}")

    def _pubsub(self, attempt: int) -> tuple[PubSub, Redis | None]:
        """A pub/sub connection, and the client to close with it if it has its own."""
        assert self._client is not None
        if isinstance(self._client, RedisCluster):
            # Classic pub/sub is cluster-wide: every node hears every PUBLISH. Subscribe
            # through one node; after a failure, the next one.
            nodes = self._client.get_nodes()
            node = nodes[attempt % len(nodes)]
            own = redis_db.standalone_client(
                redis_db.url_for_node(self.target.url, node.host, int(node.port))
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
                    await pubsub.subscribe(self.channel, self.events_channel)
                    failures = 0
                    if self._event_callbacks and not self.cluster:
                        # Appends made while no one listened: report the head now.
                        self._appended("", await self.head_revision())
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
                        if text(message.get("channel")) == self.events_channel:
                            self._heard(text(message["data"]))
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
                log.info("redis listener lost its subscription (%s); again in %.2f s", exc, delay)
                await asyncio.sleep(delay)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
                if own is not None:
                    with contextlib.suppress(Exception):
                        await own.aclose()


async def _in_order_per_resource(
    calls: list[tuple[str, AsyncScript, list[str], list[Any]]],
) -> list[Any]:
    """A cluster's calls (resource, script, keys, args): concurrently across resources, one
    after another for each resource (in the order given), every reply in order."""
    replies: list[Any] = [None] * len(calls)
    by_resource: dict[str, list[int]] = {}
    for i, (resource, _, _, _) in enumerate(calls):
        by_resource.setdefault(resource, []).append(i)

    async def run(indices: list[int]) -> None:
        for i in indices:
            _, script, keys, args = calls[i]
            replies[i] = await script(keys=keys, args=args)

    await asyncio.gather(*(run(indices) for indices in by_resource.values()))
    return replies


def _described(resource: str, reply: list[Any]) -> LeaseState:
    """A ``describe.lua`` reply as the lease's state."""
    who, token, ms, last, ttl = reply
    held = int(token) != 0
    return LeaseState(
        resource=resource,
        held=held,
        holder=text(who) if held else "",
        token=int(token),
        remaining_ms=max(0, int(ms)) if held else 0,
        last_token=int(last),
        ttl_ms=int(ttl) if held else 0,
    )


def _event(row: list[Any]) -> LoggedEvent:
    """An event as the read scripts return it: revision, kind, resource, token, holder, ttl."""
    revision, kind, resource, token, holder, ttl_ms = row
    return LoggedEvent(
        int(revision),
        TransitionKind(text(kind)),
        text(resource),
        int(token),
        text(holder),
        int(ttl_ms),
    )
