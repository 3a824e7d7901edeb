"""Redis plumbing shared by the Redis lease backend and the Redis guard store.

**URLs.** ``redis://[user:pass@]host:port/db`` (``rediss://`` for TLS) names one
server; ``redis+cluster://host:port`` (``rediss+cluster://``) a Redis Cluster,
reached through any of its nodes. A plain ``redis://`` URL that points at a
cluster node is detected (``INFO cluster``) and used as a cluster too. Query
parameters of ours, removed before redis-py sees the rest:

==================  ==========================================================
``prefix``          key prefix, default ``fencing`` (must not contain ``{``/``}``)
``require_durable`` ``1``/``true``: refuse to open on a Redis that may forget or evict
``idempotency_ttl`` seconds a guard idempotency key is kept (store only)
==================  ==========================================================

redis-py's own query parameters (``socket_timeout=``, ``ssl_cert_reqs=``...) pass
through. Socket and connect timeouts default to 2 s, so every call is bounded.

**No automatic retries.** redis-py 8 retries a failed command up to 10 times by
default; re-sending an acquire or a write script after a timeout could apply it
twice. Every client here is built with ``Retry(NoBackoff(), 0)`` (the cluster
client too), so a command is sent at most once; the caller (or the SDK, with an
acquire ``request_id`` or a write's idempotency key) decides whether to retry.
Cluster redirections (MOVED/ASK) are still followed: the node that answered them
did not run the command.

**Key layout.** Every key of a resource carries the resource as its Redis Cluster
hash tag, so all of them live in one slot and each script touches one slot::

    <prefix>:{<tag>}:lease        hash holder/token/request_id, PEXPIRE = the lease's ttl
    <prefix>:{<tag>}:counter      last token issued (decimal string), never deleted
    <prefix>:{<tag>}:fence        guard fence (decimal string)
    <prefix>:{<tag>}:data         hash: key -> "<token>:<value bytes>"
    <prefix>:{<tag>}:idem:<key>   "<fence>:<token>:<recorded_at_ms>" (the token that applied
                                  it), expires after the idempotency ttl
    <prefix>:released             pub/sub channel; message = the released resource, raw
    <prefix>:events               pub/sub channel of the lease event log (see below)

The lease backend's event log (:mod:`lease_server.backends.redis`) lives, on one
Redis, in keys outside every resource's (no brace after the prefix, so no resource
key can be one of them), and on a Redis Cluster under each resource's own tag::

    <prefix>:events:log|head|compacted|owed|due   one Redis: the one log of every resource
    <prefix>:{<tag>}:events|revision|compacted|owed   a cluster: the resource's own log

``<tag>`` is the resource with ``%`` -> ``%25``, ``{`` -> ``%7B`` and ``}`` -> ``%7D``
(:func:`escape_tag`): the hash tag is the text between the first ``{`` and the next
``}``, so with no brace left in the tag (and none allowed in the prefix) it is
always exactly the whole resource; the encoding is injective, so two resources
never share keys. Tokens and fences are stored and compared as decimal strings
(Lua numbers are doubles, exact only to 2**53; tokens go to 2**63 - 1).

**Errors.** Driver errors that mean "Redis is unreachable, busy or failing over"
become :class:`~fencing.errors.BackendUnavailableError` with the cause chained, here,
once (:func:`driver_errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeAlias
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.crc import key_slot

from fencing.errors import BackendUnavailableError, InvalidArgumentError
from fencing.redis import escape_tag as escape_tag  # tests/unit/test_redis_keys.py
from fencing.redis import unescape_tag as unescape_tag  # lease_server.backends.redis
from serving import urls
from serving.urls import redact

log = logging.getLogger(__name__)

Client: TypeAlias = "Redis | RedisCluster"

DEFAULT_PREFIX = "fencing"
DEFAULT_SOCKET_TIMEOUT = 2.0
DEFAULT_CONNECT_TIMEOUT = 2.0
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """A parsed Redis URL: what redis-py gets, and our own options."""

    url: str  # redis:// or rediss://, our parameters removed
    cluster: bool  # True: the URL said +cluster; False: detect on connect
    prefix: str
    require_durable: bool
    options: Mapping[str, str]  # our other parameters (e.g. idempotency_ttl)


def check_prefix(prefix: str) -> str:
    if not prefix or "{" in prefix or "}" in prefix:
        raise InvalidArgumentError(
            f"redis key prefix {prefix!r} must be non-empty and free of '{{' and '}}'",
            field="prefix",
        )
    return prefix


@functools.cache
def _redis_params() -> frozenset[str]:
    """The query parameters redis-py passes on to a connection: its URL parsers' and the
    keyword arguments of its connection classes."""
    from redis.asyncio.connection import AbstractConnection
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS

    names = set(URL_QUERY_ARGUMENT_PARSERS)
    for cls in (AbstractConnection, Connection, SSLConnection):
        names |= set(inspect.signature(cls.__init__).parameters) - {"self", "args", "kwargs"}
    return frozenset(names)


def parse_url(url: str, *, own: tuple[str, ...] = ()) -> RedisTarget:
    """Split a ``redis://`` / ``redis+cluster://`` URL into redis-py's URL and our options.

    ``own`` names further query parameters the caller understands (kept in ``options``).
    """
    parts = urlsplit(url)
    scheme = parts.scheme
    if urls.SCHEMES.get(scheme) != urls.REDIS:
        raise InvalidArgumentError(f"not a redis URL: {url!r}", field="url")
    cluster = scheme.endswith("+cluster")
    base = scheme.removesuffix("+cluster")
    mine, rest = urls.split_params(
        url,
        ("prefix", "require_durable", "cluster", *own),
        driver=_redis_params(),
        driver_hint="a redis-py connection parameter (socket_timeout, protocol, "
        "ssl_cert_reqs, ...)",
        what="redis",
        field="url",
    )
    if mine.get("cluster", "").lower() in _TRUE:
        cluster = True
    return RedisTarget(
        url=urlunsplit((base, parts.netloc, parts.path, urlencode(rest), parts.fragment)),
        cluster=cluster,
        prefix=check_prefix(mine.get("prefix", DEFAULT_PREFIX)),
        require_durable=mine.get("require_durable", "").lower() in _TRUE,
        options={k: v for k, v in mine.items() if k in own},
    )


def _client_kwargs(url: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"retry": Retry(NoBackoff(), 0)}
    query = dict(parse_qsl(urlsplit(url).query))
    if "protocol" not in query:
        # RESP2: redis-py hands every RESP3 pub/sub message (a push) to a handler that
        # builds a debug line of it, logged or not; RESP2 delivers it as a plain reply.
        kwargs["protocol"] = 2
    if "socket_timeout" not in query:
        kwargs["socket_timeout"] = DEFAULT_SOCKET_TIMEOUT
    if "socket_connect_timeout" not in query:
        kwargs["socket_connect_timeout"] = DEFAULT_CONNECT_TIMEOUT
    return kwargs


_pack: Callable[[tuple[Any, ...]], bytes] | None
try:  # hiredis comes with the redis extra; without it, redis-py packs as usual
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover
    _pack = None


class _Connection(Connection):
    """redis-py's connection, with a cancellation it swallowed while sending raised again,
    and commands packed by hiredis.

    **Cancellation.** redis-py writes each command through ``asyncio.wait_for`` (a socket
    timeout is always set here), and on Python 3.11 ``wait_for`` returns the write's result
    instead of raising when the write finishes in the same loop turn as the cancellation
    arrives (serving.tasks). The task then goes on to read the reply and return as if never
    cancelled. On a loaded machine that is the likely case, not a rare one: the process gets
    the CPU back with the reply and a due re-cancel timer both ready, the task runs first
    into its next command's ``wait_for``, and the cancel lands there, on every re-cancel in a
    row. A cancellation requested during the send and not withdrawn (``asyncio.timeout``
    withdraws its own with ``uncancel``) was swallowed, so it is raised here, after closing
    the connection as redis-py does for a send cancelled the ordinary way.

    **Packing.** hiredis's C packer instead of redis-py's Python one: the guard's batches
    and the lease sessions send thousands of arguments per call, and packing them in Python
    cost more CPU than everything else the guard does per write. Anything hiredis cannot
    pack (a memoryview) falls back to redis-py's packer.
    """

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        task = asyncio.current_task()
        asked = task.cancelling() if task is not None else 0
        await super().send_packed_command(command, check_health)
        if task is not None and task.cancelling() > asked:
            await self.disconnect(nowait=True)
            raise asyncio.CancelledError

    def pack_command(self, *args: Any) -> list[bytes]:
        if _pack is None:  # pragma: no cover
            return super().pack_command(*args)
        if isinstance(args[0], str) and " " in args[0]:
            args = (*args[0].split(), *args[1:])  # 'CONFIG GET' goes as two words
        try:
            return [_pack(args)]
        except TypeError:
            return super().pack_command(*args)


class _SSLConnection(_Connection, SSLConnection):
    pass


def _ours(connection_class: type[Connection]) -> type[Connection]:
    return _SSLConnection if issubclass(connection_class, SSLConnection) else _Connection


def standalone_client(url: str) -> Redis:
    """A client of one server that never re-sends a command."""
    kwargs = _client_kwargs(url)
    tls = urlsplit(url).scheme == "rediss"
    kwargs["connection_class"] = _SSLConnection if tls else _Connection
    return Redis.from_url(url, **kwargs)


def cluster_client(url: str) -> RedisCluster:
    """A cluster client that never re-sends a command (only follows MOVED/ASK)."""
    client = RedisCluster.from_url(url, **_client_kwargs(url))
    # RedisCluster takes no connection class: it picks one from ``ssl`` into the kwargs
    # every node is built from (shared with its NodesManager), and has built the startup
    # nodes from them already.
    kwargs = client.connection_kwargs
    kwargs["connection_class"] = _ours(kwargs["connection_class"])
    for node in client.startup_nodes:
        node.connection_class = _ours(node.connection_class)
    return client


async def connect(target: RedisTarget) -> Client:
    """Connect to the server or cluster ``target`` names; detect a cluster behind redis://."""
    with driver_errors("connect"):
        if target.cluster:
            client: Client = cluster_client(target.url)
            await client.initialize()
            return client
        single = standalone_client(target.url)
        try:
            info = await single.info("cluster")
        except BaseException:
            await single.aclose()
            raise
        if not info.get("cluster_enabled"):
            return single
        await single.aclose()
        log.info("%s is a Redis Cluster node: using the cluster client", redact(target.url))
        client = cluster_client(target.url)
        await client.initialize()
        return client


