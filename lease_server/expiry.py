"""The expiry sweeper: turns leases whose time ran out into EXPIRED events.

Expiry itself needs no sweeper: a lease is dead the moment its expiry passes on
the backend's clock (G7), and acquire takes it over from then on. The sweeper
only makes that death *visible* to watchers soon, so a guard in ``watch`` mode can
fence the dead token before anyone takes over. Every lease server sweeps; the
backend's ``expire_due`` is conditional, so each expiry is appended exactly once
however many servers share the backend. It also keeps the event log bounded
(``prune_events``), and wakes the local waiters of a resource that expired.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from fencing.errors import BackendUnavailableError, FencingError
from lease_server.backends.base import EventLog

log = logging.getLogger(__name__)

#: Seconds between sweeps: an EXPIRED event is appended at most about twice this late.
SWEEP_INTERVAL = 0.05
#: Leases cleared per backend call; a full batch is followed by another at once.
SWEEP_BATCH = 500
#: Events kept in the log by default: a watcher that resumes from a revision older
#: than the newest this many events gets RESYNC.
DEFAULT_EVENT_RETENTION = 100_000
#: Seconds between prunes of the event log.
PRUNE_INTERVAL = 5.0
#: Seconds to back off after the backend failed.
ERROR_BACKOFF = 1.0


class Sweeper:
    def __init__(
        self,
        backend: EventLog,
        *,
        on_expired: Callable[[str], None] = lambda resource: None,
        interval: float = SWEEP_INTERVAL,
        retention: int = DEFAULT_EVENT_RETENTION,
        prune_interval: float = PRUNE_INTERVAL,
    ) -> None:
        self.backend = backend
        self.on_expired = on_expired
        self.interval = interval
        self.retention = retention
        self.prune_interval = prune_interval
        self.expired = 0

    async def sweep(self) -> int:
        """One sweep: clear what is due (in batches); return how many leases expired."""
        count = 0
        while True:
            events = await self.backend.expire_due(SWEEP_BATCH)
            for event in events:
                log.info(
                    "expired",
                    extra={
                        "resource": event.resource,
                        "holder": event.holder,
                        "token": event.token,
                        "revision": event.revision,
                    },
                )
                self.on_expired(event.resource)
            count += len(events)
            if len(events) < SWEEP_BATCH:
                self.expired += count
                return count

    async def run(self) -> None:
        """Sweep every ``interval`` and prune every ``prune_interval``, until cancelled."""
        next_prune = time.monotonic() + self.prune_interval
        while True:
            delay = self.interval
            try:
                await self.sweep()
                if time.monotonic() >= next_prune:
                    next_prune = time.monotonic() + self.prune_interval
                    pruned = await self.backend.prune_events(self.retention)
                    if pruned:
                        log.info("pruned %d events (keeping %d)", pruned, self.retention)
            except FencingError as exc:
                # An outage fails every sweep: the health probe's "backend down" says it once.
                level = (
                    logging.DEBUG if isinstance(exc, BackendUnavailableError) else logging.WARNING
                )
                log.log(level, "expiry sweep failed, retrying: %s", exc)
                delay = ERROR_BACKOFF
            except Exception:  # the sweeper must never die silently
                log.exception("expiry sweep crashed, retrying")
                delay = ERROR_BACKOFF
            await asyncio.sleep(delay)
