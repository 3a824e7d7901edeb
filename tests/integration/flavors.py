"""Run the client suite against both SDK twins: the async one behind a blocking adapter.

The integration tests are written once, against the blocking API. For the
``async`` flavour they get :class:`SyncLeaseClient` / :class:`SyncGuardClient`,
which run ``AsyncLeaseClient`` / ``AsyncGuardClient`` on an event loop in a
background thread (a portal) and present the blocking API: same method names,
same exceptions, ``lease.lost`` with ``is_set()`` and ``wait(timeout)``.

``hold`` keeps the async semantics underneath: the async block (which here only
waits for the blocking body to finish) is cancelled when the lease is lost, and
its ``LeaseLost`` comes out of the blocking ``with`` when the body ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

from fencing import AsyncGuardClient, AsyncLease, AsyncLeaseClient
from fencing.client import LeaseEvent, LeaseState, WriteResult
from fencing.client._writes import GuardInfo, ManyResult, Refusal
from fencing.types import Fenced, Op, Record

T = TypeVar("T")


class Portal:
    """An event loop in a daemon thread, called from blocking code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="portal")
        self._thread.start()

    def call(self, aw: Awaitable[T], timeout: float = 60.0) -> T:
        async def _await() -> T:
            return await aw

        return asyncio.run_coroutine_threadsafe(_await(), self.loop).result(timeout)

    def run(self, fn: Callable[[], T]) -> T:
        """Run a plain function on the loop's thread (asyncio objects are not thread-safe)."""

        async def _run() -> T:
            return fn()

        return self.call(_run())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class _LostFlag:
    """``lease.lost`` of the async lease, seen from another thread like a threading.Event."""

    def __init__(self, portal: Portal, lease: AsyncLease) -> None:
        self._portal = portal
        self._lease = lease

    def is_set(self) -> bool:
        return self._lease.lost.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        async def _wait() -> bool:
            try:
                await asyncio.wait_for(self._lease.lost.wait(), timeout)
            except TimeoutError:
                return False
            return True

        return self._portal.call(_wait())


class SyncLease:
    def __init__(self, portal: Portal, lease: AsyncLease) -> None:
        self._portal = portal
        self.async_lease = lease
        self.lost = _LostFlag(portal, lease)

    @property
    def resource(self) -> str:
        return self.async_lease.resource

    @property
    def token(self) -> int:
        return self.async_lease.token

    @property
    def holder(self) -> str:
        return self.async_lease.holder

    @property
    def ttl_ms(self) -> int:
        return self.async_lease.ttl_ms

    @property
    def released(self) -> bool:
        return self.async_lease.released

    def check(self) -> None:
        self._portal.run(self.async_lease.check)

    def remaining(self) -> float:
        return self._portal.run(self.async_lease.remaining)

    def renew(self, ttl: float | None = None) -> None:
        self._portal.call(self.async_lease.renew(ttl))

    def release(self) -> None:
        self._portal.call(self.async_lease.release())

    def on_lost(self, callback: Callable[[SyncLease], None]) -> None:
        self._portal.run(lambda: self.async_lease.on_lost(lambda _: callback(self)))


class SyncGuardClient:
    def __init__(self, portal: Portal, target: str, **kwargs: Any) -> None:
        self._portal = portal

        async def make() -> AsyncGuardClient:
            return AsyncGuardClient(target, **kwargs)

        self.client = portal.call(make())
        self.target = target

    def close(self) -> None:
        self._portal.call(self.client.aclose())

    def __enter__(self) -> SyncGuardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(
        self, fenced: Fenced, ops: Sequence[Op] | Op, *, idempotency_key: str = ""
    ) -> WriteResult:
        return self._portal.call(self.client.write(fenced, ops, idempotency_key=idempotency_key))

    def put(self, fenced: Fenced, key: str, value: bytes, *, idempotency_key: str = "") -> int:
        return self._portal.call(
            self.client.put(fenced, key, value, idempotency_key=idempotency_key)
        )

    def delete(self, fenced: Fenced, key: str, *, idempotency_key: str = "") -> int:
        return self._portal.call(self.client.delete(fenced, key, idempotency_key=idempotency_key))

    def read(self, resource: str, key: str) -> Record | None:
        return self._portal.call(self.client.read(resource, key))

    def fence(self, fenced: Fenced) -> int:
        return self._portal.call(self.client.fence(fenced))

    def describe_fence(self, resource: str) -> int:
        return self._portal.call(self.client.describe_fence(resource))

    def describe_guard(self) -> GuardInfo:
        return self._portal.call(self.client.describe_guard())

    def list_refusals(self, resource: str) -> list[Refusal]:
        return self._portal.call(self.client.list_refusals(resource))

    def write_many(
        self, writes: Sequence[tuple[Fenced, Sequence[Op] | Op]], *, idempotency_key: str = ""
    ) -> ManyResult:
        return self._portal.call(self.client.write_many(writes, idempotency_key=idempotency_key))