# -- keys ----------------------------------------------------------------------------------


class ResourceKeys:
    """The keys of one resource under ``prefix``; all share the resource's hash slot."""

    __slots__ = ("base", "counter", "data", "fence", "lease")

    def __init__(self, prefix: str, resource: str) -> None:
        self.base = f"{prefix}:{{{escape_tag(resource)}}}"
        self.lease = f"{self.base}:lease"
        self.counter = f"{self.base}:counter"
        self.fence = f"{self.base}:fence"
        self.data = f"{self.base}:data"

    def idempotency(self, key: str) -> str:
        return f"{self.base}:idem:{key}"


def slot_groups(keys: Sequence[str], *, cluster: bool) -> list[list[int]]:
    """Positions of ``keys`` grouped by Redis Cluster hash slot, in order within each
    group; on one Redis (``cluster=False``) a single group of all of them."""
    if not cluster:
        return [list(range(len(keys)))] if keys else []
    groups: dict[int, list[int]] = {}
    for n, key in enumerate(keys):
        groups.setdefault(key_slot(key.encode()), []).append(n)
    return list(groups.values())


def release_channel(prefix: str) -> str:
    """The pub/sub channel releases are announced on (payload: the resource)."""
    return f"{prefix}:released"


def events_channel(prefix: str) -> str:
    """The pub/sub channel the lease event log announces appends on."""
    return f"{prefix}:events"


