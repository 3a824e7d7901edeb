"""Limits at the edge: each violation names its field."""

from __future__ import annotations

import pytest

from fencing import limits
from fencing.errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: limits.check_resource(""), "resource"),
        (lambda: limits.check_resource("x" * 257), "resource"),
        (lambda: limits.check_resource("é" * 129), "resource"),  # 258 bytes of UTF-8
        (lambda: limits.check_resource("a\nb"), "resource"),
        (lambda: limits.check_resource("a\x00b"), "resource"),
        (lambda: limits.check_holder("h" * 129), "holder"),
        (lambda: limits.check_ttl_ms(99), "ttl_ms"),
        (lambda: limits.check_ttl_ms(3_600_001), "ttl_ms"),
        (lambda: limits.check_wait_ms(-1), "wait_ms"),
        (lambda: limits.check_wait_ms(300_001), "wait_ms"),
        (lambda: limits.check_token(0), "token"),
        (lambda: limits.check_key("k" * 1025), "key"),
        (lambda: limits.check_value(b"v" * (1024 * 1024 + 1)), "value"),
        (lambda: limits.check_op_count(0), "ops"),
        (lambda: limits.check_op_count(1001), "ops"),
    ],
)
def test_violations_name_the_field(call: object, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        call()  # type: ignore[operator]
    assert err.value.field == field
    assert field in str(err.value)


def test_values_at_the_limits_pass() -> None:
    assert limits.check_resource("x" * 256) == "x" * 256
    assert limits.check_resource("orders/eu-1 ünïcode") == "orders/eu-1 ünïcode"
    assert limits.check_holder("h" * 128)
    assert limits.check_ttl_ms(100) == 100
    assert limits.check_ttl_ms(3_600_000) == 3_600_000
    assert limits.check_wait_ms(0) == 0
    assert limits.check_wait_ms(300_000) == 300_000
    assert limits.check_key("k" * 1024)
    assert limits.check_value(b"v" * 1024 * 1024)
    assert limits.check_op_count(1000) == 1000
    assert limits.check_request_id("") == ""
