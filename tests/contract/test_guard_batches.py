"""Multi-resource writes and batched writes: every store in tests/backends.py passes these.

``write_many`` is all or nothing over several resources; ``write_batch`` packs
independent writes into one transaction, each with the verdict it would get alone.
The concurrency tests run many writers at once and check, from the readers' side,
that no partial multi-write is ever visible and that a write refused on one
resource left nothing anywhere.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from fencing.errors import InvalidArgumentError, StaleTokenError
from fencing.types import Delete, Op, Put, Record
from guard.fence import FenceMode
from guard.stores.base import BatchedWrite, GuardStore, ResourceWrite, StoreWriteResult
from guard.stores.memory import MemoryStore
from serving.redis_db import ResourceKeys


def co_located(store: GuardStore, count: int, base: str = "m") -> list[str]:
    """``count`` resource names a multi-write may span: any on one server; on a Redis
    Cluster, names whose keys share one hash slot (found by trying names)."""
    if not getattr(store, "cluster", False):
        return [f"{base}-{i}" for i in range(count)]
    prefix = store.prefix  # type: ignore[attr-defined]
    first = f"{base}-0"
    slot = key_slot(ResourceKeys(prefix, first).fence.encode())
    names = [first]
    for i in itertools.count(1):
        name = f"{base}-{i}"
        if key_slot(ResourceKeys(prefix, name).fence.encode()) == slot:
            names.append(name)
            if len(names) == count:
                return names
    raise AssertionError("unreachable")


# -- write_many -----------------------------------------------------------------------------


async def test_write_many_applies_everything_and_advances_every_fence(
    guard_store: GuardStore,
) -> None:
    a, b, c = co_located(guard_store, 3)
    result = await guard_store.write_many(
        [
            ResourceWrite(b, 7, [Put("x", b"bx"), Put("y", b"by")]),
            ResourceWrite(a, 3, [Put("x", b"ax")]),
            ResourceWrite(c, 5),  # no ops: checked and fenced only
        ]
    )
    assert result.fences == (7, 3, 5) and not result.replayed
    assert await guard_store.read(a, "x") == Record(b"ax", 3)
    assert await guard_store.read(b, "y") == Record(b"by", 7)
    assert await guard_store.read(c, "x") is None
    assert [await guard_store.describe_fence(r) for r in (a, b, c)] == [3, 7, 5]


async def test_one_stale_token_refuses_the_whole_write(guard_store: GuardStore) -> None:
    a, b, c = co_located(guard_store, 3)
    await guard_store.write(b, 10, [Put("x", b"b10")])
    await guard_store.write(c, 10, [Put("x", b"c10")])
    with pytest.raises(StaleTokenError) as stale:
        await guard_store.write_many(
            [
                ResourceWrite(c, 9, [Put("x", b"stale")]),
                ResourceWrite(a, 50, [Put("x", b"a50"), Delete("y")]),
                ResourceWrite(b, 9, [Delete("x")]),
            ]
        )
    # The first stale resource in sorted order, whatever the request's order.
    assert (stale.value.resource, stale.value.token, stale.value.current_token) == (b, 9, 10)
    assert await guard_store.read(a, "x") is None
    assert await guard_store.read(b, "x") == Record(b"b10", 10)
    assert await guard_store.read(c, "x") == Record(b"c10", 10)
    assert [await guard_store.describe_fence(r) for r in (a, b, c)] == [0, 10, 10]


async def test_write_many_ops_apply_in_order(guard_store: GuardStore) -> None:
    a, b = co_located(guard_store, 2)
    await guard_store.write_many(
        [
            ResourceWrite(a, 1, [Put("k", b"1"), Delete("k"), Put("j", b"2"), Put("j", b"3")]),
            ResourceWrite(b, 1, [Put("k", b"b")]),
        ]
    )
    assert await guard_store.read(a, "k") is None
    assert await guard_store.read(a, "j") == Record(b"3", 1)


async def test_write_many_replays_its_idempotency_key(guard_store: GuardStore) -> None:
    a, b = co_located(guard_store, 2)
    writes = [ResourceWrite(a, 4, [Put("k", b"first")]), ResourceWrite(b, 6, [Put("k", b"f")])]
    first = await guard_store.write_many(writes, "op-1")
    again = await guard_store.write_many(
        [ResourceWrite(a, 4, [Put("k", b"second")]), ResourceWrite(b, 7, [Put("k", b"s")])],
        "op-1",
    )
    assert again.replayed and again.fences == first.fences == (4, 6)
    assert again.replayed_by_tokens == (4, 6) and first.replayed_by_tokens == ()
    assert await guard_store.read(a, "k") == Record(b"first", 4)
    assert await guard_store.read(b, "k") == Record(b"f", 6)
    # The key was recorded under each resource, as a single write's would be.
    assert (await guard_store.write(b, 6, [Put("k", b"x")], "op-1")).replayed_by_token == 6


async def test_write_many_judges_tokens_before_its_key(guard_store: GuardStore) -> None:
    """A repeat whose token went stale meanwhile is refused, not replayed, and says the
    key was applied (by which token) under the stale resource."""
    a, b = co_located(guard_store, 2)
    writes = [ResourceWrite(a, 4, [Put("k", b"first")]), ResourceWrite(b, 6, [Put("k", b"f")])]
    await guard_store.write_many(writes, "op-1")
    await guard_store.write(a, 8, [Put("k", b"later")])
    with pytest.raises(StaleTokenError) as stale:
        await guard_store.write_many(writes, "op-1")
    assert (stale.value.resource, stale.value.token, stale.value.current_token) == (a, 4, 8)
    assert stale.value.key_applied is True and stale.value.applied_by_token == 4
    with pytest.raises(StaleTokenError) as unknown:
        await guard_store.write_many(writes, "op-2")
    assert unknown.value.key_applied is False and unknown.value.applied_by_token == 0
    assert await guard_store.read(a, "k") == Record(b"later", 8)


async def test_write_many_control_mode_off_replays_to_a_stale_token(
    guard_store: GuardStore,
) -> None:
    """The control: unfenced, the stale repeat is answered as a success (a replay)."""
    a, b = co_located(guard_store, 2)
    writes = [ResourceWrite(a, 4, [Put("k", b"first")]), ResourceWrite(b, 6, [Put("k", b"f")])]
    await guard_store.write_many(writes, "op-1")
    await guard_store.write(a, 8, [Put("k", b"later")])
    result = await guard_store.write_many(writes, "op-1", FenceMode.OFF)
    assert result.replayed and result.replayed_by_tokens == (4, 6)


async def test_refused_write_many_records_no_key(guard_store: GuardStore) -> None:
    a, b = co_located(guard_store, 2)
    await guard_store.write(a, 5, [Put("k", b"v")])
    with pytest.raises(StaleTokenError):
        await guard_store.write_many(
            [ResourceWrite(a, 4, [Put("k", b"no")]), ResourceWrite(b, 1)], "op-x"
        )
    result = await guard_store.write_many(
        [ResourceWrite(a, 5, [Put("k", b"yes")]), ResourceWrite(b, 1)], "op-x"
    )
    assert not result.replayed and result.fences == (5, 1)


async def test_write_many_mode_off_lands_stale_tokens(guard_store: GuardStore) -> None:
    a, b = co_located(guard_store, 2)
    await guard_store.write(a, 9, [Put("k", b"new")])
    result = await guard_store.write_many(
        [ResourceWrite(a, 2, [Put("k", b"stale")]), ResourceWrite(b, 2)], mode=FenceMode.OFF
    )
    assert result.fences == (9, 2)
    assert await guard_store.read(a, "k") == Record(b"stale", 2)


async def test_cluster_refuses_resources_in_different_slots(guard_store: GuardStore) -> None:
    if not getattr(guard_store, "cluster", False):
        pytest.skip("only a Redis Cluster splits resources across slots")
    prefix = guard_store.prefix  # type: ignore[attr-defined]
    slots = {key_slot(ResourceKeys(prefix, f"s-{i}").fence.encode()): f"s-{i}" for i in range(50)}
    a, b = list(slots.values())[:2]
    with pytest.raises(InvalidArgumentError):
        await guard_store.write_many([ResourceWrite(a, 1, [Put("k", b"v")]), ResourceWrite(b, 1)])
    assert await guard_store.describe_fence(a) == 0


async def test_concurrent_multi_writes_are_atomic_and_never_deadlock(
    guard_store: GuardStore,
) -> None:
    """Writers put one value on every resource of a write (overlapping sets, shuffled
    order, tokens from one counter, some poisoned with a stale token on one resource);
    readers read the resources one after another meanwhile.

    Every accepted write carries one token t on all its resources, and accepted tokens
    only grow on each resource, so a reader that saw t on one resource must see >= t
    on any resource that write touched when it reads it afterwards: anything less is a
    write visible on one resource and not (yet) on another. No value of a refused write
    may ever be read anywhere, and no write may fail for any other reason (a deadlock
    between overlapping sets would).
    """
    names = co_located(guard_store, 4, "atom")
    for r in names:
        await guard_store.fence(r, 2)  # so a poisoned write's token 1 is always stale
    counter = itertools.count(3)
    accepted: dict[str, tuple[int, frozenset[str]]] = {}  # value -> token, resources
    refused: set[str] = set()
    observed: list[tuple[Record, str, Record]] = []  # a read, the resource read next, its read
    done = asyncio.Event()

    async def writer(w: int) -> None:
        rng = random.Random(w)
        for n in range(30):
            subset = rng.sample(names, rng.randint(2, len(names)))
            token = next(counter)
            value = f"w{w}-{n}"
            poisoned = rng.random() < 0.2
            writes = [
                ResourceWrite(r, 1 if poisoned and i == 0 else token, [Put("k", value.encode())])
                for i, r in enumerate(subset)
            ]
            try:
                await guard_store.write_many(writes)
            except StaleTokenError:
                refused.add(value)
            else:
                assert not poisoned
                accepted[value] = (token, frozenset(subset))

    async def reader(seed: int) -> None:
        rng = random.Random(1000 + seed)
        while not done.is_set():
            first, second = rng.sample(names, 2)
            one = await guard_store.read(first, "k")
            two = await guard_store.read(second, "k")
            if one is not None and two is not None:
                observed.append((one, second, two))
            await asyncio.sleep(0)

    readers = [asyncio.create_task(reader(i)) for i in range(3)]
    await asyncio.gather(*(writer(w) for w in range(8)))
    done.set()
    await asyncio.gather(*readers)

    assert accepted and refused
    for one, second, two in observed:
        for record in (one, two):
            value = record.value.decode()
            assert value not in refused, f"refused write {value} was visible"
            assert accepted[value][0] == record.written_by_token
        token, touched = accepted[one.value.decode()]
        if second in touched:
            # That write landed on `second` too, before this later read of it.
            assert two.written_by_token >= token, (
                f"partial multi-write visible: read token {token}, then {two} on {second}"
            )
    for r in names:
        final = await guard_store.read(r, "k")
        assert final is not None
        assert accepted[final.value.decode()][0] == final.written_by_token
        assert await guard_store.describe_fence(r) == final.written_by_token


# -- write_batch ----------------------------------------------------------------------------


async def test_batch_verdicts_are_independent_and_in_order(guard_store: GuardStore) -> None:
    await guard_store.write("b1", 5, [Put("k", b"five")])
    verdicts = await guard_store.write_batch(
        [
            BatchedWrite("b1", 6, [Put("k", b"six")]),
            BatchedWrite("b1", 5, [Put("k", b"stale now")]),  # the first one raised the fence
            BatchedWrite("b2", 1, [Put("k", b"one")], "key-1"),
            BatchedWrite("b2", 1, [Put("k", b"again")], "key-1"),  # replays the one before
            BatchedWrite("b1", 7, [Delete("k"), Put("j", b"j7")]),
        ]
    )
    assert verdicts[0] == StoreWriteResult(6)
    assert isinstance(verdicts[1], StaleTokenError)
    assert (verdicts[1].resource, verdicts[1].token, verdicts[1].current_token) == ("b1", 5, 6)
    assert verdicts[2] == StoreWriteResult(1)
    assert verdicts[3] == StoreWriteResult(1, replayed_by_token=1)
    assert verdicts[4] == StoreWriteResult(7)
    assert await guard_store.read("b1", "k") is None
    assert await guard_store.read("b1", "j") == Record(b"j7", 7)
    assert await guard_store.read("b2", "k") == Record(b"one", 1)
    assert await guard_store.describe_fence("b1") == 7
    assert await guard_store.write_batch([]) == []


async def test_batch_judges_each_token_before_its_key(guard_store: GuardStore) -> None:
    """As write: a stale token is refused whether or not its key is known (saying by
    which token the key was applied); a token that may write gets the replay."""
    await guard_store.write("bk", 2, [Put("order-7", b"newer holder")], "order-7")
    verdicts = await guard_store.write_batch(
        [
            BatchedWrite("bk", 1, [Put("order-7", b"paused")], "order-7"),
            BatchedWrite("bk", 1, [Put("x", b"paused")], "order-8"),
            BatchedWrite("bk", 3, [Put("order-7", b"next")], "order-7"),
            BatchedWrite("bk", 3, [Put("y", b"new")], "order-9"),
            BatchedWrite("bk", 2, [Put("y", b"late")], "order-9"),  # stale, key just applied
        ]
    )
    assert isinstance(verdicts[0], StaleTokenError)
    assert (verdicts[0].key_applied, verdicts[0].applied_by_token) == (True, 2)
    assert isinstance(verdicts[1], StaleTokenError)
    assert (verdicts[1].key_applied, verdicts[1].applied_by_token) == (False, 0)
    assert verdicts[2] == StoreWriteResult(2, replayed_by_token=2)
    assert verdicts[3] == StoreWriteResult(3)
    assert isinstance(verdicts[4], StaleTokenError)
    assert (verdicts[4].key_applied, verdicts[4].applied_by_token) == (True, 3)
    assert await guard_store.read("bk", "order-7") == Record(b"newer holder", 2)
    assert await guard_store.read("bk", "x") is None
    assert await guard_store.read("bk", "y") == Record(b"new", 3)


async def test_batch_control_mode_off_replays_to_a_stale_token(guard_store: GuardStore) -> None:
    await guard_store.write("bk", 2, [Put("order-7", b"newer holder")], "order-7")
    (verdict,) = await guard_store.write_batch(
        [BatchedWrite("bk", 1, [Put("order-7", b"paused")], "order-7")], FenceMode.OFF
    )
    assert verdict == StoreWriteResult(2, replayed_by_token=2)  # "success", someone else's


async def test_batch_mode_off_applies_stale_tokens(guard_store: GuardStore) -> None:
    await guard_store.write("b", 9, [Put("k", b"new")])
    (verdict,) = await guard_store.write_batch(
        [BatchedWrite("b", 2, [Put("k", b"stale")])], FenceMode.OFF
    )
    assert verdict == StoreWriteResult(9)
    assert await guard_store.read("b", "k") == Record(b"stale", 2)


KEYS = st.sampled_from(["k1", "k2"])
OPS = st.lists(
    st.one_of(
        st.builds(Put, KEYS, st.binary(min_size=0, max_size=3)),
        st.builds(Delete, KEYS),
    ),
    min_size=1,
    max_size=3,
)
WRITES = st.lists(
    st.tuples(
        st.sampled_from(["p", "q", "r"]),
        st.integers(1, 6),
        OPS,
        st.sampled_from(["", "", "i1", "i2"]),
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(writes=WRITES, prior=st.lists(st.tuples(st.sampled_from(["p", "q"]), st.integers(1, 6))))
async def test_a_batch_decides_as_writes_one_by_one(
    guard_store: GuardStore,
    writes: list[tuple[str, int, list[Op], str]],
    prior: list[tuple[str, int]],
) -> None:
    """The model is the in-memory store applying the same writes one by one."""
    space = f"h{uuid.uuid4().hex[:12]}-"
    model = MemoryStore()
    for resource, token in prior:
        for store in (guard_store, model):
            if token >= await store.describe_fence(space + resource):
                await store.fence(space + resource, token)
    batch = [BatchedWrite(space + r, t, ops, key) for r, t, ops, key in writes]
    expected: list[StoreWriteResult | tuple[int, int, bool | None, int]] = []
    for w in batch:
        try:
            expected.append(await model.write(w.resource, w.token, w.ops, w.idempotency_key))
        except StaleTokenError as exc:
            expected.append((exc.token, exc.current_token, exc.key_applied, exc.applied_by_token))
    got = [
        (v.token, v.current_token, v.key_applied, v.applied_by_token)
        if isinstance(v, StaleTokenError)
        else v
        for v in await guard_store.write_batch(batch)
    ]
    assert got == expected
    for r in ("p", "q", "r"):
        assert await guard_store.describe_fence(space + r) == await model.describe_fence(space + r)
        for k in ("k1", "k2"):
            assert await guard_store.read(space + r, k) == await model.read(space + r, k)