@dataclass(frozen=True, slots=True)
class EventLogKeys:
    """The keys of a lease event log, in the order its scripts take them (``due`` only
    on one Redis: see ``lease_server/lua/eventlog.lua``)."""

    log: str
    head: str
    compacted: str
    owed: str
    due: str | None = None

    @classmethod
    def shared(cls, prefix: str) -> EventLogKeys:
        """The one log of every resource under ``prefix`` (one Redis)."""
        base = f"{prefix}:events"
        return cls(
            f"{base}:log", f"{base}:head", f"{base}:compacted", f"{base}:owed", f"{base}:due"
        )

    @classmethod
    def of(cls, keys: ResourceKeys) -> EventLogKeys:
        """A resource's own log, in its hash slot (Redis Cluster)."""
        base = keys.base
        return cls(f"{base}:events", f"{base}:revision", f"{base}:compacted", f"{base}:owed")

    def all(self) -> list[str]:
        return [self.log, self.head, self.compacted, self.owed, *([self.due] if self.due else [])]


def glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis glob pattern (SCAN MATCH)."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


async def scan_keys(client: Client, pattern: str, count: int = 1000) -> list[bytes]:
    """Every key matching ``pattern`` on the server, or on every primary of a cluster."""
    found: list[bytes] = []
    with driver_errors("scan"):
        # The cluster client's scan_iter walks every primary in turn.
        async for key in client.scan_iter(match=pattern, count=count):
            found.append(key)
    return found


