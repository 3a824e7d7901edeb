"""Bounded exponential backoff with jitter: pure, with the randomness passed in.

One type serves every retry loop of the project: the queue server (when a failed job
is due again), the worker SDK (how long to wait before asking an unavailable server
again), the clients' retries of idempotent calls, and the guard's watch follower
(how long before it reconnects)::

    raw(n)   = min(cap, base * factor ** (n - 1))         n = 1, 2, 3, ...
    delay(n) = raw(n) * (1 - jitter * r)                  r uniform in [0, 1)

so every delay lies in ``[raw(n) * (1 - jitter), raw(n)]``: never above the cap,
and spread out so that many clients failing together do not retry together.
``retries`` bounds how many times a loop may try again (None: without end).

:class:`Backoff` is the policy (frozen, shared); :meth:`Backoff.attempts` starts the
count of one loop (:class:`Attempts`: the next pause, or None once out of retries;
``pause`` for a loop that never gives up; ``reset`` after a success).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fencing.errors import InvalidArgumentError

#: Exponents beyond this are capped anyway and would only overflow a float.
_MAX_EXPONENT = 64


def _no_jitter() -> float:
    return 0.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """``base`` and ``cap`` in any one unit (the caller's: seconds or milliseconds)."""

    base: float
    cap: float
    factor: float = 2.0
    jitter: float = 0.2
    #: How many times a loop may try again after its first failure (None: no bound).
    retries: int | None = None

    def __post_init__(self) -> None:
        if not (0 < self.base <= self.cap):
            raise InvalidArgumentError("backoff needs 0 < base <= cap", field="backoff")
        if self.factor < 1 or not 0 <= self.jitter <= 1:
            raise InvalidArgumentError(
                "backoff needs factor >= 1 and 0 <= jitter <= 1", field="backoff"
            )
        if self.retries is not None and self.retries < 0:
            raise InvalidArgumentError("backoff needs retries >= 0", field="backoff")

    def raw(self, attempt: int) -> float:
        """The un-jittered delay after the ``attempt``-th failure (1-based)."""
        exponent = min(max(attempt, 1) - 1, _MAX_EXPONENT)
        return float(min(self.cap, self.base * self.factor**exponent))

    def delay(self, attempt: int, rand: float) -> float:
        """The delay after the ``attempt``-th failure; ``rand`` uniform in [0, 1)."""
        return self.raw(attempt) * (1 - self.jitter * min(max(rand, 0.0), 1.0))

    def allows(self, attempt: int) -> bool:
        """Whether the ``attempt``-th failure (1-based) may still be retried."""
        return self.retries is None or attempt <= self.retries

    def attempts(self, rand: Callable[[], float] = _no_jitter) -> Attempts:
        """A fresh count for one retry loop; ``rand`` draws the jitter (default none:
        every pause is ``raw``)."""
        return Attempts(self, rand)


class Attempts:
    """The running count of one retry loop under a :class:`Backoff`."""

    __slots__ = ("_rand", "failures", "policy")

    def __init__(self, policy: Backoff, rand: Callable[[], float] = _no_jitter) -> None:
        self.policy = policy
        self._rand = rand
        #: Failures since the start or the last :meth:`reset`.
        self.failures = 0

    def next(self) -> float | None:
        """Count a failure: the pause before trying again, or None once out of retries."""
        self.failures += 1
        if not self.policy.allows(self.failures):
            return None
        return self.policy.delay(self.failures, self._rand())

    def pause(self) -> float:
        """Count a failure: the pause before trying again, for a loop that never gives
        up (the policy's ``retries`` is not consulted)."""
        self.failures += 1
        return self.policy.delay(self.failures, self._rand())

    def reset(self) -> None:
        """A success: the next failure pauses as briefly as the first."""
        self.failures = 0
