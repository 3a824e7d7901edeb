"""The fenced-store contract suite, shipped: prove that a store honours the fence.

A store's authors subclass :class:`GuardStoreContract` in their own tests and write one
fixture, ``store_url``: a URL naming fresh, isolated storage for one test (cleaned up
after the ``yield``), in a scheme :func:`guard.stores.open_store` finds (an entry point
of their package, or :func:`guard.stores.register_store`)::

    import pytest
    from fencing.testing.stores import GuardStoreContract

    class TestFooStore(GuardStoreContract):
        @pytest.fixture
        def store_url(self, tmp_path):
            return f"foo://{tmp_path}/fences"

Every case then runs against the store (``pytest -q``). The cases are plain
synchronous tests that drive the store on their own event loop, so they need no pytest
asyncio plugin: stale and equal tokens, idempotency-key replays, concurrent writers on one
connection, across two connections and across two processes, a writer process killed
with ``SIGKILL`` while it writes (the crash between the fence and the write, as close as
a store outside our code can be driven to one), awkward input.

Set ``shared_storage = False`` for a store whose instances share nothing (``memory://``):
the cases needing a second connection or process are then skipped. The suite must be able
to fail: this repository keeps deliberately broken stores (the fence checked outside the
write's atomic step, or not at all) and a test asserting that the suite catches them.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import ClassVar, cast
from urllib.parse import urlsplit

import pytest

from fencing.errors import LeaseLost, StaleTokenError
from fencing.types import Delete, Put, Record
from guard import stores
from guard.fence import FenceMode
from guard.stores.base import GuardStore, RecordLister

#: Seconds any one case may wait on a store or a child process before it fails.
HANG_GUARD = 60.0


@dataclass
class StoreUnderTest:
    """What a case gets: the opened store, its URL, and more connections to it."""

    store: GuardStore
    url: str
    shared: bool
    _stack: AsyncExitStack = field(repr=False)

    async def another(self) -> GuardStore:
        """A second store instance on the same storage (another connection), opened."""
        if not self.shared:
            pytest.skip("the store's instances share no storage (shared_storage = False)")
        other = stores.open_store(self.url)
        await other.open()
        self._stack.push_async_callback(other.close)
        return other


Case = Callable[["GuardStoreContract", StoreUnderTest], Awaitable[None]]


def _case(fn: Case) -> Callable[[GuardStoreContract, str], None]:
    """A synchronous pytest test running ``fn`` on a fresh event loop with the store open."""

    def test(self: GuardStoreContract, store_url: str) -> None:
        asyncio.run(asyncio.wait_for(self._run(fn, store_url), HANG_GUARD))

    test.__name__ = fn.__name__
    test.__qualname__ = fn.__qualname__
    test.__doc__ = fn.__doc__
    return test


@asynccontextmanager
async def _opened(url: str, shared: bool) -> AsyncIterator[StoreUnderTest]:
    async with AsyncExitStack() as stack:
        store = stores.open_store(url)
        await store.open()
        stack.push_async_callback(store.close)
        yield StoreUnderTest(store, url, shared, stack)


def _child_env() -> dict[str, str]:
    """The child sees the modules this process does (a test run from a checkout)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


