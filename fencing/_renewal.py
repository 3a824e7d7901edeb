"""When to renew a lease and when to stop trusting it: pure, on an injected monotonic clock.

The server decides expiry on its own clock (G7); the client only ever learns
durations. So the client keeps a *local deadline* that starts no later than the
grant, as the client's own clock can place it::

    start    = min(sent_at + waited * (1 - margin_ratio), received_at)
    deadline = start + ttl - margin,   margin = ttl * margin_ratio + margin_floor

``sent_at`` is when the client sent the request that granted or renewed the lease;
``waited`` is what the server reports it spent waiting before the grant (an Acquire
or a Claim that queued for a held resource), measured from the request's arrival,
which is no earlier than ``sent_at``. So ``sent_at + waited`` is no later than the
grant, whatever the request's or the reply's transit took, and the time in line is
not counted against the lease. ``margin_ratio`` is the bound on how much faster the
server's clock may run than the client's: it is taken off the wait and off the ttl
alike (up to 5 % by default), so the local deadline passes before the server's
expiry. A reply cannot arrive before the grant, which caps ``start`` at
``received_at`` even for a server that overstates its wait.

Renewals are sent every ``ttl / 3`` after the start, like etcd's keepalive; a
failed renewal is retried sooner, but never after the deadline, when the lease is
lost. A grant whose first renewal is already due when it arrives (a reply delayed
by a third of the ttl, or a server that does not report its wait) is renewed before
it is used: :meth:`RenewalSchedule.due_on_arrival`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RenewalPolicy:
    """Tunables of the schedule (seconds and ratios)."""

    renew_ratio: float = 1 / 3
    margin_ratio: float = 0.05
    margin_floor: float = 0.005
    retry_ratio: float = 0.1
    max_retry_interval: float = 1.0

    def margin(self, ttl: float) -> float:
        return min(ttl * self.margin_ratio + self.margin_floor, ttl / 2)

    def start(self, sent_at: float, waited: float, received_at: float | None) -> float:
        """The earliest the server can have granted, on the client's clock: the send
        plus the wait it reports, less the rate-skew allowance, never after the reply."""
        allowed = max(0.0, waited) * max(0.0, 1 - self.margin_ratio)
        start = sent_at + allowed
        return start if received_at is None else max(sent_at, min(start, received_at))


class RenewalSchedule:
    """The local view of one lease: its deadline and when to renew next.

    All times are floats from the same monotonic clock (``time.monotonic`` in the
    SDK, a fake in tests). ``ttl_ms`` is what the server granted, ``waited_ms`` how
    long it reports the request waited before the grant (0 if it does not say), and
    ``received_at`` when the reply arrived (None: not known, no cap).
    """

    def __init__(
        self,
        ttl_ms: int,
        sent_at: float,
        policy: RenewalPolicy | None = None,
        *,
        waited_ms: int = 0,
        received_at: float | None = None,
    ) -> None:
        self.policy = policy or RenewalPolicy()
        self.ttl = ttl_ms / 1000
        start = self.policy.start(sent_at, waited_ms / 1000, received_at)
        self.deadline = start + self.ttl - self.policy.margin(self.ttl)
        self.next_renewal = start + self.ttl * self.policy.renew_ratio

    def due_on_arrival(self, now: float) -> bool:
        """True when the first renewal is already due as the grant arrives: renew it
        before handing it out (its deadline may even have passed, though the server
        still holds it for us)."""
        return now >= self.next_renewal

    def renewed(self, sent_at: float, ttl_ms: int) -> None:
        """A renewal sent at ``sent_at`` succeeded with ``ttl_ms`` granted."""
        ttl = ttl_ms / 1000
        self.ttl = ttl
        self.deadline = max(self.deadline, sent_at + ttl - self.policy.margin(ttl))
        self.next_renewal = sent_at + ttl * self.policy.renew_ratio

    def failed(self, now: float) -> None:
        """A renewal attempt failed without proving loss (timeout, server unreachable)."""
        retry = min(self.ttl * self.policy.retry_ratio, self.policy.max_retry_interval)
        self.next_renewal = min(now + retry, self.deadline)

    def expired(self, now: float) -> bool:
        """True once the local deadline has passed: stop acting on the lease."""
        return now >= self.deadline

    def remaining(self, now: float) -> float:
        return max(0.0, self.deadline - now)

    def sleep_for(self, now: float) -> float:
        """How long to sleep before the next renewal (or the deadline, if sooner)."""
        return max(0.0, min(self.next_renewal, self.deadline) - now)

    def rpc_timeout(self, now: float, cap: float) -> float:
        """A renewal's RPC deadline: never past the lease's local deadline."""
        return max(0.001, min(cap, self.deadline - now))
