"""The election twins (:mod:`fencing.election`, :mod:`fencing.async_election`) are held
to the same public names and parameters as the client twins, by the same checks."""

from __future__ import annotations

from typing import Any

import pytest

from fencing.async_election import AsyncElection, AsyncLeadership
from fencing.election import Election, Leadership
from tests.unit import test_twin_parity as parity

TWINS: list[tuple[type[Any], type[Any]]] = [
    (Election, AsyncElection),
    (Leadership, AsyncLeadership),
]


@pytest.mark.parametrize(("sync", "aio"), TWINS, ids=lambda c: c.__name__)
def test_election_twins_have_the_same_public_names(sync: type[Any], aio: type[Any]) -> None:
    parity.test_twins_have_the_same_public_names(sync, aio)


@pytest.mark.parametrize(("sync", "aio"), TWINS, ids=lambda c: c.__name__)
def test_election_twins_take_the_same_parameters(sync: type[Any], aio: type[Any]) -> None:
    # The constructors differ only in the clients' flavour (annotations are not compared).
    parity.test_twins_take_the_same_parameters(sync, aio)


@pytest.mark.parametrize(("sync", "aio"), TWINS, ids=lambda c: c.__name__)
def test_election_twins_do_not_block(sync: type[Any], aio: type[Any]) -> None:
    parity.test_every_async_method_of_the_twin_is_a_coroutine_or_a_context(sync, aio)
