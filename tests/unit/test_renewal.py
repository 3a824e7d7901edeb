"""The renewal schedule on a fake clock: renew at ttl/3 from the send, lost at the deadline."""

from __future__ import annotations

import pytest

from fencing._renewal import RenewalPolicy, RenewalSchedule


def test_deadline_is_measured_from_the_send_time_minus_a_margin() -> None:
    policy = RenewalPolicy(margin_ratio=0.05, margin_floor=0.005)
    s = RenewalSchedule(ttl_ms=9000, sent_at=100.0, policy=policy)
    assert s.deadline == pytest.approx(100.0 + 9.0 - (9.0 * 0.05 + 0.005))
    assert s.next_renewal == pytest.approx(103.0)
    assert not s.expired(108.5)
    assert s.expired(s.deadline)


def test_renewal_moves_both_marks_from_its_own_send_time() -> None:
    s = RenewalSchedule(ttl_ms=3000, sent_at=0.0)
    assert s.sleep_for(0.0) == pytest.approx(1.0)
    s.renewed(sent_at=1.0, ttl_ms=3000)
    assert s.next_renewal == pytest.approx(2.0)
    assert s.deadline == pytest.approx(1.0 + 3.0 - s.policy.margin(3.0))


def test_a_late_reply_never_moves_the_deadline_back() -> None:
    s = RenewalSchedule(ttl_ms=3000, sent_at=10.0)
    before = s.deadline
    s.renewed(sent_at=5.0, ttl_ms=3000)  # an old request answered late
    assert s.deadline == before


def test_failed_renewal_retries_sooner_but_not_past_the_deadline() -> None:
    s = RenewalSchedule(ttl_ms=3000, sent_at=0.0)
    s.failed(now=1.0)
    assert 1.0 < s.next_renewal <= 1.0 + 0.3 + 1e-9
    s.failed(now=2.9)
    assert s.next_renewal <= s.deadline
    assert s.sleep_for(100.0) == 0.0
    assert s.remaining(100.0) == 0.0


def test_rpc_timeout_never_outlives_the_lease() -> None:
    s = RenewalSchedule(ttl_ms=1000, sent_at=0.0)
    assert s.rpc_timeout(0.0, cap=5.0) == pytest.approx(s.deadline)
    assert s.rpc_timeout(0.5, cap=0.1) == pytest.approx(0.1)
    assert s.rpc_timeout(10.0, cap=5.0) > 0


def test_margin_is_never_more_than_half_the_ttl() -> None:
    policy = RenewalPolicy(margin_ratio=0.9, margin_floor=1.0)
    assert policy.margin(0.1) == pytest.approx(0.05)
