"""serving.urls: one table of schemes, read by every opener of a store or backend."""

from __future__ import annotations

import pytest

from fencing.errors import InvalidArgumentError
from lease_server.backends import open_backend
from lease_server.queue.backends import open_queue
from serving import urls


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("memory://", "memory"),
        ("sqlite:///tmp/x.db", "sqlite"),
        ("postgres://h/db", "postgres"),
        ("postgresql://h/db", "postgres"),
        ("redis://h:1/0", "redis"),
        ("rediss://h:1/0", "redis"),
        ("redis+cluster://h:1", "redis"),
        ("rediss+cluster://h:1", "redis"),
        ("ftp://h", None),
        ("/tmp/x.db", None),
    ],
)
def test_each_scheme_names_one_kind(url: str, kind: str | None) -> None:
    assert urls.kind(url) == kind


@pytest.mark.parametrize(
    ("opener", "field", "accepted"),
    [
        (open_backend, "backend", "memory://, sqlite:///path, postgresql://... or redis://..."),
        (open_queue, "queue", "memory://, sqlite:///path or postgresql://..."),
    ],
)
def test_an_unknown_scheme_is_refused_naming_the_field(
    opener: object, field: str, accepted: str
) -> None:
    assert callable(opener)
    with pytest.raises(InvalidArgumentError) as err:
        opener("ftp://h")
    assert err.value.field == field
    assert "'ftp://'" in str(err.value)
    assert str(err.value).endswith(f"use {accepted}")


def test_a_kind_an_opener_has_no_implementation_of_is_refused_too() -> None:
    with pytest.raises(InvalidArgumentError) as err:
        open_queue("redis://h:1/0")
    assert err.value.field == "queue"
    assert "'redis://'" in str(err.value)


def test_an_unknown_url_parameter_is_refused_naming_the_known_ones() -> None:
    """A typo is neither ours nor the driver's: refused before anything connects, naming
    the parameter and what is known; ours and the driver's pass (the driver's in order)."""
    from serving import redis_db
    from serving.postgres_db import PgConfig

    ours, theirs = urls.split_params(
        "x://h/?b=1&a=2&c=3", ("a",), driver=("b", "c"), what="test", field="url"
    )
    assert ours == {"a": "2"} and theirs == [("b", "1"), ("c", "3")]
    with pytest.raises(InvalidArgumentError, match=r"'schem'.*known: schema, timeout") as info:
        PgConfig.from_url("postgresql://u@h/db?timeout=2&schem=x")
    assert info.value.field == "url" and "sslmode" in info.value.message
    config = PgConfig.from_url("postgresql://u@h/db?schema=s&sslmode=disable&application_name=a")
    assert config.schema == "s"
    with pytest.raises(InvalidArgumentError, match=r"'prefx'.*known: prefix"):
        redis_db.parse_url("redis://h:1/0?prefx=a")
    target = redis_db.parse_url("redis://h:1/0?prefix=p&socket_timeout=2&protocol=3")
    assert target.prefix == "p" and "socket_timeout=2" in target.url