# -- Lua -----------------------------------------------------------------------------------


def load_lua(package: str, name: str, *, helpers: tuple[str, ...] = ()) -> str:
    """The text of ``<package>/<name>.lua``, preceded by the shared decimal helpers and
    then by ``<package>/<helper>.lua`` for each of ``helpers``, in that order."""
    parts = [resources.files("fencing.lua").joinpath("decimal.lua").read_text("utf-8")]
    for helper in (*helpers, name):
        parts.append(resources.files(package).joinpath(f"{helper}.lua").read_text("utf-8"))
    return "\n".join(parts)


def text(value: bytes | str | None) -> str:
    """A Redis reply (bytes) as text; None -> ''."""
    if value is None:
        return ""
    return value.decode("utf-8") if isinstance(value, bytes) else value


# -- scripts in a pipeline -----------------------------------------------------------------

#: Rounds of loading a script the server lost and sending its calls again.
_NOSCRIPT_ROUNDS = 3


async def run_pipelined(
    client: Client, calls: Sequence[tuple[AsyncScript, list[str], list[Any]]]
) -> list[Any]:
    """``EVALSHA`` of each ``(script, keys, args)`` in one non-transactional pipeline (one
    round trip, run in order); the replies in order, the first error reply raised.

    redis-py asks ``SCRIPT EXISTS`` before each pipeline that carries scripts: a second
    round trip every time. Here the calls go as they are, and a script the server does
    not have (a restarted Redis, ``SCRIPT FLUSH``) answers ``NOSCRIPT``, which means it
    did not run: its scripts are loaded and those calls sent again, in their order. (A
    script lost and loaded again by someone else in the middle of one pipeline is the one
    case where a call sent again runs after calls that followed it; each still runs once.)
    """
    replies: list[Any] = [None] * len(calls)
    pending = list(range(len(calls)))
    for _ in range(_NOSCRIPT_ROUNDS):
        pipe = client.pipeline(transaction=False)
        for i in pending:
            script, keys, args = calls[i]
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        answers = await pipe.execute(raise_on_error=False)
        lost: list[int] = []
        for i, answer in zip(pending, answers, strict=True):
            if isinstance(answer, rexc.NoScriptError):
                lost.append(i)
            replies[i] = answer
        if not lost:
            break
        for script in {id(calls[i][0]): calls[i][0] for i in lost}.values():
            script.sha = await client.script_load(script.script)
        pending = lost
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


# -- errors --------------------------------------------------------------------------------

#: Error replies that mean "not now": loading, failing over, out of memory, busy script.
_TRANSIENT_REPLIES = ("LOADING", "MASTERDOWN", "READONLY", "BUSY", "CLUSTERDOWN", "TRYAGAIN", "OOM")


