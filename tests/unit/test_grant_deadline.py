"""The local deadline of a grant that waited, on injected clocks.

A simulated timeline in real time: the client sends at ``t0`` (its clock runs at
rate ``c``), the request reaches the server ``d1`` later, waits there ``w``, is
granted (expiry ``ttl`` later by the server's clock, which runs at rate 1), and the
reply reaches the client ``d2`` after the grant. The server reports what it
measured (``waited``, ``ttl``) in its own units; the client knows only its own
clock. The rule must keep the local deadline before the server's expiry for every
delay and every rate within the policy's bound, and must not count the wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencing._renewal import RenewalPolicy, RenewalSchedule
from tests.thorough import examples

POLICY = RenewalPolicy()  # margin_ratio 0.05: the rate skew it absorbs


@dataclass(frozen=True)
class Timeline:
    c: float  # client clock rate relative to the server's
    t0: float  # real time of the send
    d1: float  # request transit
    w: float  # real time spent waiting on the server
    d2: float  # reply transit
    ttl: float  # granted, in server seconds

    def client(self, real: float) -> float:
        return 1000.0 + self.c * real  # an arbitrary origin: monotonic clocks share none

    def real(self, client: float) -> float:
        return (client - 1000.0) / self.c

    @property
    def grant(self) -> float:
        return self.t0 + self.d1 + self.w

    @property
    def expiry(self) -> float:
        return self.grant + self.ttl

    def schedule(self, policy: RenewalPolicy = POLICY) -> RenewalSchedule:
        return RenewalSchedule(
            round(self.ttl * 1000),
            self.client(self.t0),
            policy,
            waited_ms=int(self.w * 1000),  # the server floors what it measured
            received_at=self.client(self.grant + self.d2),
        )


timelines = st.builds(
    Timeline,
    c=st.floats(1 - POLICY.margin_ratio, 1 + POLICY.margin_ratio),
    t0=st.floats(0, 1e5),
    d1=st.floats(0, 30),
    w=st.floats(0, 600),
    d2=st.floats(0, 30),
    ttl=st.integers(100, 3_600_000).map(lambda ms: ms / 1000),  # the wire carries ms
)


@settings(max_examples=examples(2000), deadline=None)
@given(timelines)
def test_the_local_deadline_never_outlives_the_servers_expiry(tl: Timeline) -> None:
    assert tl.real(tl.schedule().deadline) <= tl.expiry + 1e-9


@settings(max_examples=examples(500), deadline=None)
@given(timelines)
def test_the_first_renewal_is_due_no_later_than_a_third_of_the_ttl_after_the_grant(
    tl: Timeline,
) -> None:
    assert tl.real(tl.schedule().next_renewal) <= tl.grant + tl.ttl / 3 / tl.c + 1e-6


def test_a_grant_after_a_wait_longer_than_the_ttl_is_alive_on_arrival() -> None:
    # The README's story: 29 s in line for a 10 s lease, a fast network.
    tl = Timeline(c=1.0, t0=0.0, d1=0.001, w=29.0, d2=0.001, ttl=10.0)
    s = tl.schedule()
    received = tl.client(tl.grant + tl.d2)
    assert not s.expired(received)
    # Alive for the ttl from the grant, less the margin and the skew allowance on the wait.
    assert s.remaining(received) == pytest.approx(
        10.0 - POLICY.margin(10.0) - 29.0 * POLICY.margin_ratio - 0.002, abs=0.01
    )
    assert not s.due_on_arrival(received)


def test_control_the_send_time_deadline_is_lost_on_arrival() -> None:
    """The old rule (send time + ttl - margin, the wait counted against the lease)."""
    tl = Timeline(c=1.0, t0=0.0, d1=0.001, w=29.0, d2=0.001, ttl=10.0)
    old = RenewalSchedule(10_000, tl.client(tl.t0), POLICY)
    assert old.expired(tl.client(tl.grant + tl.d2))


def test_control_a_deadline_from_the_reply_outlives_the_expiry_when_the_reply_is_late() -> None:
    """Trusting the arrival of the reply instead (received + ttl - margin) is unsafe."""
    tl = Timeline(c=1.0, t0=0.0, d1=0.0, w=5.0, d2=2.0, ttl=10.0)
    naive = tl.client(tl.grant + tl.d2) + tl.ttl - POLICY.margin(tl.ttl)
    assert tl.real(naive) > tl.expiry
    assert tl.real(tl.schedule().deadline) <= tl.expiry


def test_control_the_wait_without_its_skew_allowance_is_unsafe_for_a_slow_client_clock() -> None:
    """Taking the server's wait at face value breaks under clock-rate skew."""
    tl = Timeline(c=0.95, t0=0.0, d1=0.0, w=600.0, d2=0.0, ttl=10.0)
    no_allowance = tl.client(tl.t0) + tl.w + tl.ttl - POLICY.margin(tl.ttl)
    assert tl.real(no_allowance) > tl.expiry
    assert tl.real(tl.schedule().deadline) <= tl.expiry


def test_a_server_that_overstates_its_wait_is_capped_at_the_reply() -> None:
    s = RenewalSchedule(1000, sent_at=0.0, waited_ms=60_000, received_at=2.0)
    assert s.deadline <= 2.0 + 1.0 - s.policy.margin(1.0)


def test_a_late_reply_makes_the_renewal_due_on_arrival() -> None:
    """Reply so late that a third of the ttl from the grant has passed: renew before use."""
    tl = Timeline(c=1.0, t0=0.0, d1=0.0, w=2.0, d2=1.5, ttl=3.0)
    assert tl.schedule().due_on_arrival(tl.client(tl.grant + tl.d2))


def test_a_server_that_reports_no_wait_gets_the_send_time_deadline() -> None:
    """An older server (no waited_ms): as before, and a renewal is due on arrival."""
    s = RenewalSchedule(10_000, sent_at=0.0, received_at=29.0)
    assert s.deadline == pytest.approx(10.0 - s.policy.margin(10.0))
    assert s.due_on_arrival(29.0)
