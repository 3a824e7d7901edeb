"""One duration parser and one validation for every flag of the ``fencing`` commands:
``30s`` reads the same everywhere, and a value the servers would refuse (or that
means nothing locally) is a usage error naming the flag, before anything is sent."""

from __future__ import annotations

import json

import pytest

from fencing.testing import RunningServers
from fencingctl import main
from serving import exits


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main([*argv, "--json"]) == exits.OK, capsys.readouterr().err
    fields: dict[str, object] = json.loads(capsys.readouterr().out)
    return fields


def test_durations_take_units_on_every_flag(
    servers: RunningServers, capsys: pytest.CaptureFixture[str]
) -> None:
    lease = ["--lease-addr", servers.lease_address]
    acquired = run_json(
        capsys, "lease", "acquire", "flags/a", "--ttl", "30s", "--wait", "1s", *lease
    )
    assert acquired["ttl_ms"] == 30_000
    renewed = run_json(
        capsys, "lease", "renew", "flags/a", str(acquired["token"]), "--ttl", "1m", *lease
    )
    assert renewed["ttl_ms"] == 60_000
    job = run_json(capsys, "queue", "enqueue", "flags", "x", "--delay", "30s", *lease)
    assert job["id"]
    assert (
        main(["queue", "schedule", "add", "f", "--queue", "flags", "--every", "30s", *lease]) == 0
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["lease", "acquire", "r", "--ttl", "0.01"], "argument --ttl: must be at least 100ms"),
        (["lease", "acquire", "r", "--ttl", "2h"], "argument --ttl: must be at most 1h"),
        (["lease", "acquire", "r", "--ttl", "soon"], "argument --ttl: 'soon' is not a duration"),
        (["lease", "acquire", "r", "--wait", "-1"], "argument --wait: must be 0 or more"),
        (["lease", "renew", "r", "-5"], "argument token: must be 1..9223372036854775807"),
        (["lease", "release", "r", "x"], "argument token: must be a whole number"),
        (["put", "r", "k", "v", "--token", "-5"], "argument --token: must be 1.."),
        (["lock", "r", "--timeout", "-1", "--", "true"], "argument --timeout: must be 0 or more"),
        (["lock", "r", "--grace", "-3", "--", "true"], "argument --grace: must be 0 or more"),
        (["elect", "r", "--ttl", "10ms", "--", "true"], "argument --ttl: must be at least 100ms"),
        (["queue", "enqueue", "q", "x", "--delay=-1s"], "argument --delay: must be 0 or more"),
        (["queue", "jobs", "q", "--page-size", "5000"], "argument --page-size: must be 0..1000"),
        (["queue", "job", "0"], "argument id: must be 1.."),
        (["watch", "--from", "-1"], "argument --from: must be 0 or more"),
    ],
)
def test_a_bad_flag_value_is_a_usage_error_naming_the_flag(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--lease-addr", "127.0.0.1:1"] if argv[0] != "put" else argv)
    assert exited.value.code == exits.USAGE
    assert says in capsys.readouterr().err


def test_put_without_a_token_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FENCING_TOKEN", raising=False)
    assert main(["put", "r", "k", "v", "--guard-addr", "127.0.0.1:1"]) == exits.USAGE
    assert "error: USAGE: no token: give --token" in capsys.readouterr().err
    monkeypatch.setenv("FENCING_TOKEN", "0")
    assert main(["put", "r", "k", "v", "--guard-addr", "127.0.0.1:1"]) == exits.USAGE
    assert "error: USAGE: FENCING_TOKEN must be 1.." in capsys.readouterr().err


def test_json_lists_are_json_lines_with_times_in_ms(
    servers: RunningServers, capsys: pytest.CaptureFixture[str]
) -> None:
    """One shape for every --json: a list is one object a line (as ``queue jobs``,
    ``lease list`` and ``watch`` print it), a time or duration is integer ms (``*_ms``)."""
    lease = ["--lease-addr", servers.lease_address]
    for queue in ("shape-a", "shape-b"):
        assert main(["queue", "enqueue", queue, "x", *lease]) == 0
    capsys.readouterr()
    assert main(["queue", "stats", "--json", "--window", "1h", *lease]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    mine = {row["queue"]: row for row in rows if row["queue"].startswith("shape-")}
    assert set(mine) == {"shape-a", "shape-b"}
    assert mine["shape-a"]["window_ms"] == 3_600_000
    assert isinstance(mine["shape-a"]["oldest_ready_age_ms"], int)
    assert "window" not in mine["shape-a"] and "oldest_ready_age" not in mine["shape-a"]
