"""Redis fenced store (``redis://``, ``rediss://``, ``redis+cluster://``), on redis-py asyncio.

A write is one Lua script (``guard/lua/write.lua``) that reads the resource's fence,
judges the token (the rule of :func:`guard.fence.admit`), applies every op (passed
as ARGV), advances the fence and records the idempotency key, or does nothing at
all. A resource's fence, data and idempotency keys share its hash tag (layout in
:mod:`serving.redis_db`), so the same script runs on a Redis Cluster in one slot.

**Strict mode** (``supports_strict``): the write script also reads the lease hash
the Redis lease backend keeps for the resource (same slot) and requires the token
to be the live lease's; otherwise ``LeaseLost`` (a token below the fence stays
``StaleTokenError``). This holds only when the guard and the lease server use the
same Redis (or cluster) and the same key prefix; pointed anywhere else, strict mode
finds no live lease and rejects every write (it fails closed). Jobs are not kept
in Redis (the lease server has no Redis queue backend), so a strict Redis guard
refuses job writes: fence jobs with promise or watch there, or use PostgreSQL.

**Multi-resource writes** (``write_many.lua``) touch every resource's keys in one
script: atomic on one Redis; on a Redis Cluster only when every resource hashes to
the same slot, and refused with ``INVALID_ARGUMENT`` otherwise (a script cannot
span slots, and anything else would not be atomic). **Batches** of independent
writes (``write_batch.lua``, the guard's group commit) go out as one pipeline of
scripts on one Redis, and as one chain of scripts per hash slot on a cluster.

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
backend): a Redis that forgets a fence (no persistence, or eviction under a
``maxmemory-policy`` other than ``noeviction``) lets a stale token write again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.crc import key_slot

from fencing.errors import InvalidArgumentError, LeaseLost, StaleTokenError
from fencing.types import Op, Put, Record
from guard.fence import FenceMode, not_live
from guard.stores.base import (
    BatchedWrite,
    ResourceWrite,
    StoreManyResult,
    StoreWriteResult,
    Verdict,
)
from serving import redis_db
from serving.redis_db import (
    Client,
    RedisTarget,
    ResourceKeys,
    driver_errors,
    run_pipelined,
    text,
)

log = logging.getLogger(__name__)

_LUA = "guard.lua"
WRITE_LUA = redis_db.load_lua(_LUA, "write", helpers=("fenced",))
WRITE_MANY_LUA = redis_db.load_lua(_LUA, "write_many", helpers=("fenced",))
WRITE_BATCH_LUA = redis_db.load_lua(_LUA, "write_batch", helpers=("fenced",))
#: Writes per write_batch.lua call: bounds how long one call keeps Redis busy.
BATCH_CHUNK = 256
FENCE_LUA = redis_db.load_lua(_LUA, "fence")
RESET_FENCE_LUA = redis_db.load_lua(_LUA, "reset_fence")
PRUNE_LUA = redis_db.load_lua(_LUA, "prune")

DEFAULT_IDEMPOTENCY_TTL_S = 24 * 3600


@dataclasses.dataclass(frozen=True, slots=True)
class _Call:
    """One write_batch.lua call: which writes of the batch, and its keys and arguments."""

    writes: list[int]
    keys: list[str]
    args: list[Any]


def _op_args(ops: Sequence[Op]) -> list[Any]:
    args: list[Any] = []
    for op in ops:
        if isinstance(op, Put):
            args += ["P", op.key, op.value]
        else:
            args += ["D", op.key, ""]
    return args


def _refusal(
    resource: str, token: int, outcome: str, fence: int, has_key: bool, applied_by: int
) -> StaleTokenError | LeaseLost:
    key_applied = applied_by != 0 if has_key else None
    if outcome == "not_live":
        return not_live(resource, token, key_applied, applied_by)
    return StaleTokenError(
        resource=resource,
        token=token,
        current_token=fence,
        key_applied=key_applied,
        applied_by_token=applied_by,
    )


def _verdict(
    resource: str, token: int, outcome: str, fence: int, has_key: bool, applied_by: int
) -> Verdict:
    if outcome == "ok":
        return StoreWriteResult(fence)
    if outcome == "replayed":
        return StoreWriteResult(fence, applied_by)
    return _refusal(resource, token, outcome, fence, has_key, applied_by)


async def _chains(script: AsyncScript, chains: list[list[int]], calls: list[_Call]) -> list[Any]:
    """Run each chain's calls one after another, the chains concurrently; replies in order."""
    replies: list[Any] = [None] * len(calls)

    async def run(chain: list[int]) -> None:
        for n in chain:
            replies[n] = await script(keys=calls[n].keys, args=calls[n].args)

    await asyncio.gather(*(run(chain) for chain in chains))
    return replies


