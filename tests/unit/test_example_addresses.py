"""The examples connect where the ``fencing`` commands do: ``FENCING_LEASE_ADDR`` and
``FENCING_GUARD_ADDR`` when set, the flags over them, the defaults otherwise."""

from __future__ import annotations

import pytest

from examples._common import parser


def test_the_examples_read_the_client_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FENCING_LEASE_ADDR", "10.0.0.1:7001")
    monkeypatch.setenv("FENCING_GUARD_ADDR", "10.0.0.1:7002")
    args = parser(None).parse_args([])
    assert (args.lease_addr, args.guard_addr) == ("10.0.0.1:7001", "10.0.0.1:7002")
    args = parser(None).parse_args(["--lease-addr", "127.0.0.1:1"])
    assert args.lease_addr == "127.0.0.1:1"
    monkeypatch.delenv("FENCING_LEASE_ADDR")
    monkeypatch.delenv("FENCING_GUARD_ADDR")
    args = parser(None).parse_args([])
    assert (args.lease_addr, args.guard_addr) == ("127.0.0.1:50051", "127.0.0.1:50052")
