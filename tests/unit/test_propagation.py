"""Reading a fenced claim from gRPC metadata (pure), and the current-claim contextvar."""

from __future__ import annotations

import pytest

from fencing import propagation
from fencing.errors import InvalidArgumentError
from fencing.types import Claim

R, T = propagation.RESOURCE_KEY, propagation.TOKEN_KEY


def test_round_trip_and_absence() -> None:
    md = propagation.to_metadata(Claim("orders", 42))
    assert propagation.from_metadata([("other", "x"), *md]) == Claim("orders", 42)
    assert propagation.from_metadata([(R, b"orders"), (T, b"42")]) == Claim("orders", 42)
    assert propagation.from_metadata([("other", "x")]) is None
    assert propagation.from_metadata(None) is None
    assert propagation.has_token(md) and not propagation.has_token([(R, "orders")])


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ([(R, "orders")], T),
        ([(T, "1")], R),
        ([(R, "orders"), (T, "1"), (T, "2")], T),
        ([(R, "orders"), (T, "-1")], T),
        ([(R, "orders"), (T, "0")], T),
        ([(R, "orders"), (T, "1e3")], T),
        ([(R, "orders"), (T, str(2**63))], T),
        ([(R, "bad\x01name"), (T, "1")], R),
        ([(R, ""), (T, "1")], R),
    ],
)
def test_bad_metadata_names_the_key(metadata: list[tuple[str, str]], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        propagation.from_metadata(metadata)
    assert err.value.field == field


def test_bound_nests_and_restores() -> None:
    assert propagation.current() is None
    with propagation.bound(Claim("a", 1)):
        with propagation.bound(Claim("b", 2)):
            assert propagation.current() == Claim("b", 2)
        assert propagation.current() == Claim("a", 1)
    assert propagation.current() is None
