"""guard.stores: stores found by URL scheme (built-ins, register_store, entry points)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fencing.errors import InvalidArgumentError
from guard.stores import (
    ENTRY_POINT_GROUP,
    installed_schemes,
    open_store,
    register_store,
    unregister_store,
)
from guard.stores.base import REQUIRED_MEMBERS, STORE_API_VERSION, GuardStore
from guard.stores.memory import MemoryStore


@pytest.fixture
def scheme() -> Iterator[str]:
    yield "unit-test"
    unregister_store("unit-test")


def test_an_unknown_scheme_names_the_field_and_every_installed_scheme() -> None:
    with pytest.raises(InvalidArgumentError) as err:
        open_store("ftp://h")
    assert err.value.field == "store"
    message = str(err.value)
    assert "'ftp://'" in message and ENTRY_POINT_GROUP in message
    for s in ("memory://", "sqlite://", "postgresql://", "redis://", "redis+cluster://"):
        assert s in message


def test_a_registered_scheme_opens_and_is_listed(scheme: str) -> None:
    seen: list[str] = []

    def factory(url: str) -> GuardStore:
        seen.append(url)
        return MemoryStore()

    register_store(scheme, factory)
    assert scheme in installed_schemes()
    assert isinstance(open_store(f"{scheme}://somewhere?x=1"), MemoryStore)
    assert seen == [f"{scheme}://somewhere?x=1"]
    unregister_store(scheme)
    assert scheme not in installed_schemes()


@pytest.mark.parametrize("bad", ["", "Upper", "x://"])
def test_a_scheme_must_be_a_lower_case_url_scheme(bad: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        register_store(bad, lambda url: MemoryStore())
    assert err.value.field == "scheme"


class Incomplete:
    name = "incomplete"

    async def write(self) -> None:
        return None


def test_a_store_missing_members_is_refused_naming_them(scheme: str) -> None:
    register_store(scheme, lambda url: Incomplete())  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidArgumentError) as err:
        open_store(f"{scheme}://")
    assert err.value.field == "store"
    missing = set(REQUIRED_MEMBERS) - {"name", "write"}
    assert all(m in str(err.value) for m in missing), str(err.value)
    assert "read," in str(err.value) and " write," not in str(err.value)


class Future(MemoryStore):
    api_version = STORE_API_VERSION + 1


def test_a_store_of_another_api_version_is_refused(scheme: str) -> None:
    register_store(scheme, lambda url: Future())
    with pytest.raises(InvalidArgumentError) as err:
        open_store(f"{scheme}://")
    assert f"version {STORE_API_VERSION + 1}" in str(err.value)
