"""Where the clients do I/O: the two runners of the core's steps.

Every exchange of the clients is written once, as steps, in
:mod:`fencing.client._core` (:class:`~fencing.client._core.LeaseSteps`,
:func:`~fencing.client._core.unary`). A client mixes in one of these runners:
:class:`BlockingCalls` (the sync clients) calls and sleeps, :class:`AsyncCalls` (the
asyncio twins) awaits. Each sends the reply of a :class:`~fencing.client._core.Call`
back into the steps, or throws its failure in, already translated into a
:mod:`fencing.errors` exception with the ``grpc.RpcError`` as its cause; anything
else (a ``KeyboardInterrupt``, a cancellation) is thrown in as it is, so the steps'
own cleanup runs. This module has no rules of its own; it also holds the asyncio
streams' one way to end (:func:`finish_stream`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import grpc

from fencing.client import _core
from fencing.client._closing import AsyncClosing, Closing

T = TypeVar("T")
Resp = TypeVar("Resp")


class BlockingCalls(Closing):
    """Runs steps with blocking calls and ``time.sleep`` (mixed into the sync clients,
    which are context managers that ``close()`` on exit)."""

    rpc_timeout: float

    def _run(self, steps: _core.Steps[T]) -> T:
        reply: object = None
        error: BaseException | None = None
        while True:
            try:
                step = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as done:
                return cast(T, done.value)
            reply, error = None, None
            try:
                if isinstance(step, _core.Sleep):
                    time.sleep(step.seconds)
                else:
                    reply = self._send(step.method, step.request, step.timeout)
            except BaseException as exc:  # thrown into the steps, which decide
                error = exc

    def _send(self, method: Callable[..., Resp], request: object, timeout: float | None) -> Resp:
        """The one blocking call: ``timeout`` None is ``rpc_timeout``; a failure becomes
        its :mod:`fencing.errors` exception, the ``grpc.RpcError`` its cause."""
        try:
            return method(request, timeout=self.rpc_timeout if timeout is None else timeout)
        except grpc.RpcError as err:
            raise _core.translate(err) from err

    def _call(
        self,
        method: Callable[..., Resp],
        request: object,
        timeout: float | None = None,
        *,
        retry: bool = False,
    ) -> Resp:
        """One unary call (``retry``: an idempotent one, retried on transient failures
        as :func:`fencing.client._core.unary` says); failures become
        :mod:`fencing.errors` exceptions (cause chained)."""
        if not retry:  # the hot path (every write): no steps to run
            return self._send(method, request, timeout)
        budget = self.rpc_timeout if timeout is None else timeout
        steps = _core.unary(method, request, timeout, retry=True, budget=budget)
        return cast(Resp, self._run(steps))


class AsyncCalls(AsyncClosing):
    """Runs steps with awaited calls and ``asyncio.sleep`` (mixed into the asyncio twins,
    which are async context managers that ``aclose()`` on exit)."""

    rpc_timeout: float

    async def _run(self, steps: _core.Steps[T]) -> T:
        reply: object = None
        error: BaseException | None = None
        while True:
            try:
                step = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as done:
                return cast(T, done.value)
            reply, error = None, None
            try:
                if isinstance(step, _core.Sleep):
                    await asyncio.sleep(step.seconds)
                else:
                    reply = await self._send(step.method, step.request, step.timeout)
            except BaseException as exc:  # thrown into the steps, which decide
                error = exc

    async def _send(
        self,
        method: Callable[..., Awaitable[Resp]],
        request: object,
        timeout: float | None,  # noqa: ASYNC109 - the gRPC deadline of this call
    ) -> Resp:
        """The one awaited call; see :meth:`BlockingCalls._send`."""
        try:
            return await method(request, timeout=self.rpc_timeout if timeout is None else timeout)
        except grpc.RpcError as err:
            raise _core.translate(err) from err

    async def _call(
        self,
        method: Callable[..., Awaitable[Resp]],
        request: object,
        timeout: float | None = None,  # noqa: ASYNC109 - the gRPC deadline of this call
        *,
        retry: bool = False,
    ) -> Resp:
        """One unary call, awaited; see :meth:`BlockingCalls._call`."""
        if not retry:
            return await self._send(method, request, timeout)
        budget = self.rpc_timeout if timeout is None else timeout
        steps = _core.unary(method, request, timeout, retry=True, budget=budget)
        return cast(Resp, await self._run(steps))


async def finish_stream(
    call: Any,
    tasks: Sequence[asyncio.Task[None]],
    timeout: float,  # noqa: ASYNC109 - the grace before the cancel, not a deadline
) -> None:
    """Let a half-closed stream's sender and reader tasks finish (the replies in flight
    coming in) for up to ``timeout`` seconds, then cancel the call and let them end."""
    try:
        async with asyncio.timeout(timeout):
            await asyncio.gather(*tasks, return_exceptions=True)
    except TimeoutError:
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
