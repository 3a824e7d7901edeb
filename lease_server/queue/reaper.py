"""The queue reaper: a periodic task of the lease server that ends what workers left.

Every ``reap_interval_s`` it (1) moves running jobs whose *final* attempt's lease
expired to ``dead`` (a job with attempts left stays running until a claim rescues
it with a fresh token, as a SKIP LOCKED queue's rescue does), which lets the next job of an ordering
key go; and (2) deletes finished jobs older than their retention (succeeded after
``succeeded_retention_s``, dead after ``dead_retention_s``; None keeps them), at
most ``reap_batch`` per step so a large backlog is pruned in small transactions.
A failing step is logged and retried on the next tick; the reaper never dies.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from fencing.errors import BackendUnavailableError
from lease_server.queue.backends.base import QueueBackend
from lease_server.queue.service import QueueOptions

log = logging.getLogger(__name__)


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


@dataclass
class Reaper:
    backend: QueueBackend
    options: QueueOptions

    async def step(self) -> tuple[int, int]:
        """One pass: (jobs declared dead, jobs pruned)."""
        dead = await self.backend.reap(self.options.reap_batch)
        if dead:
            log.warning("reaper: %d jobs dead after their final attempt's lease expired", dead)
        pruned = await self.backend.prune(
            _ms(self.options.succeeded_retention_s),
            _ms(self.options.dead_retention_s),
            self.options.reap_batch,
        )
        if pruned:
            log.info("reaper: pruned %d finished jobs past their retention", pruned)
        return dead, pruned

    async def run(self) -> None:
        """Step forever, every ``reap_interval_s`` (cancel to stop)."""
        while True:
            try:
                dead, pruned = await self.step()
            except asyncio.CancelledError:
                raise
            except BackendUnavailableError as exc:  # an outage: the health probe says so once
                log.debug("reaper step failed, retrying next tick: %s", exc)
            except Exception:
                log.exception("reaper step failed; retrying next tick")
                dead = pruned = 0
            # A full batch means more is waiting: go again soon instead of a full interval.
            full = max(dead, pruned) >= self.options.reap_batch
            await asyncio.sleep(0 if full else self.options.reap_interval_s)
