"""The fence rule (G3) as a pure function."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencing.errors import LeaseLost, StaleTokenError
from guard.fence import FenceMode, Recorded, admit, advance, judge, judge_all, may_fence

TOKENS = st.integers(min_value=0, max_value=2**63 - 1)


@given(token=TOKENS, fence=TOKENS)
def test_admit_accepts_exactly_tokens_at_or_above_the_fence(token: int, fence: int) -> None:
    if token >= fence:
        assert admit("r", token, fence) == token
    else:
        with pytest.raises(StaleTokenError) as stale:
            admit("r", token, fence)
        assert stale.value.current_token == fence
        assert stale.value.token == token


@given(token=TOKENS, fence=TOKENS)
def test_the_fence_never_goes_down(token: int, fence: int) -> None:
    assert admit("r", token, fence, FenceMode.OFF) == max(token, fence)
    try:
        assert advance("r", token, fence) >= fence
    except StaleTokenError:
        assert token < fence


@pytest.mark.parametrize("mode", [m for m in FenceMode if m is not FenceMode.OFF])
def test_every_fencing_mode_rejects_a_token_below_the_fence(mode: FenceMode) -> None:
    with pytest.raises(StaleTokenError):
        admit("r", 4, 5, mode)
    assert admit("r", 5, 5, mode) == 5


def test_off_mode_admits_a_stale_token() -> None:
    assert admit("r", 1, 5, FenceMode.OFF) == 5
    with pytest.raises(StaleTokenError):
        admit("r", 1, 5, FenceMode.MONOTONIC)


@pytest.mark.parametrize("mode", [m for m in FenceMode if m is not FenceMode.OFF])
def test_every_mode_but_off_rejects_a_stale_write(mode: FenceMode) -> None:
    with pytest.raises(StaleTokenError):
        admit("r", 1, 5, mode)
    assert admit("r", 5, 5, mode) == 5


RECORDS = st.none() | st.builds(Recorded, fence=TOKENS, token=TOKENS.filter(lambda t: t > 0))


@given(token=TOKENS, fence=TOKENS, recorded=RECORDS, live=st.booleans())
def test_judge_judges_the_token_before_the_key(
    token: int, fence: int, recorded: Recorded | None, live: bool
) -> None:
    """In every fencing mode a replay is told only to a token that may write now; a
    stale token is refused whether or not its key is known, saying whose it was."""
    applied, by = recorded is not None, (recorded.token if recorded else 0)
    for mode in (FenceMode.MONOTONIC, FenceMode.WATCH, FenceMode.STRICT):
        if token < fence:
            with pytest.raises(StaleTokenError) as stale:
                judge("r", token, fence, mode, has_key=True, recorded=recorded, live=live)
            assert (stale.value.key_applied, stale.value.applied_by_token) == (applied, by)
        elif mode is FenceMode.STRICT and not live:
            with pytest.raises(LeaseLost) as lost:
                judge("r", token, fence, mode, has_key=True, recorded=recorded, live=live)
            assert (lost.value.key_applied, lost.value.applied_by_token) == (applied, by)
        elif recorded is not None:
            judged = judge("r", token, fence, mode, has_key=True, recorded=recorded, live=live)
            assert judged.replayed and judged.replayed_by_token == recorded.token
            assert judged.fence == recorded.fence
        else:
            judged = judge("r", token, fence, mode, has_key=True, recorded=recorded, live=live)
            assert not judged.replayed and judged.fence == max(token, fence)


def test_judge_without_a_key_says_nothing_of_keys() -> None:
    with pytest.raises(StaleTokenError) as stale:
        judge("r", 1, 2)
    assert stale.value.key_applied is None
    assert "key_applied" not in stale.value.metadata()


def test_the_old_order_control_off_mode_answers_the_key_first() -> None:
    """The control: unfenced, a stale token with a known key reads as a success."""
    judged = judge("r", 1, 2, FenceMode.OFF, has_key=True, recorded=Recorded(2, 2))
    assert judged.replayed and judged.replayed_by_token == 2


def test_judge_all_refuses_the_first_stale_in_sorted_order_before_any_replay() -> None:
    claims = [("b", 1, 5), ("a", 1, 3), ("c", 9, 1)]
    recorded = [Recorded(5, 5), None, Recorded(9, 9)]
    with pytest.raises(StaleTokenError) as stale:
        judge_all(claims, has_key=True, recorded=recorded)
    assert stale.value.resource == "a" and stale.value.key_applied is False
    fresh = [("b", 5, 5), ("a", 3, 3)]
    replay = judge_all(fresh, has_key=True, recorded=[Recorded(5, 4), None])
    assert replay == ([5, 3], [4, 0])
    with pytest.raises(LeaseLost):
        judge_all(fresh, FenceMode.STRICT, live=[True, False])
    assert judge_all(fresh, has_key=True, recorded=[None, Recorded(3, 3)]) is None


def test_strict_promises_need_the_live_lease() -> None:
    with pytest.raises(LeaseLost):
        may_fence("r", 2**63 - 1, FenceMode.STRICT, live=False)
    may_fence("r", 2**63 - 1, FenceMode.MONOTONIC, live=False)  # monotonic cannot know
