"""Fenced writes to your own Redis keys, on the Redis you already run: no guard between.

A redis-py user holding a lease (or any object with ``resource`` and ``token``) writes
their own keys through one Lua script that judges the token against the resource's
fence, applies every op and advances the fence, all or nothing::

    from fencing.redis import FencedKeys, own_key

    keys = FencedKeys(redis.Redis())                  # AsyncFencedKeys: redis.asyncio
    balance = own_key("ledger", "balance")           # '{ledger}:balance'
    keys.set(lease, balance, b"100")                 # StaleTokenError if a newer token wrote

The rule and the error are the guard's (:class:`~fencing.errors.StaleTokenError` with
``current_token``; equal tokens write again; the fence never goes down), and the fence is
the very key the guard's Redis store uses (``<prefix>:{<tag>}:fence``), so writes through
a guard on the same Redis and prefix and direct writes share one fence.

**Cluster-safe by hash tag**: the script touches the fence and your keys in one slot, so
every key must carry the resource's hash tag (:func:`own_key` builds such a name); a key
in another slot is refused before anything is sent (``InvalidArgumentError``, field
``key``), on one Redis too, so code that moves to a cluster keeps working.

Not here: idempotency keys (use the guard for retried writes that must not apply twice),
multi-resource writes. Durability is your Redis's: a Redis that loses the fence key
(no AOF, or eviction) lets a stale token write again, as for the guard's Redis store.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from fencing.errors import InvalidArgumentError, StaleTokenError
from fencing.types import Delete, Fenced, Op, Put

#: The guard's default Redis key prefix: the same fences as its Redis store.
DEFAULT_PREFIX = "fencing"


def escape_tag(resource: str) -> str:
    """The hash tag for ``resource``: no braces left, reversible (``%`` escaped first)."""
    if not resource:
        raise InvalidArgumentError("resource must not be empty", field="resource")
    return resource.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def unescape_tag(tag: str) -> str:
    return tag.replace("%7D", "}").replace("%7B", "{").replace("%25", "%")


def own_key(resource: str, name: str) -> str:
    """A key of yours in ``resource``'s hash slot: ``{<tag>}:<name>``."""
    return f"{{{escape_tag(resource)}}}:{name}"


def fence_key(resource: str, prefix: str = DEFAULT_PREFIX) -> str:
    """Where the resource's fence lives (the guard's Redis store layout)."""
    return f"{prefix}:{{{escape_tag(resource)}}}:fence"


def _script_text() -> str:
    lua = resources.files("fencing.lua")
    return "\n".join(
        lua.joinpath(name).read_text("utf-8") for name in ("decimal.lua", "own_keys_write.lua")
    )


def _slot(key: str) -> int:
    from redis.crc import key_slot

    return int(key_slot(key.encode()))


def _prepare(
    prefix: str, fenced: Fenced, ops: Sequence[Op] | Op
) -> tuple[list[str], list[bytes | str]]:
    """The script's KEYS and ARGV for a write; ``InvalidArgumentError`` for a key outside
    the resource's slot (nothing sent)."""
    listed: list[Op] = [ops] if isinstance(ops, Put | Delete) else list(ops)
    if int(fenced.token) < 0:
        raise InvalidArgumentError("token must not be negative", field="token")
    fence = fence_key(fenced.resource, prefix)
    slot = _slot(fence)
    keys = [fence]
    args: list[bytes | str] = [str(int(fenced.token))]
    for op in listed:
        if _slot(op.key) != slot:
            raise InvalidArgumentError(
                f"key {op.key!r} is not in the hash slot of resource {fenced.resource!r}: "
                f"name it with the resource's hash tag, e.g. "
                f"{own_key(fenced.resource, op.key)!r} (fencing.redis.own_key)",
                field="key",
            )
        keys.append(op.key)
        if isinstance(op, Put):
            args += ["P", op.value]
        else:
            args += ["D", ""]
    return keys, args


def _verdict(fenced: Fenced, reply: Sequence[Any]) -> int:
    """The fence after the write, or the guard's ``StaleTokenError``."""
    outcome = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    fence = int(reply[1])
    if outcome == "stale":
        raise StaleTokenError(
            resource=fenced.resource, token=int(fenced.token), current_token=fence
        )
    return fence


class FencedKeys:
    """Fenced writes to your own keys through a blocking redis-py client (``Redis`` or
    ``RedisCluster``); ``prefix``: the guard's key prefix whose fences to share."""

    def __init__(self, client: Any, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self.prefix = prefix
        self._script = client.register_script(_script_text())

    def write(self, fenced: Fenced, ops: Sequence[Op] | Op) -> int:
        """Apply ``ops`` (puts and deletes, in order) iff ``fenced.token`` is not below
        the resource's fence; return the fence after it. ``StaleTokenError`` otherwise,
        with nothing applied."""
        keys, args = _prepare(self.prefix, fenced, ops)
        return _verdict(fenced, self._script(keys=keys, args=args))

    def set(self, fenced: Fenced, key: str, value: bytes) -> int:
        return self.write(fenced, Put(key, value))

    def fence(self, resource: str) -> int:
        """The resource's fence, 0 if never written."""
        return int(self.client.get(fence_key(resource, self.prefix)) or 0)


class AsyncFencedKeys:
    """:class:`FencedKeys` on a ``redis.asyncio`` client (``Redis`` or ``RedisCluster``)."""

    def __init__(self, client: Any, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self.prefix = prefix
        self._script = client.register_script(_script_text())

    async def write(self, fenced: Fenced, ops: Sequence[Op] | Op) -> int:
        keys, args = _prepare(self.prefix, fenced, ops)
        return _verdict(fenced, await self._script(keys=keys, args=args))

    async def set(self, fenced: Fenced, key: str, value: bytes) -> int:
        return await self.write(fenced, Put(key, value))

    async def fence(self, resource: str) -> int:
        return int(await self.client.get(fence_key(resource, self.prefix)) or 0)


__all__ = [
    "DEFAULT_PREFIX",
    "AsyncFencedKeys",
    "FencedKeys",
    "escape_tag",
    "fence_key",
    "own_key",
    "unescape_tag",
]