def _guards(guards: Sequence[Any]) -> list[Any]:
    return [g.client if isinstance(g, SyncGuardClient) else g for g in guards]


class SyncLeaseClient:
    def __init__(self, portal: Portal, target: str, **kwargs: Any) -> None:
        self._portal = portal

        async def make() -> AsyncLeaseClient:
            return AsyncLeaseClient(target, **kwargs)

        self.client = portal.call(make())
        self.target = target
        self.holder = self.client.holder

    def close(self) -> None:
        self._portal.call(self.client.aclose())

    def __enter__(self) -> SyncLeaseClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def acquire(
        self, resource: str, ttl: float, timeout: float | None = None, *, fence: Sequence[Any] = ()
    ) -> SyncLease:
        lease = self._portal.call(
            self.client.acquire(resource, ttl, timeout, fence=_guards(fence)), timeout=600
        )
        return SyncLease(self._portal, lease)

    def acquire_nowait(self, resource: str, ttl: float, *, fence: Sequence[Any] = ()) -> SyncLease:
        lease = self._portal.call(self.client.acquire_nowait(resource, ttl, fence=_guards(fence)))
        return SyncLease(self._portal, lease)

    def describe(self, resource: str) -> LeaseState:
        return self._portal.call(self.client.describe(resource))

    def renew(self, resource: str, token: int, ttl: float | None = None) -> int:
        return self._portal.call(self.client.renew(resource, token, ttl))

    def release(self, resource: str, token: int, *, holder: str = "") -> None:
        self._portal.call(self.client.release(resource, token, holder=holder))

    def watch(
        self, resource: str = "", *, prefix: str = "", after_revision: int | None = None
    ) -> Iterator[LeaseEvent]:
        stream = self.client.watch(resource, prefix=prefix, after_revision=after_revision)
        try:
            while True:
                try:
                    yield self._portal.call(anext(stream))
                except StopAsyncIteration:
                    return
        finally:
            self._portal.call(stream.aclose())

    def list_page(
        self, prefix: str = "", *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[LeaseState], str]:
        return self._portal.call(
            self.client.list_page(prefix, page_size=page_size, page_token=page_token)
        )

    def list_held(self, prefix: str = "", *, page_size: int = 0) -> Iterator[LeaseState]:
        stream = self.client.list_held(prefix, page_size=page_size)
        try:
            while True:
                try:
                    yield self._portal.call(anext(stream))
                except StopAsyncIteration:
                    return
        finally:
            self._portal.call(stream.aclose())

    @contextmanager
    def hold(
        self,
        resource: str,
        ttl: float,
        *,
        timeout: float | None = None,
        on_lost: Callable[[SyncLease], None] | None = None,
        fence: Sequence[Any] = (),
    ) -> Iterator[SyncLease]:
        entered: concurrent.futures.Future[SyncLease] = concurrent.futures.Future()
        body_done = self._portal.run(asyncio.Event)

        def lost(_: AsyncLease) -> None:
            if on_lost is not None:
                on_lost(entered.result())

        async def block() -> None:
            async with self.client.hold(
                resource, ttl, timeout=timeout, on_lost=lost, fence=_guards(fence)
            ) as lease:
                entered.set_result(SyncLease(self._portal, lease))
                await body_done.wait()  # cancelled here if the lease is lost

        running = asyncio.run_coroutine_threadsafe(block(), self._portal.loop)
        started: list[concurrent.futures.Future[Any]] = [entered, running]
        concurrent.futures.wait(started, return_when=concurrent.futures.FIRST_COMPLETED)
        if not entered.done():
            running.result()  # acquire failed: raise its error
        try:
            yield entered.result()
        except BaseException:
            self._portal.loop.call_soon_threadsafe(body_done.set)
            with suppress(Exception):  # the body's own exception wins, as in the blocking hold
                running.result(60)
            raise
        self._portal.loop.call_soon_threadsafe(body_done.set)
        running.result(60)