async def _spawn(url: str, *args: str) -> asyncio.subprocess.Process:
    """A :func:`_worker` process, its store open, not yet started (:func:`_go`)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sys; from fencing.testing.stores import _worker; _worker(sys.argv[1:])",
        url,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=_child_env(),
    )
    assert child.stdout is not None
    ready = await child.stdout.readline()
    assert ready == b"ready\n", f"the writer process did not start: {ready!r}"
    return child


def _go(*children: asyncio.subprocess.Process) -> None:
    for child in children:
        assert child.stdin is not None
        child.stdin.write(b"go\n")


def _worker(argv: list[str]) -> None:
    """A writer process: prints ``ready`` once its store is open and starts on a line of
    input. ``URL race RESOURCE TOKEN...`` writes each token in turn and prints ``ok T``
    or ``stale T CURRENT``; ``URL crash RESOURCE`` writes tokens 1, 2, ...
    forever (16 keys and key ``w<T>`` each) and prints ``T`` after each acknowledgement."""
    url, what, resource, *tokens = argv

    async def main() -> None:
        store = stores.open_store(url)
        await store.open()
        print("ready", flush=True)
        sys.stdin.readline()
        try:
            if what == "race":
                for t in map(int, tokens):
                    ops = [Put("k", str(t).encode()), Put("j", str(t).encode())]
                    try:
                        await store.write(resource, t, ops)
                        print("ok", t, flush=True)
                    except StaleTokenError as exc:
                        print("stale", t, exc.current_token, flush=True)
            else:
                t = 0
                while True:
                    t += 1
                    value = str(t).encode()
                    ops = [Put(f"k{i}", value) for i in range(16)]
                    await store.write(resource, t, ops, f"w{t}")
                    print(t, flush=True)
        finally:
            await store.close()

    asyncio.run(main())


class GuardStoreContract:
    """Every case a fenced store must pass (module doc). Subclass it, define ``store_url``."""

    #: False for stores whose instances share no storage (each ``memory://`` is its own).
    shared_storage: ClassVar[bool] = True

    @pytest.fixture
    def store_url(self) -> str:
        """Override: a URL naming fresh, isolated storage for one test."""
        pytest.fail("define a store_url fixture in your GuardStoreContract subclass")

    async def _run(self, fn: Case, url: str) -> None:
        async with _opened(url, self.shared_storage) as t:
            await fn(self, t)

    def _need_processes(self, url: str) -> None:
        if not self.shared_storage:
            pytest.skip("the store's instances share no storage (shared_storage = False)")
        scheme = urlsplit(url).scheme
        if scheme in stores._registered:
            pytest.skip(f"{scheme}:// is registered in this process only (no entry point)")

    # -- the fence ----------------------------------------------------------------------------

    @_case
    async def test_write_applies_and_advances_the_fence(self, t: StoreUnderTest) -> None:
        s = t.store
        result = await s.write("r", 5, [Put("k", b"v")])
        assert result.fence == 5 and not result.replayed
        assert await s.read("r", "k") == Record(b"v", 5)
        assert await s.describe_fence("r") == 5
        assert await s.describe_fence("other") == 0
        assert await s.read("r", "missing") is None

    @_case
    async def test_equal_token_writes_again(self, t: StoreUnderTest) -> None:
        s = t.store
        await s.write("r", 3, [Put("k", b"1")])
        assert (await s.write("r", 3, [Put("k", b"2")])).fence == 3
        assert await s.read("r", "k") == Record(b"2", 3)

    @_case
    async def test_stale_write_is_rejected_and_applies_nothing(self, t: StoreUnderTest) -> None:
        s = t.store
        await s.write("r", 7, [Put("a", b"new-a"), Put("b", b"new-b")])
        with pytest.raises(StaleTokenError) as stale:
            await s.write("r", 6, [Put("a", b"stale"), Delete("b"), Put("c", b"stale")])
        assert stale.value.current_token == 7 and stale.value.token == 6
        assert stale.value.resource == "r"
        assert await s.read("r", "a") == Record(b"new-a", 7)
        assert await s.read("r", "b") == Record(b"new-b", 7)
        assert await s.read("r", "c") is None
        assert await s.describe_fence("r") == 7

    @_case
    async def test_ops_apply_in_order_within_a_write(self, t: StoreUnderTest) -> None:
        s = t.store
        await s.write("r", 1, [Put("k", b"x"), Delete("k"), Put("j", b"y"), Put("j", b"z")])
        assert await s.read("r", "k") is None
        assert await s.read("r", "j") == Record(b"z", 1)

    @_case
    async def test_fences_are_per_resource(self, t: StoreUnderTest) -> None:
        s = t.store
        await s.write("r1", 10, [Put("k", b"v")])
        await s.write("r2", 1, [Put("k", b"w")])
        assert await s.read("r2", "k") == Record(b"w", 1)
        assert await s.read("r1", "k") == Record(b"v", 10)

    @_case
    async def test_fence_advances_never_lowers_and_is_idempotent(self, t: StoreUnderTest) -> None:
        s = t.store
        assert await s.fence("r", 4) == 4
        assert await s.fence("r", 4) == 4
        with pytest.raises(StaleTokenError) as stale:
            await s.fence("r", 3)
        assert stale.value.current_token == 4
        assert await s.describe_fence("r") == 4
        with pytest.raises(StaleTokenError):
            await s.write("r", 3, [Put("k", b"late")])
        assert await s.read("r", "k") is None
        assert (await s.write("r", 4, [Put("k", b"ok")])).fence == 4

    @_case
    async def test_reset_fence_sets_the_fence_lower_or_higher(self, t: StoreUnderTest) -> None:
        """An operator's recovery from a fence a token nobody was granted wedged."""
        s = t.store
        await s.write("w", 2, [Put("k", b"real holder")])
        await s.write("w", 2**63 - 1, [Put("k", b"wedge")])
        with pytest.raises(StaleTokenError):
            await s.write("w", 3, [Put("k", b"next holder")])
        assert await s.reset_fence("w", 3) == 2**63 - 1
        assert await s.describe_fence("w") == 3
        assert (await s.write("w", 3, [Put("k", b"next holder")])).fence == 3
        with pytest.raises(StaleTokenError):  # the former holder stays fenced
            await s.write("w", 2, [Put("k", b"former")])
        assert await s.read("w", "k") == Record(b"next holder", 3)
        assert await s.reset_fence("fresh", 9) == 0
        assert await s.describe_fence("fresh") == 9

    @_case
    async def test_strict_without_a_lease_backend_fails_closed_as_lease_lost(
        self, t: StoreUnderTest
    ) -> None:
        """A strict write whose token nobody holds is LEASE_LOST, not STALE_TOKEN; a token
        below the fence stays STALE_TOKEN. (Stores that can see the lease backend check
        strict mode against a real one in their own integration tests.)"""
        s = t.store
        if s.supports_strict:
            pytest.skip("the store checks live leases: test it against its lease backend")
        await s.write("r", 4, [Put("k", b"v")])
        with pytest.raises(LeaseLost) as lost:
            await s.write("r", 5, [Put("k", b"x")], "op", FenceMode.STRICT)
        assert lost.value.token == 5 and lost.value.key_applied is False
        with pytest.raises(StaleTokenError):
            await s.write("r", 3, [Put("k", b"x")], mode=FenceMode.STRICT)
        with pytest.raises(LeaseLost):
            await s.fence("r", 2**63 - 1, FenceMode.STRICT)
        assert await s.describe_fence("r") == 4

    @_case
    async def test_mode_off_accepts_stale_tokens(self, t: StoreUnderTest) -> None:
        """The chaos control: with fencing off a stale write lands (the fence never drops)."""
        s = t.store
        await s.write("r", 9, [Put("k", b"new")])
        result = await s.write("r", 2, [Put("k", b"stale")], mode=FenceMode.OFF)
        assert result.fence == 9
        assert await s.read("r", "k") == Record(b"stale", 2)

    # -- idempotency keys ---------------------------------------------------------------------

    @_case
    async def test_idempotency_key_replays_the_first_outcome(self, t: StoreUnderTest) -> None:
        s = t.store
        first = await s.write("r", 2, [Put("k", b"first")], "op-1")
        again = await s.write("r", 2, [Put("k", b"second")], "op-1")
        assert again.replayed and again.fence == first.fence == 2
        assert again.replayed_by_token == 2 and first.replayed_by_token == 0
        assert await s.read("r", "k") == Record(b"first", 2)
        # The same key on another resource is another write.
        assert not (await s.write("r2", 1, [Put("k", b"v")], "op-1")).replayed

    @_case
    async def test_a_stale_token_is_refused_even_when_its_key_is_known(
        self, t: StoreUnderTest
    ) -> None:
        """A paused former holder (token 1) re-sends the key a newer holder (token 2) used:
        it is refused, never told "success" for someone else's write, and the refusal
        says whose write it was."""
        s = t.store
        await s.write("orders", 1, [Put("next_id", b"7")])
        await s.write("orders", 2, [Put("order-7", b"newer holder")], "order-7")
        with pytest.raises(StaleTokenError) as stale:
            await s.write("orders", 1, [Put("order-7", b"paused holder")], "order-7")
        assert (stale.value.token, stale.value.current_token) == (1, 2)
        assert stale.value.key_applied is True and stale.value.applied_by_token == 2
        assert await s.read("orders", "order-7") == Record(b"newer holder", 2)

    @_case
    async def test_a_stale_refusal_says_whether_its_own_attempt_landed(
        self, t: StoreUnderTest
    ) -> None:
        s = t.store
        await s.write("r", 3, [Put("k", b"mine")], "attempt")  # landed; reply lost
        await s.fence("r", 4)  # a newer holder took over
        with pytest.raises(StaleTokenError) as retried:
            await s.write("r", 3, [Put("k", b"mine")], "attempt")
        assert retried.value.key_applied is True and retried.value.applied_by_token == 3
        with pytest.raises(StaleTokenError) as unknown:
            await s.write("r", 3, [Put("k", b"never")], "other-attempt")
        assert unknown.value.key_applied is False and unknown.value.applied_by_token == 0
        with pytest.raises(StaleTokenError) as keyless:
            await s.write("r", 3, [Put("k", b"never")])
        assert keyless.value.key_applied is None
        assert await s.read("r", "k") == Record(b"mine", 3)

    @_case
    async def test_a_replay_to_a_newer_token_names_the_token_that_applied_it(
        self, t: StoreUnderTest
    ) -> None:
        """A token that may write now is answered the replay, with the older token that
        applied the key: it can tell its own write was not applied."""
        s = t.store
        await s.write("r", 5, [Put("k", b"by five")], "op")
        again = await s.write("r", 6, [Put("k", b"by six")], "op")
        assert again.replayed and again.replayed_by_token == 5 and again.fence == 5
        assert await s.read("r", "k") == Record(b"by five", 5)
        assert await s.describe_fence("r") == 5

    @_case
    async def test_control_without_fencing_a_stale_owner_is_told_success(
        self, t: StoreUnderTest
    ) -> None:
        """The control: with the token not judged first (mode off takes the key's answer
        as the old order did), the paused holder's re-sent key reads as a success."""
        s = t.store
        await s.write("orders", 2, [Put("order-7", b"newer holder")], "order-7")
        result = await s.write(
            "orders", 1, [Put("order-7", b"paused holder")], "order-7", FenceMode.OFF
        )
        assert result.replayed and result.replayed_by_token == 2  # "success", someone else's

    @_case
    async def test_rejected_write_records_no_idempotency_key(self, t: StoreUnderTest) -> None:
        s = t.store
        await s.write("r", 5, [Put("k", b"v")])
        with pytest.raises(StaleTokenError):
            await s.write("r", 4, [Put("k", b"stale")], "op-x")
        result = await s.write("r", 6, [Put("k", b"fresh")], "op-x")
        assert not result.replayed and result.fence == 6

    @_case
    async def test_prune_forgets_old_idempotency_keys(self, t: StoreUnderTest) -> None:
        s = t.store
        await s.write("r", 1, [Put("k", b"v")], "old")
        assert await s.prune_idempotency(time.time_ns() // 1_000_000 - 60_000) == 0
        assert await s.prune_idempotency(time.time_ns() // 1_000_000 + 1000) == 1
        assert not (await s.write("r", 1, [Put("k", b"v2")], "old")).replayed

    # -- awkward input ------------------------------------------------------------------------

    @_case
    async def test_awkward_names_values_and_tokens_round_trip(self, t: StoreUnderTest) -> None:
        """Bytes are bytes (NUL, invalid UTF-8, empty), names are any text, tokens span
        the 63-bit range, and a write with no ops still advances the fence."""
        s = t.store
        resource, key = "res/ü 🙂 '\"; --", "k\\%_*?{x}"
        values = [b"", b"\x00\xff\xfe", bytes(range(256))]
        for i, v in enumerate(values):
            await s.write(resource, 1, [Put(f"{key}{i}", v)])
            assert await s.read(resource, f"{key}{i}") == Record(v, 1)
        assert await s.read(resource + "x", f"{key}0") is None
        assert (await s.write("empty", 2**63 - 2, [])).fence == 2**63 - 2
        assert await s.describe_fence("empty") == 2**63 - 2
        with pytest.raises(StaleTokenError):
            await s.write("empty", 2**63 - 3, [Put("k", b"v")])
        assert (await s.write("empty", 2**63 - 1, [Put("k", b"v")])).fence == 2**63 - 1

    # -- concurrent writers -------------------------------------------------------------------

    @staticmethod
    async def _race(writers: list[GuardStore], tokens: list[int]) -> None:
        """Write every token at once (writer i % n), then check the fence held: the
        highest token's write is the one that stays, every refusal names a higher fence,
        and each write's two keys moved together."""

        refusals: list[tuple[int, int]] = []

        async def one(store: GuardStore, token: int) -> None:
            value = str(token).encode()
            try:
                await store.write("race", token, [Put("k", value), Put("j", value)])
            except StaleTokenError as exc:
                refusals.append((token, exc.current_token))

        await asyncio.gather(*(one(writers[i % len(writers)], tok) for i, tok in enumerate(tokens)))
        assert all(current > token for token, current in refusals), refusals
        top = max(tokens)
        s = writers[0]
        assert await s.describe_fence("race") == top
        assert await s.read("race", "k") == Record(str(top).encode(), top)
        assert await s.read("race", "j") == Record(str(top).encode(), top)

    @_case
    async def test_list_records_in_code_point_order_under_a_prefix_after_a_cursor(
        self, t: StoreUnderTest
    ) -> None:
        """The optional ``list_records``: mixed case, a non-ASCII key and LIKE wildcards
        come back in code point order (whatever the database's locale), "%" and "_"
        literal, a page at a time after a cursor, one resource only."""
        s = t.store
        if not hasattr(s, "list_records"):
            pytest.skip("the store does not list records (an optional member)")
        lister = cast(RecordLister, s)
        keys = ["cfg/b", "cfg/B", "cfg/a", "cfg/\u00e9", "cfg/_x", "cfg%", "other", "cfg/a/deep"]
        await s.write("r", 3, [Put(k, k.encode()) for k in keys])
        await s.write("r2", 1, [Put("cfg/zz", b"elsewhere")])
        under = sorted(k for k in keys if k.startswith("cfg/"))
        assert under == ["cfg/B", "cfg/_x", "cfg/a", "cfg/a/deep", "cfg/b", "cfg/\u00e9"]
        assert await lister.list_records("r", "cfg/", "", 10) == [
            (k, Record(k.encode(), 3)) for k in under
        ]
        assert [k for k, _ in await lister.list_records("r", "cfg/", "", 2)] == under[:2]
        after = await lister.list_records("r", "cfg/", "cfg/a", 10)
        assert [k for k, _ in after] == under[3:]
        assert [k for k, _ in await lister.list_records("r", "", "", 100)] == sorted(keys)
        assert await lister.list_records("r", "cfg/", under[-1], 10) == []
        assert await lister.list_records("none", "", "", 10) == []
        await s.write("r", 3, [Delete("cfg/b")])
        assert "cfg/b" not in [k for k, _ in await lister.list_records("r", "cfg/", "", 10)]

    @_case
    async def test_concurrent_writers_on_one_connection(self, t: StoreUnderTest) -> None:
        """Newest first is the worst order for a store that checks the fence outside the
        write: every writer reads the empty fence, then the oldest writes last."""
        await self._race([t.store], list(range(16, 0, -1)))
        tokens = list(range(17, 49))
        random.shuffle(tokens)
        await self._race([t.store], tokens)

    @_case
    async def test_concurrent_writers_across_connections(self, t: StoreUnderTest) -> None:
        other = await t.another()
        await self._race([t.store, other], list(range(16, 0, -1)))
        tokens = list(range(17, 49))
        random.shuffle(tokens)
        await self._race([other, t.store], tokens)

    @_case
    async def test_concurrent_writers_across_processes(self, t: StoreUnderTest) -> None:
        """Two processes, interleaved tokens (odd and even), writing at once."""
        self._need_processes(t.url)
        children = [
            await _spawn(t.url, "race", "race", *map(str, range(first, 41, 2))) for first in (1, 2)
        ]
        _go(*children)
        outputs = await asyncio.gather(*(c.communicate() for c in children))
        assert [c.returncode for c in children] == [0, 0]
        for out, _ in outputs:
            for line in out.decode().split("\n"):
                if line.startswith("stale"):
                    _, token, current = line.split()
                    assert int(current) > int(token), line
        assert await t.store.describe_fence("race") == 40
        assert await t.store.read("race", "k") == Record(b"40", 40)
        assert await t.store.read("race", "j") == Record(b"40", 40)

    # -- a crash between the fence and the write ----------------------------------------------

    @_case
    async def test_a_writer_killed_mid_write_leaves_whole_writes_only(
        self, t: StoreUnderTest
    ) -> None:
        """A writer process is killed (SIGKILL) at an arbitrary point of its stream of
        16-key writes: the fence, the data and the idempotency key of a write land
        together or not at all, and every acknowledged write is there."""
        self._need_processes(t.url)
        child = await _spawn(t.url, "crash", "crash")
        _go(child)
        assert child.stdout is not None
        acked = 0
        target = random.randint(20, 60)
        while acked < target:
            line = await child.stdout.readline()
            assert line, "the writer process exited early"
            acked = int(line)
        await asyncio.sleep(random.random() / 50)  # somewhere inside a later write
        child.send_signal(signal.SIGKILL)
        await child.communicate()
        s = t.store
        fence = await s.describe_fence("crash")
        assert fence >= acked  # acknowledged means durable
        value = str(fence).encode()
        for i in range(16):
            assert await s.read("crash", f"k{i}") == Record(value, fence), (i, fence)
        # The last write's key is recorded with it; the one cut short recorded nothing.
        replay = await s.write("crash", fence, [Put("k0", b"again")], f"w{fence}")
        assert replay.replayed and replay.replayed_by_token == fence
        after = await s.write("crash", fence + 1, [Put("k0", b"next")], f"w{fence + 1}")
        assert not after.replayed


__all__ = ["GuardStoreContract", "StoreUnderTest"]
