"""``with`` and ``async with`` for the client's objects whose exit is their close: the
clients (through their runners, :mod:`fencing.client._calls`), the watch streams and
the write streams. Mixed in, once for each flavour, so that entering returns the
object itself and leaving closes it, whatever the block raised (which propagates)."""

from __future__ import annotations

from typing import Self


class Closing:
    """``with obj:`` returns ``obj`` and calls ``obj.close()`` on exit."""

    def close(self) -> None:
        raise NotImplementedError  # pragma: no cover - every user has its own

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:  # the block's exception propagates
        self.close()


class AsyncClosing:
    """``async with obj:`` returns ``obj`` and awaits ``obj.aclose()`` on exit."""

    async def aclose(self) -> None:
        raise NotImplementedError  # pragma: no cover - every user has its own

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