@contextlib.contextmanager
def driver_errors(what: str) -> Iterator[None]:
    """Turn redis-py's "unavailable" errors into ``BackendUnavailableError`` (cause chained).

    Other ``ResponseError`` replies (a script bug, a wrong key type) propagate as they
    are: they are faults to fix, not outages to retry.
    """
    try:
        yield
    except (
        rexc.ConnectionError,  # also BusyLoadingError, MaxConnectionsError
        rexc.TimeoutError,
        rexc.ClusterError,  # ClusterDownError, MasterDownError
        rexc.SlotNotCoveredError,
        rexc.TryAgainError,
        rexc.ReadOnlyError,
        OSError,
    ) as exc:
        raise BackendUnavailableError(f"redis unavailable during {what}: {exc}") from exc
    except rexc.OutOfMemoryError as exc:
        # redis-py strips the "OOM" code from the text: match the class. Under
        # maxmemory-policy noeviction this is Redis refusing a write it has no room
        # for, instead of deleting keys to make room: nothing was applied.
        raise BackendUnavailableError(f"redis is out of memory during {what}: {exc}") from exc
    except rexc.ResponseError as exc:
        if str(exc).startswith(_TRANSIENT_REPLIES):
            raise BackendUnavailableError(f"redis refused {what}: {exc}") from exc
        raise
    except rexc.RedisClusterException as exc:
        raise BackendUnavailableError(f"redis cluster unavailable during {what}: {exc}") from exc


# -- durability ----------------------------------------------------------------------------


def _config_map(reply: Any) -> dict[str, str]:
    # RESP3 answers CONFIG GET with a map, RESP2 with a flat list.
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        items = list(zip(reply[::2], reply[1::2], strict=True))
    return {text(k): text(v) for k, v in items}


def judge_durability(config: Mapping[str, str]) -> str | None:
    """Why counters and fences in a Redis with this persistence config are not durable.

    Durable means the AOF is on with ``appendfsync always`` or ``everysec`` (a Redis
    crash loses nothing already answered; an OS crash or power loss can lose the last
    second with ``everysec``). None when durable.
    """
    appendonly = config.get("appendonly", "").lower()
    fsync = config.get("appendfsync", "").lower()
    save = config.get("save", "").strip()
    if appendonly != "yes":
        if save:
            return (
                "AOF is off (appendonly no) and only RDB snapshots are taken (save "
                f"{save!r}): a Redis crash forgets every counter, fence and idempotency "
                "key written since the last snapshot"
            )
        return (
            "persistence is off (appendonly no, save ''): a Redis restart forgets every "
            "counter, fence and idempotency key"
        )
    if fsync not in ("always", "everysec"):
        return (
            f"AOF is on but appendfsync is {fsync or 'unknown'!r}: the OS decides when "
            "writes reach disk, so a host crash can forget recent counters and fences"
        )
    return None


def judge_eviction(config: Mapping[str, str]) -> str | None:
    """Why a Redis with this memory config may delete our keys under memory pressure.

    With ``maxmemory`` set (not 0) every policy but ``noeviction`` deletes keys when
    the limit is reached: ``volatile-*`` the keys with a TTL (leases, so a second
    holder is granted while the first's lease is unexpired, and idempotency keys, so
    a retried write is applied twice), ``allkeys-*`` any key (fences, so a stale token
    is accepted again, and counters). ``noeviction`` answers writes with an OOM error
    instead, which the servers report as ``BACKEND_UNAVAILABLE``. None when safe.
    """
    policy = config.get("maxmemory-policy", "").lower()
    limit = config.get("maxmemory", "").strip()
    if not limit or limit == "0" or policy == "noeviction":
        return None
    if policy.startswith("volatile-"):
        lost = (
            "leases (a second holder while the first's lease is unexpired) and "
            "idempotency keys (a retried write applied twice)"
        )
    else:
        lost = "fences (a stale token accepted again), counters and leases"
    return (
        f"maxmemory-policy is {policy or 'unknown'!r} with maxmemory {limit} bytes: at the "
        f"limit Redis evicts {lost}; set maxmemory-policy noeviction"
    )


#: What :func:`durability_warning` reads: persistence, and whether Redis may evict.
_SETTINGS = ("appendonly", "appendfsync", "save", "maxmemory", "maxmemory-policy")


