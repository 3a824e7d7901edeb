"""Redis fenced store (``redis://``, ``rediss://``, ``redis+cluster://``), on redis-py asyncio.

A write is one Lua script (``guard/lua/write.lua``) that reads the resource's fence,
judges the token (the rule of :func:`guard.fence.admit`), applies every op (passed
as ARGV), advances the fence and records the idempotency key, or does nothing at
all. A resource's fence, data and idempotency keys share its hash tag (layout in
:mod:`fencing._redis`), so the same script runs on a Redis Cluster in one slot.

**Strict mode** (``supports_strict``): the write script also reads the lease hash
the Redis lease backend keeps for the resource (same slot) and requires the token
to be the live lease's; otherwise ``StaleTokenError`` with the current fence. This
holds only when the guard and the lease server use the same Redis (or cluster)
and the same key prefix; pointed anywhere else, strict mode finds no live lease and
rejects every write (it fails closed).

**Idempotency keys** are kept for ``idempotency_ttl_s`` (default 24 h; also
``?idempotency_ttl=<seconds>`` in the URL) and then expire by Redis's TTL. A replay
needs the key to be still remembered: keep the TTL longer than clients retry.
:meth:`RedisStore.prune_idempotency` therefore has nothing to do for cutoffs at or
before ``now - ttl`` and returns 0 without touching Redis; a later cutoff (a
retention shorter than the TTL) scans the prefix's idempotency keys (``SCAN``,
every primary of a cluster) and deletes those recorded before it. Recording times
are Redis's clock.

**Durability**: fences live only as long as Redis keeps them. See
:attr:`RedisStore.durability_warning` and ``require_durable`` (as for the lease
backend): a Redis that forgets a fence lets a stale token write again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from fencing import _redis
from fencing._redis import Client, RedisTarget, ResourceKeys, driver_errors, text
from fencing.errors import InvalidArgumentError, StaleTokenError
from fencing.types import Op, Put, Record
from guard.fence import FenceMode
from guard.stores.base import WriteResult

log = logging.getLogger(__name__)

_LUA = "guard.lua"
WRITE_LUA = _redis.load_lua(_LUA, "write")
FENCE_LUA = _redis.load_lua(_LUA, "fence")
PRUNE_LUA = _redis.load_lua(_LUA, "prune")

DEFAULT_IDEMPOTENCY_TTL_S = 24 * 3600


class RedisStore:
    """Fences and data in Redis or a Redis Cluster.

    ``url`` and ``prefix`` as for :class:`~lease_server.backends.redis.RedisBackend`;
    use the lease backend's for strict mode. ``idempotency_ttl_s``: how long an
    idempotency key is remembered (default 24 h, or ``?idempotency_ttl=`` seconds).
    ``require_durable``: refuse to open on a Redis whose persistence settings can
    lose fences. After :meth:`open`, ``durability_warning`` and ``cluster`` as for
    the backend.
    """

    name = "redis"
    supports_strict = True

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str | None = None,
        idempotency_ttl_s: float | None = None,
        require_durable: bool | None = None,
    ) -> None:
        target = _redis.parse_url(url, own=("idempotency_ttl",))
        self.target: RedisTarget = target
        self.prefix = _redis.check_prefix(prefix) if prefix is not None else target.prefix
        if idempotency_ttl_s is None:
            idempotency_ttl_s = float(
                target.options.get("idempotency_ttl", DEFAULT_IDEMPOTENCY_TTL_S)
            )
        if idempotency_ttl_s <= 0:
            raise InvalidArgumentError(
                "the idempotency ttl must be positive seconds", field="idempotency_ttl"
            )
        self.idempotency_ttl_ms = round(idempotency_ttl_s * 1000)
        self.require_durable = (
            target.require_durable if require_durable is None else require_durable
        )
        self.durability_warning: str | None = None
        self.cluster = False
        self._client: Client | None = None
        self._scripts: dict[str, AsyncScript] = {}

    async def open(self) -> None:
        if self._client is not None:
            return
        target = dataclasses.replace(self.target, require_durable=self.require_durable)
        client, self.durability_warning = await _redis.open_client(target, "redis guard store")
        self.cluster = isinstance(client, RedisCluster)
        self._client = client
        self._scripts = {
            "write": client.register_script(WRITE_LUA),
            "fence": client.register_script(FENCE_LUA),
            "prune": client.register_script(PRUNE_LUA),
        }

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def healthy(self) -> bool:
        """Redis answers PING (see ``fencing._storage.HealthProbe``)."""
        if self._client is None:
            return False
        try:
            return bool(await self._client.ping())
        except Exception:
            return False

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("RedisStore is not open")
        return self._client

    async def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        if self._client is None:
            raise RuntimeError("RedisStore is not open")
        with driver_errors(script):
            return await self._scripts[script](keys=keys, args=args)

    async def write(
        self,
        resource: str,
        token: int,
        ops: Sequence[Op],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> WriteResult:
        keys = ResourceKeys(self.prefix, resource)
        args: list[Any] = [
            str(token),
            mode.value,
            "1" if idempotency_key else "0",
            self.idempotency_ttl_ms,
            len(ops),
        ]
        for op in ops:
            if isinstance(op, Put):
                args += ["P", op.key, op.value]
            else:
                args += ["D", op.key, ""]
        outcome, fence = await self._run(
            "write",
            [keys.fence, keys.data, keys.idempotency(idempotency_key), keys.lease],
            args,
        )
        kind = text(outcome)
        if kind == "ok":
            return WriteResult(int(fence))
        if kind == "replayed":
            return WriteResult(int(fence), replayed=True)
        if kind == "not_live":
            raise StaleTokenError(
                f"token {token} is not the live lease of {resource!r} (strict mode)",
                resource=resource,
                token=token,
                current_token=int(fence),
            )
        raise StaleTokenError(resource=resource, token=token, current_token=int(fence))

    async def read(self, resource: str, key: str) -> Record | None:
        keys = ResourceKeys(self.prefix, resource)
        with driver_errors("read"):
            raw = await self.client.hget(keys.data, key)
        if raw is None:
            return None
        blob = raw if isinstance(raw, bytes) else raw.encode("utf-8")
        token, _, value = blob.partition(b":")
        return Record(value, int(token))

    async def fence(self, resource: str, token: int) -> int:
        keys = ResourceKeys(self.prefix, resource)
        outcome, fence = await self._run("fence", [keys.fence], [str(token)])
        if text(outcome) != "ok":
            raise StaleTokenError(resource=resource, token=token, current_token=int(fence))
        return int(fence)

    async def describe_fence(self, resource: str) -> int:
        keys = ResourceKeys(self.prefix, resource)
        with driver_errors("describe_fence"):
            raw = await self.client.get(keys.fence)
        return int(raw) if raw is not None else 0

    async def prune_idempotency(self, older_than_ms: int) -> int:
        """Forget idempotency keys recorded before ``older_than_ms``; see the module doc.

        Returns 0 at once when the TTL has already removed them all.
        """
        if older_than_ms <= time.time_ns() // 1_000_000 - self.idempotency_ttl_ms:
            return 0
        pattern = f"{_redis.glob_escape(self.prefix)}:{{*}}:idem:*"
        pruned = 0
        for key in await _redis.scan_keys(self.client, pattern):
            pruned += int(await self._run("prune", [text(key)], [str(max(0, older_than_ms))]))
        return pruned
