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