class RedisStore(redis_db.Probed):
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
    commit_concurrency = 2

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str | None = None,
        idempotency_ttl_s: float | None = None,
        require_durable: bool | None = None,
    ) -> None:
        target = redis_db.parse_url(url, own=("idempotency_ttl",))
        self.target: RedisTarget = target
        self.prefix = redis_db.check_prefix(prefix) if prefix is not None else target.prefix
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
        self._probe("redis guard store")
        self.cluster = False
        self._scripts: dict[str, AsyncScript] = {}

    async def open(self) -> None:
        if self._client is not None:
            return
        client = await self._connect()
        self.cluster = isinstance(client, RedisCluster)
        self._client = client
        self._scripts = {
            "write": client.register_script(WRITE_LUA),
            "write_many": client.register_script(WRITE_MANY_LUA),
            "write_batch": client.register_script(WRITE_BATCH_LUA),
            "fence": client.register_script(FENCE_LUA),
            "reset_fence": client.register_script(RESET_FENCE_LUA),
            "prune": client.register_script(PRUNE_LUA),
        }

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

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
    ) -> StoreWriteResult:
        keys = ResourceKeys(self.prefix, resource)
        args: list[Any] = [
            str(token),
            mode.value,
            "1" if idempotency_key else "0",
            self.idempotency_ttl_ms,
            len(ops),
            *_op_args(ops),
        ]
        outcome, fence, by = await self._run(
            "write",
            [keys.fence, keys.data, keys.idempotency(idempotency_key), keys.lease],
            args,
        )
        verdict = _verdict(
            resource, token, text(outcome), int(fence), bool(idempotency_key), int(by)
        )
        if isinstance(verdict, StaleTokenError | LeaseLost):
            raise verdict
        return verdict

    async def write_many(
        self,
        writes: Sequence[ResourceWrite],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> StoreManyResult:
        # Sorted, so the script judges (and names the first stale) in sorted order.
        order = sorted(range(len(writes)), key=lambda i: writes[i].resource)
        resource_keys = [ResourceKeys(self.prefix, writes[i].resource) for i in order]
        if self.cluster and len({key_slot(k.fence.encode()) for k in resource_keys}) > 1:
            raise InvalidArgumentError(
                "on a Redis Cluster a multi-resource write is atomic only within one hash "
                "slot, and these resources live in different slots: use one resource, a "
                "standalone Redis, or PostgreSQL",
                field="writes",
            )
        keys: list[str] = []
        for k in resource_keys:
            keys += [k.fence, k.data, k.idempotency(idempotency_key), k.lease]
        args: list[Any] = [
            mode.value,
            "1" if idempotency_key else "0",
            self.idempotency_ttl_ms,
            len(writes),
            order.index(0) + 1,
        ]
        for i in order:
            args += [str(writes[i].token), len(writes[i].ops), *_op_args(writes[i].ops)]
        reply = await self._run("write_many", keys, args)
        kind = text(reply[0])
        if kind in ("ok", "replayed"):
            n = len(writes)
            fences = [0] * n
            by = [0] * n
            for position, i in enumerate(order):
                fences[i] = int(reply[1 + position])
                if kind == "replayed":
                    by[i] = int(reply[1 + n + position])
            if kind == "replayed":
                return StoreManyResult(tuple(fences), True, tuple(by))
            return StoreManyResult(tuple(fences))
        w = writes[order[int(reply[1]) - 1]]
        raise _refusal(
            w.resource, w.token, kind, int(reply[2]), bool(idempotency_key), int(reply[3])
        )

    async def write_batch(
        self, writes: Sequence[BatchedWrite], mode: FenceMode = FenceMode.MONOTONIC
    ) -> list[Verdict]:
        """write_batch.lua calls of up to BATCH_CHUNK writes. On one Redis they go out in
        one pipeline (one round trip, run in order); on a cluster, one chain of calls per
        hash slot (each slot's writes in order), the slots concurrently."""
        if self._client is None:
            raise RuntimeError("RedisStore is not open")
        keyed = [(w, ResourceKeys(self.prefix, w.resource)) for w in writes]
        groups: dict[int, list[int]] = {}
        for i, (_, k) in enumerate(keyed):
            groups.setdefault(key_slot(k.fence.encode()) if self.cluster else 0, []).append(i)
        calls: list[_Call] = []
        chains: list[list[int]] = []
        for indexes in groups.values():
            chains.append([])
            for start in range(0, len(indexes), BATCH_CHUNK):
                chunk = indexes[start : start + BATCH_CHUNK]
                keys: list[str] = []
                args: list[Any] = [mode.value, self.idempotency_ttl_ms, len(chunk)]
                for i in chunk:
                    w, k = keyed[i]
                    keys += [k.fence, k.data, k.idempotency(w.idempotency_key), k.lease]
                    args += [
                        str(w.token),
                        "1" if w.idempotency_key else "0",
                        len(w.ops),
                        *_op_args(w.ops),
                    ]
                chains[-1].append(len(calls))
                calls.append(_Call(chunk, keys, args))
        script = self._scripts["write_batch"]
        with driver_errors("write_batch"):
            if self.cluster:
                replies = await _chains(script, chains, calls)
            else:
                replies = await run_pipelined(
                    self._client, [(script, call.keys, call.args) for call in calls]
                )
        verdicts: list[Verdict | None] = [None] * len(writes)
        for call, reply in zip(calls, replies, strict=True):
            for position, i in enumerate(call.writes):
                w = writes[i]
                verdicts[i] = _verdict(
                    w.resource,
                    w.token,
                    text(reply[3 * position]),
                    int(reply[3 * position + 1]),
                    bool(w.idempotency_key),
                    int(reply[3 * position + 2]),
                )
        return [v for v in verdicts if v is not None]

    async def read(self, resource: str, key: str) -> Record | None:
        keys = ResourceKeys(self.prefix, resource)
        with driver_errors("read"):
            raw = await self.client.hget(keys.data, key)
        return None if raw is None else _record_of(raw)

    async def list_records(
        self, resource: str, prefix: str, after: str, limit: int
    ) -> list[tuple[str, Record]]:
        # A resource's records are one hash: its field names are read whole (HKEYS,
        # the size of one resource's data), sorted here, and one page's values fetched.
        keys = ResourceKeys(self.prefix, resource)
        with driver_errors("list_records"):
            raw_names = await self.client.hkeys(keys.data)
            names = sorted(
                n
                for n in (r if isinstance(r, str) else r.decode("utf-8") for r in raw_names)
                if n > after and n.startswith(prefix)
            )[:limit]
            blobs = await self.client.hmget(keys.data, names) if names else []
        page: list[tuple[str, Record]] = []
        for name, raw in zip(names, blobs, strict=True):
            if raw is not None:  # else deleted between the two calls
                page.append((name, _record_of(raw)))
        return page

    async def fence(self, resource: str, token: int, mode: FenceMode = FenceMode.MONOTONIC) -> int:
        keys = ResourceKeys(self.prefix, resource)
        outcome, fence = await self._run(
            "fence", [keys.fence, keys.lease], [str(token), mode.value]
        )
        kind = text(outcome)
        if kind == "not_live":
            raise not_live(resource, token)
        if kind != "ok":
            raise StaleTokenError(resource=resource, token=token, current_token=int(fence))
        return int(fence)

    async def reset_fence(self, resource: str, to_token: int) -> int:
        """Never below the lease backend's counter when it shares this prefix
        (``INVALID_ARGUMENT`` naming ``to_token`` otherwise)."""
        keys = ResourceKeys(self.prefix, resource)
        outcome, value = await self._run("reset_fence", [keys.fence, keys.counter], [str(to_token)])
        if text(outcome) == "below":
            raise InvalidArgumentError(
                f"to_token {to_token} is below token {int(value)} already granted for {resource!r}",
                field="to_token",
            )
        return int(value)

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
        pattern = f"{redis_db.glob_escape(self.prefix)}:{{*}}:idem:*"
        pruned = 0
        for key in await redis_db.scan_keys(self.client, pattern):
            pruned += int(await self._run("prune", [text(key)], [str(max(0, older_than_ms))]))
        return pruned


def _record_of(raw: bytes | str) -> Record:
    """A record as the data hash keeps it: ``token:value``."""
    blob = raw if isinstance(raw, bytes) else raw.encode("utf-8")
    token, _, value = blob.partition(b":")
    return Record(value, int(token))
