"""The guard's memory of recent refusals: a bounded ring per resource.

An operator asking "why was my write refused?" wants the refusal itself (reason, the
token it carried, the fence it met, who sent it), not a counter. The guard keeps the
last :data:`PER_RESOURCE` refusals of each of the :data:`RESOURCES` most recently
refused resources, in process memory only (a restart forgets them; the log lines
stay the durable record). The bound is in entries, not bytes: at most
``RESOURCES * PER_RESOURCE`` records (20,000 by default), each a few hundred bytes
at most (resource names and principals are capped at the edge), so a few MB in the
worst case, whatever the rate of refusals or the number of resources refused.
``ListRefusals`` reads it.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

#: Refusals kept per resource (the oldest is dropped first).
PER_RESOURCE = 20
#: Resources kept (the one refused least recently is forgotten first).
RESOURCES = 1000


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refused write or fence."""

    reason: str
    token: int
    fence: int
    call: str
    principal: str
    at_unix_ms: int


class RefusalLog:
    """Recent refusals by resource, bounded in resources and in refusals per resource."""

    def __init__(
        self,
        per_resource: int = PER_RESOURCE,
        resources: int = RESOURCES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if per_resource < 1 or resources < 1:
            raise ValueError("per_resource and resources must be >= 1")
        self.per_resource = per_resource
        self.resources = resources
        self._clock = clock
        self._rings: OrderedDict[str, deque[Refusal]] = OrderedDict()
        #: Every refusal since the start, by reason (never forgotten: one key per reason).
        self.counts: Counter[str] = Counter()

    def record(
        self,
        resource: str,
        reason: str,
        token: int,
        *,
        fence: int = 0,
        call: str = "write",
        principal: str = "",
    ) -> None:
        """Remember one refusal of ``resource`` (forgetting the oldest beyond the bounds)."""
        self.counts[reason] += 1
        ring = self._rings.get(resource)
        if ring is None:
            if len(self._rings) >= self.resources:
                self._rings.popitem(last=False)
            ring = self._rings[resource] = deque(maxlen=self.per_resource)
        else:
            self._rings.move_to_end(resource)
        at = int(self._clock() * 1000)
        ring.append(Refusal(reason, token, fence, call, principal, at))

    def recent(self, resource: str) -> list[Refusal]:
        """The refusals of ``resource`` still remembered, newest first."""
        return list(reversed(self._rings.get(resource, ())))

    def __len__(self) -> int:
        """How many refusals are remembered in all."""
        return sum(len(ring) for ring in self._rings.values())
