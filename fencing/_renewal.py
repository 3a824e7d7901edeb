"""When to renew a lease and when to stop trusting it: pure, on an injected monotonic clock.

The server decides expiry on its own clock (G7); the client only ever learns
durations. So the client keeps a *local deadline* measured from the moment it
*sent* the request that granted or renewed the lease::

    deadline = sent_at + ttl - margin,   margin = ttl * margin_ratio + margin_floor

The server started counting the ttl no earlier than ``sent_at``, so as long as the
two clocks run at nearly the same rate (``margin_ratio`` absorbs up to 5 % drift by
default) the local deadline passes before the server's expiry. Renewals are sent
every ``ttl / 3`` after the last successful send, like etcd's keepalive; a failed
renewal is retried sooner, but never after the deadline, when the lease is lost.
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


class RenewalSchedule:
    """The local view of one lease: its deadline and when to renew next.

    All times are floats from the same monotonic clock (``time.monotonic`` in the
    SDK, a fake in tests). ``ttl_ms`` is what the server granted.
    """

    def __init__(self, ttl_ms: int, sent_at: float, policy: RenewalPolicy | None = None) -> None:
        self.policy = policy or RenewalPolicy()
        self.ttl = ttl_ms / 1000
        self.deadline = sent_at + self.ttl - self.policy.margin(self.ttl)
        self.next_renewal = sent_at + self.ttl * self.policy.renew_ratio

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
