"""Stateful property test of every lease backend against a dict model.

Hypothesis drives random acquire / renew / release / describe / time steps on a
real backend and on a tiny model, and checks after each step: tokens strictly
increase per resource, a grant never happens while the model says someone else
holds an unexpired lease, Describe agrees with the model, and the event log tells
the same story (every token acquired once, in order, ended at most once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fencing.errors import LeaseLost
from lease_server.backends.base import LeaseBackend, event_log_of
from lease_server.leases import Grant, Scope, TransitionKind
from tests.backends import LEASE_BACKENDS, BackendFactory, TimeControl

T = TypeVar("T")
RESOURCES = st.sampled_from(["r1", "r2"])
HOLDERS = st.sampled_from(["a", "b", "c"])
TTLS = st.sampled_from([200, 400, 1000])


@dataclass
class ModelLease:
    holder: str
    token: int
    expires_at: int


def machine_for(factory: BackendFactory) -> type[RuleBasedStateMachine]:
    class LeaseMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loop = asyncio.new_event_loop()
            self.cm: AbstractAsyncContextManager[tuple[LeaseBackend, TimeControl]] = factory()
            self.backend, self.time = self.run(self.cm.__aenter__())
            self.now = 0  # model time in ms
            self.leases: dict[str, ModelLease] = {}
            self.last_token: dict[str, int] = {}

        def run(self, coro: Coroutine[Any, Any, T]) -> T:
            return self.loop.run_until_complete(coro)

        def teardown(self) -> None:
            self.run(self.cm.__aexit__(None, None, None))
            self.loop.close()

        def ttl(self, ttl: int) -> int:
            # On a real clock the model cannot follow expiries: make leases outlive the test.
            return ttl if self.time.manual else 600_000

        def live(self, resource: str) -> ModelLease | None:
            lease = self.leases.get(resource)
            return lease if lease and lease.expires_at > self.now else None

        @rule(resource=RESOURCES, holder=HOLDERS, ttl=TTLS)
        def acquire(self, resource: str, holder: str, ttl: int) -> None:
            ttl = self.ttl(ttl)
            outcome = self.run(self.backend.acquire(resource, holder, ttl, ""))
            current = self.live(resource)
            if isinstance(outcome, Grant):
                assert current is None, f"granted {resource} while {current} holds it"
                assert outcome.token > self.last_token.get(resource, 0)
                self.last_token[resource] = outcome.token
                self.leases[resource] = ModelLease(holder, outcome.token, self.now + ttl)
            else:
                assert current is not None, f"refused {resource} although it is free"
                assert outcome.holder == current.holder and outcome.token == current.token

        @rule(resource=RESOURCES, ttl=TTLS)
        def renew(self, resource: str, ttl: int) -> None:
            ttl = self.ttl(ttl)
            lease = self.leases.get(resource)
            if lease is None:
                return
            try:
                self.run(self.backend.renew(resource, lease.token, lease.holder, ttl))
            except LeaseLost:
                assert self.live(resource) is None
                return
            assert self.live(resource) is not None
            lease.expires_at = self.now + ttl

        @rule(resource=RESOURCES)
        def release(self, resource: str) -> None:
            lease = self.leases.get(resource)
            if lease is None:
                return
            try:
                self.run(self.backend.release(resource, lease.token, lease.holder))
            except LeaseLost:
                assert self.live(resource) is None
                return
            del self.leases[resource]

        @precondition(lambda self: self.time.manual)
        @rule(ms=st.sampled_from([50, 150, 250, 450, 1100]))
        def advance(self, ms: int) -> None:
            self.time.advance(ms)
            self.now += ms

        @precondition(lambda self: self.time.manual and event_log_of(self.backend) is not None)
        @rule()
        def sweep(self) -> None:
            events = event_log_of(self.backend)
            assert events is not None
            for event in self.run(events.expire_due(100)):
                lease = self.leases.get(event.resource)
                assert lease is not None and lease.token == event.token
                assert lease.expires_at <= self.now, f"swept a live lease: {event}"

        @invariant()
        def event_log_tells_the_same_story(self) -> None:
            events = event_log_of(self.backend)
            if events is None:
                return
            page = self.run(events.events_after(0, Scope(), 100_000))
            revisions = [e.revision for e in page.events]
            assert revisions == list(range(1, page.head + 1))
            open_token: dict[str, int] = {}
            acquired: dict[str, int] = {}
            for e in page.events:
                if e.kind is TransitionKind.ACQUIRED:
                    assert e.resource not in open_token, f"acquired over a live lease: {e}"
                    assert e.token > acquired.get(e.resource, 0)
                    open_token[e.resource] = acquired[e.resource] = e.token
                else:
                    assert open_token.get(e.resource) == e.token, f"no open lease for {e}"
                    if e.kind is not TransitionKind.RENEWED:
                        del open_token[e.resource]
            assert acquired == self.last_token

        @invariant()
        def describe_agrees(self) -> None:
            for resource in ("r1", "r2"):
                info = self.run(self.backend.describe(resource))
                assert info.last_token == self.last_token.get(resource, 0)
                current = self.live(resource)
                if self.time.manual or current is None:
                    # Real clocks may expire a lease the model still counts as live.
                    assert info.held == (current is not None)
                if info.held and current is not None:
                    assert (info.holder, info.token) == (current.holder, current.token)

    return LeaseMachine


@pytest.mark.parametrize("name", sorted(LEASE_BACKENDS))
def test_backend_matches_the_model(name: str) -> None:
    machine = machine_for(LEASE_BACKENDS[name])
    machine.TestCase.settings = settings(
        max_examples=30 if name in ("memory", "sqlite") else 10,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    machine.TestCase().runTest()