async def durability_warning(client: Client) -> str | None:
    """Read CONFIG GET of the persistence and memory settings on the server (every
    primary of a cluster) and say why what it holds may be forgotten (not persisted,
    or evicted: :func:`judge_durability`, :func:`judge_eviction`), or None. CONFIG may
    be disabled (renamed, or a managed Redis): then say that it could not be checked."""
    nodes: list[tuple[str, Any]] = []
    if isinstance(client, RedisCluster):
        nodes = [(node.name, node) for node in client.get_primaries()]
    else:
        kw = client.connection_pool.connection_kwargs
        nodes = [(f"{kw.get('host', '?')}:{kw.get('port', '?')}", None)]
    problems: list[str] = []
    for name, node in nodes:
        args = ("CONFIG", "GET", *_SETTINGS)
        try:
            with driver_errors("CONFIG GET"):
                if node is None:
                    reply = await client.execute_command(*args)
                else:
                    reply = await client.execute_command(*args, target_nodes=node)
        except rexc.ResponseError as exc:
            problems.append(
                f"{name}: cannot read the persistence settings ({exc}); "
                "assume counters and fences are not durable"
            )
            continue
        config = _config_map(reply)
        for problem in (judge_durability(config), judge_eviction(config)):
            if problem:
                problems.append(f"{name}: {problem}")
    return "; ".join(problems) or None


async def open_client(target: RedisTarget, what: str) -> tuple[Client, str | None]:
    """Connect, and read the durability of what answered (see :func:`durability_warning`).

    Returns the warning for the server to log once (``serving.server.require_durability``
    logs every component's); with ``target.require_durable`` raises
    ``InvalidArgumentError`` instead (the client closed). ``what`` names the user in
    messages.
    """
    client = await connect(target)
    try:
        warning = await durability_warning(client)
        if warning is not None and target.require_durable:
            raise InvalidArgumentError(
                f"{what} refuses a Redis that is not durable (require_durable): {warning}",
                field="require_durable",
            )
    except BaseException:
        await client.aclose()
        raise
    return client, warning


class Health:
    """The health probe shared by the Redis lease backend and guard store: PING, and
    the durability settings read again (they can change at runtime with CONFIG SET,
    or by a failover to a differently configured replica).

    ``warning`` is the latest :func:`durability_warning`; a change is logged (a
    WARNING naming the setting when it turns bad). With ``require_durable`` a Redis
    that is no longer durable is unhealthy (the server reports NOT_SERVING), as it
    would have been refused at start.
    """

    def __init__(self, target: RedisTarget, what: str, warning: str | None = None) -> None:
        self.target = target
        self.what = what
        self.warning = warning

    async def healthy(self, client: Client | None) -> bool:
        if client is None:
            return False
        try:
            if not await client.ping():
                return False
            warning = await durability_warning(client)
        except Exception:
            return False
        if warning != self.warning:
            self.warning = warning
            if warning is None:
                log.warning("%s on %s is durable again", self.what, redact(self.target.url))
            else:
                log.warning(
                    "%s on %s is not durable: %s%s",
                    self.what,
                    redact(self.target.url),
                    warning,
                    " (require_durable: NOT_SERVING)" if self.target.require_durable else "",
                )
        return warning is None or not self.target.require_durable


class Probed:
    """The client and health probe of a Redis lease backend or guard store.

    The subclass sets ``target`` and ``require_durable`` and calls :meth:`_probe` in
    its ``__init__``, and opens its client with :meth:`_connect`; ``healthy`` and
    ``durability_warning`` come from here.
    """

    target: RedisTarget
    require_durable: bool
    _what: str
    _health: Health
    _client: Client | None

    def _probe(self, what: str) -> None:
        """Start unopened: ``what`` names the component in log lines."""
        self._what = what
        self._health = Health(self._durable_target(), what)
        self._client = None

    def _durable_target(self) -> RedisTarget:
        return dataclasses.replace(self.target, require_durable=self.require_durable)

    async def _connect(self) -> Client:
        """A client of the target (:func:`open_client`), refused unless durable with
        ``require_durable``; probed from now on with the durability it had."""
        target = self._durable_target()
        client, warning = await open_client(target, self._what)
        self._health = Health(target, self._what, warning)
        return client

    async def healthy(self) -> bool:
        """Redis answers PING and is still as durable as it was (:class:`Health`)."""
        return await self._health.healthy(self._client)

    @property
    def durability_warning(self) -> str | None:
        """None, or why tokens and fences in this Redis may be forgotten (read at
        ``open`` and on every health probe)."""
        return self._health.warning


def url_for_node(url: str, host: str, port: int) -> str:
    """``url`` (credentials, TLS, options kept) pointed at another node ``host:port``."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    hostpart = f"[{host}]" if ":" in host else host
    return urlunsplit(parts._replace(netloc=f"{userinfo}{hostpart}:{port}"))
