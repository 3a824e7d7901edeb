"""The fence rule (G3) as a pure function."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencing.errors import StaleTokenError
from guard.fence import FenceMode, admit, advance

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
