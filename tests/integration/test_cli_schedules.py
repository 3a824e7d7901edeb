"""``fencing queue schedules`` and ``fencing queue schedule add|remove`` against a real
lease server: the listing, JSON, the refusal naming the field, and the exit codes."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import pytest

from fencing.testing import RunningServers, running_servers
from fencingctl import main
from fencingctl.flags import parse_duration
from serving import exits


@pytest.fixture
def servers() -> Iterator[RunningServers]:
    with running_servers("memory://", "memory://") as s:
        yield s


def test_add_list_remove(servers: RunningServers, capsys: pytest.CaptureFixture[str]) -> None:
    at = ["--lease-addr", servers.lease_address]
    add = ["queue", "schedule", "add"]
    assert main([*add, "nightly", "--queue", "reports", "--cron", "0 3 * * *", *at]) == 0
    assert "name=nightly queue=reports next_run=" in capsys.readouterr().out
    assert main([*add, "tick", "--queue", "ticks", "--every", "5m", "--catch-up", "3", *at]) == 0
    capsys.readouterr()
    assert main(["queue", "schedules", *at]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "name", "queue", "schedule", "tz", "catch_up", "next_run", "last_period", "last_job"
    ]  # fmt: skip
    assert lines[1].split()[:6] == ["nightly", "reports", "0", "3", "*", "*"]
    assert lines[2].split()[:6] == ["tick", "ticks", "every", "5m", "UTC", "3"]
    assert main(["queue", "schedules", "ticks", "--json", *at]) == 0
    (line,) = capsys.readouterr().out.splitlines()  # JSON lines, as every list
    listed = json.loads(line)
    assert (listed["name"], listed["every_ms"], listed["catch_up"]) == ("tick", 300_000, 3)
    assert listed["last_period_ms"] == 0 and listed["next_run_ms"] % 300_000 == 0
    assert "every" not in listed and "next_run" not in listed
    assert main(["queue", "schedule", "remove", "tick", *at]) == 0
    assert capsys.readouterr().out.strip() == "removed tick"
    assert main(["queue", "schedule", "remove", "tick", "--json", *at]) == exits.CODES["NOT_FOUND"]
    out = capsys.readouterr()
    assert "error: NOT_FOUND: no schedule 'tick'" in out.err
    assert json.loads(out.out)["reason"] == "NOT_FOUND"


def test_a_bad_cron_expression_exits_invalid_argument_naming_the_field(
    servers: RunningServers, capsys: pytest.CaptureFixture[str]
) -> None:
    add = ["queue", "schedule", "add", "x", "--queue", "q", "--cron", "* * *", "--json"]
    code = main([*add, "--lease-addr", servers.lease_address])
    assert code == exits.CODES["INVALID_ARGUMENT"]
    out = capsys.readouterr()
    assert json.loads(out.out)["metadata"]["field"] == "schedule.cron"
    assert "needs 5" in out.err


def test_cron_and_every_are_one_or_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["queue", "schedule", "add", "x", "--queue", "q", "--cron", "* * * * *",
              "--every", "1m"])  # fmt: skip
    assert info.value.code == exits.CODES["USAGE"]
    capsys.readouterr()


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("30s", 30), ("5m", 300), ("1h", 3600), ("1500ms", 1.5)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_bad_duration_is_a_usage_error() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration("soon")
