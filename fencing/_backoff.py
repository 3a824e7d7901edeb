"""Bounded exponential backoff with jitter: pure, with the randomness passed in.

One rule serves the queue server (when a failed job is due again) and the worker
SDK (how long to wait before asking an unavailable server again)::

    raw(n)   = min(cap, base * factor ** (n - 1))         n = 1, 2, 3, ...
    delay(n) = raw(n) * (1 - jitter * r)                  r uniform in [0, 1)

so every delay lies in ``[raw(n) * (1 - jitter), raw(n)]``: never above the cap,
and spread out so that many clients failing together do not retry together.
"""

from __future__ import annotations

from dataclasses import dataclass

from fencing.errors import InvalidArgumentError

#: Exponents beyond this are capped anyway and would only overflow a float.
_MAX_EXPONENT = 64


@dataclass(frozen=True, slots=True)
class Backoff:
    """``base`` and ``cap`` in any one unit (the caller's: seconds or milliseconds)."""

    base: float
    cap: float
    factor: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not (0 < self.base <= self.cap):
            raise InvalidArgumentError("backoff needs 0 < base <= cap", field="backoff")
        if self.factor < 1 or not 0 <= self.jitter <= 1:
            raise InvalidArgumentError(
                "backoff needs factor >= 1 and 0 <= jitter <= 1", field="backoff"
            )

    def raw(self, attempt: int) -> float:
        """The un-jittered delay after the ``attempt``-th failure (1-based)."""
        exponent = min(max(attempt, 1) - 1, _MAX_EXPONENT)
        return float(min(self.cap, self.base * self.factor**exponent))

    def delay(self, attempt: int, rand: float) -> float:
        """The delay after the ``attempt``-th failure; ``rand`` uniform in [0, 1)."""
        return self.raw(attempt) * (1 - self.jitter * min(max(rand, 0.0), 1.0))
