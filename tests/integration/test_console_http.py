"""The console's login, CSRF and read-only refusals over real HTTP against real servers
(the browser tests show the pages; these check what a forged request gets)."""

from __future__ import annotations

import asyncio
import http.cookiejar
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.operators import Operators, parse_operators, password_digest
from fencing import Claim, GuardClient, InvalidArgumentError, LeaseClient, LeaseLost, QueueClient
from fencing.testing import RunningServers, running_servers
from guard.fence import FenceMode
from tests.e2e.console_helpers import OPERATOR, OPERATORS, PASSWORD, running_console
from tests.waiting import eventually


@pytest.fixture(scope="module")
def servers() -> Iterator[RunningServers]:
    with running_servers() as s:
        yield s


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )


def _fetch(
    opener: urllib.request.OpenerDirector, url: str, form: dict[str, str] | None = None
) -> tuple[int, str]:
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    try:
        with opener.open(url, data=data, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _dead_job(servers: RunningServers, queue: str) -> int:
    with QueueClient(servers.queue_address, worker="w") as worker:
        worker.enqueue(queue, b"x", max_attempts=1)
        (job,) = worker.claim(queue, ttl=30)
        worker.fail(job, "boom")
        assert worker.get_job(job.id).state == "dead"
        return job.id


def test_an_action_needs_login_and_the_sessions_csrf_token(
    servers: RunningServers, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = _dead_job(servers, "csrf-q")
    target = {"queue": "csrf-q", "job": str(job_id)}
    with running_console(servers.lease_address, servers.guard_address, allow_actions=True) as url:
        browser = _opener()
        # Not logged in: the action is refused.
        status, body = _fetch(browser, f"{url}/actions/retry", {**target, "csrf": "x"})
        assert status == 403 and "Log in" in body
        status, body = _fetch(browser, f"{url}/login", {"operator": OPERATOR, "password": "no"})
        assert status == 401 and "Wrong name or password" in body
        status, _ = _fetch(browser, f"{url}/login", {"operator": OPERATOR, "password": PASSWORD})
        assert status == 200
        # Logged in, but a forged form without the session's token: refused, nothing done.
        status, body = _fetch(browser, f"{url}/actions/retry", {**target, "csrf": "forged"})
        assert status == 403 and "CSRF" in body
        with QueueClient(servers.queue_address) as q:
            assert q.get_job(job_id).state == "dead"
        status, page = _fetch(browser, f"{url}/actions/retry?queue=csrf-q&job={job_id}")
        assert status == 200
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert found is not None
        status, body = _fetch(browser, f"{url}/actions/retry", {**target, "csrf": found[1]})
        assert status == 200 and "retried" in body
        assert any(
            r.getMessage()
            == f"console action retry queue=csrf-q job={job_id} by={OPERATOR}: retried"
            for r in caplog.records
        ), "the action is logged with who did it"
        with QueueClient(servers.queue_address) as q:
            assert q.get_job(job_id).state == "ready"


def test_a_read_only_console_refuses_even_a_logged_in_form(servers: RunningServers) -> None:
    job_id = _dead_job(servers, "ro-q")
    with running_console(servers.lease_address, servers.guard_address) as url:
        status, body = _fetch(
            _opener(), f"{url}/actions/requeue-dead", {"queue": "ro-q", "job": str(job_id)}
        )
        assert status == 403 and "Read-only" in body
        status, _ = _fetch(_opener(), f"{url}/login", {"operator": OPERATOR, "password": PASSWORD})
        assert status == 401  # no operators configured: nobody logs in
    with QueueClient(servers.queue_address) as q:
        assert q.get_job(job_id).state == "dead"


def test_operators_are_checked_naming_the_entry() -> None:
    digest = password_digest("pw").hex()
    assert parse_operators(f"bob:sha256:{digest}, ") == {"bob": bytes.fromhex(digest)}
    with pytest.raises(InvalidArgumentError, match=r"operators\[1\]"):
        parse_operators(f"bob:sha256:{digest},carol:hunter2")
    with pytest.raises(InvalidArgumentError, match="64 hex digits"):
        parse_operators("bob:sha256:abcd")
    ops = Operators(parse_operators(f"bob:sha256:{digest}"))
    assert ops.login("bob", "wrong") is None
    assert ops.login("eve", "pw") is None
    session = ops.session(ops.login("bob", "pw"))
    assert session is not None and session.operator == "bob"
    assert not Operators.csrf_ok(session, "") and Operators.csrf_ok(session, session.csrf)


def test_the_settings_come_from_a_toml_file_too(tmp_path: Path) -> None:
    config = tmp_path / "console.toml"
    config.write_text(
        f'allow_actions = true\noperators = "{OPERATORS}"\nconsole_listen = "127.0.0.1:0"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "console", "--config", str(config), "--check-config"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"allow_actions = True  # {config}: allow_actions" in done.stdout
    config.write_text('operators = "carol:hunter2"\n')
    done = subprocess.run(
        [sys.executable, "-m", "console", "--config", str(config), "--check-config"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "operators[0]" in done.stderr


def test_allow_actions_without_operators_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "console", "--allow-actions", "--check-config"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "allow_actions needs operators" in done.stderr


def test_the_guards_page_shows_a_watch_guards_follower_and_its_lag() -> None:
    with (
        running_servers(mode=FenceMode.WATCH) as servers,
        running_console(servers.lease_address, servers.guard_address) as url,
        LeaseClient(servers.lease_address) as leases,
    ):
        leases.acquire("watched", 30)
        with GuardClient(servers.guard_address) as guard:
            asyncio.run(eventually(lambda: guard.describe_fence("watched") == 1, "fenced"))
        status, body = _fetch(_opener(), f"{url}/guards")
        assert status == 200
        assert "watch" in body and "following at revision" in body
        assert "not durable: " in body  # the memory store says it forgets
        assert re.search(r"\d+ revisions", body)
        # A token the lease server never granted: LEASE_LOST, remembered with its token.
        with GuardClient(servers.guard_address) as guard, pytest.raises(LeaseLost):
            guard.put(Claim("watched", 99), "k", b"v")
        status, body = _fetch(_opener(), f"{url}/resources/watched")
        assert status == 200
        assert re.search(r"<td>LEASE_LOST</td><td class=\"num\">99</td>", body), body
        assert "LEASE_LOST 1" in _fetch(_opener(), f"{url}/guards")[1]


def test_the_queue_pages_show_stats_jobs_by_state_and_the_last_error(
    servers: RunningServers,
) -> None:
    job_id = _dead_job(servers, "pages-q")
    with QueueClient(servers.queue_address) as q:
        waiting = q.enqueue("pages-q", b"later", delay=3600).id
    with running_console(servers.lease_address, servers.guard_address) as url:
        status, body = _fetch(_opener(), f"{url}/queues")
        assert status == 200 and 'href="/queues/pages-q"' in body
        status, body = _fetch(_opener(), f"{url}/queues/pages-q?state=dead")
        assert status == 200
        assert f'href="/queues/pages-q/jobs/{job_id}"' in body and "boom" in body
        assert f"/jobs/{waiting}" not in body
        status, body = _fetch(_opener(), f"{url}/queues/pages-q")
        assert f"/jobs/{waiting}" in body
        status, body = _fetch(_opener(), f"{url}/queues/pages-q?state=scheduled")
        assert status == 200 and f"/jobs/{waiting}" in body and f"/jobs/{job_id}" not in body
        status, body = _fetch(_opener(), f"{url}/queues/pages-q/jobs/{waiting}")
        assert 'data-testid="job-state">scheduled<' in body
        status, _ = _fetch(_opener(), f"{url}/queues/pages-q?state=nonsense")
        assert status == 400
        status, _ = _fetch(_opener(), f"{url}/queues/no-such-queue")
        assert status == 404


def _paused(servers: RunningServers, queue: str) -> bool:
    with QueueClient(servers.queue_address) as q:
        (stats,) = q.stats(queue)
        return stats.paused


def _confirmation_csrf(opener: urllib.request.OpenerDirector, url: str) -> str:
    status, page = _fetch(opener, url)
    assert status == 200, page
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page
    return found[1]


def test_an_operator_pauses_and_resumes_a_queue_through_the_job_actions_checks(
    servers: RunningServers, caplog: pytest.LogCaptureFixture
) -> None:
    queue = "pause-q"
    with QueueClient(servers.queue_address, worker="w") as q:
        job_id = q.enqueue(queue, b"x").id
    with running_console(servers.lease_address, servers.guard_address, allow_actions=True) as url:
        browser = _opener()
        status, body = _fetch(browser, f"{url}/queues/{queue}")
        assert status == 200 and 'data-testid="paused">not paused<' in body
        assert f'href="/actions/pause?queue={queue}"' in body
        assert "/actions/resume" not in body
        # Not logged in: refused, and the confirmation page sends to the login first.
        status, body = _fetch(browser, f"{url}/actions/pause", {"queue": queue, "csrf": "x"})
        assert status == 403 and "Log in" in body
        status, _ = _fetch(browser, f"{url}/login", {"operator": OPERATOR, "password": PASSWORD})
        assert status == 200
        # Logged in, but no CSRF token (or a forged one): refused, the queue runs on.
        status, body = _fetch(browser, f"{url}/actions/pause", {"queue": queue})
        assert status == 403 and "CSRF" in body
        status, body = _fetch(browser, f"{url}/actions/pause", {"queue": queue, "csrf": "no"})
        assert status == 403 and "CSRF" in body
        assert not _paused(servers, queue)
        csrf = _confirmation_csrf(browser, f"{url}/actions/pause?queue={queue}")
        status, body = _fetch(browser, f"{url}/actions/pause", {"queue": queue, "csrf": csrf})
        assert status == 200 and 'data-testid="outcome">paused<' in body
        assert _paused(servers, queue)
        with QueueClient(servers.queue_address, worker="w") as q:
            assert q.claim(queue, ttl=30) == []  # paused: no claim, the job stays ready
            assert q.get_job(job_id).state == "ready"
        assert any(
            r.getMessage() == f"console action pause queue={queue} job=0 by={OPERATOR}: paused"
            for r in caplog.records
        ), "the action is logged with who did it"
        status, body = _fetch(browser, f"{url}/queues/{queue}")
        assert 'data-testid="paused">paused<' in body
        assert f'href="/actions/resume?queue={queue}"' in body
        assert "/actions/pause" not in body
        status, body = _fetch(browser, f"{url}/queues")
        row = re.search(rf'href="/queues/{queue}">{queue}</a>((?:(?!</tr>).)*)</tr>', body, re.S)
        assert row is not None and '<strong class="paused">paused</strong>' in row[1], body
        assert f'href="/actions/resume?queue={queue}"' in body
        # Pausing twice changes nothing, and says so.
        status, body = _fetch(browser, f"{url}/actions/pause", {"queue": queue, "csrf": csrf})
        assert status == 200 and "already paused" in body
        csrf = _confirmation_csrf(browser, f"{url}/actions/resume?queue={queue}")
        status, body = _fetch(browser, f"{url}/actions/resume", {"queue": queue, "csrf": csrf})
        assert status == 200 and 'data-testid="outcome">resumed<' in body
        assert not _paused(servers, queue)
        assert any(
            r.getMessage() == f"console action resume queue={queue} job=0 by={OPERATOR}: resumed"
            for r in caplog.records
        )
        with QueueClient(servers.queue_address, worker="w") as q:
            (job,) = q.claim(queue, ttl=30)
            assert job.id == job_id
            q.complete(job)


def test_a_read_only_console_shows_a_pause_but_refuses_pause_and_resume(
    servers: RunningServers,
) -> None:
    queue = "ro-pause-q"
    with QueueClient(servers.queue_address) as q:
        q.enqueue(queue, b"x")
        q.pause(queue)
    try:
        with running_console(servers.lease_address, servers.guard_address) as url:
            for action in ("pause", "resume"):
                status, body = _fetch(_opener(), f"{url}/actions/{action}?queue={queue}")
                assert status == 403 and "Read-only" in body
                status, body = _fetch(
                    _opener(), f"{url}/actions/{action}", {"queue": queue, "csrf": "x"}
                )
                assert status == 403 and "Read-only" in body
            assert _paused(servers, queue)
            status, body = _fetch(_opener(), f"{url}/queues/{queue}")
            assert status == 200 and 'data-testid="paused">paused<' in body
            assert "/actions/" not in body  # no action offered
            status, body = _fetch(_opener(), f"{url}/queues")
            assert "/actions/" not in body
    finally:
        with QueueClient(servers.queue_address) as q:
            q.resume(queue)


def test_pause_and_resume_need_a_queue(servers: RunningServers) -> None:
    with running_console(servers.lease_address, servers.guard_address, allow_actions=True) as url:
        browser = _opener()
        _fetch(browser, f"{url}/login", {"operator": OPERATOR, "password": PASSWORD})
        status, body = _fetch(browser, f"{url}/actions/pause")
        assert status == 400 and "queue is required to pause" in body
        status, body = _fetch(browser, f"{url}/actions/resume")
        assert status == 400 and "queue is required to resume" in body
        status, body = _fetch(browser, f"{url}/actions/retry?queue=q")
        assert status == 400 and "job is required to retry" in body


def test_the_job_page_shows_its_attempts_with_their_errors_escaped(
    servers: RunningServers,
) -> None:
    with QueueClient(servers.queue_address, worker="w<b>") as worker:
        job_id = worker.enqueue("attempts-q", b"x", max_attempts=1).id
        (job,) = worker.claim("attempts-q", ttl=30)
        worker.fail(job, "<script>alert(1)</script>")
        never = worker.enqueue("attempts-q", b"later", delay=3600).id
    with running_console(servers.lease_address, servers.guard_address) as url:
        status, body = _fetch(_opener(), f"{url}/queues/attempts-q/jobs/{job_id}")
        assert status == 200
        table = body[body.index('data-testid="job-attempts"') :]
        row = re.search(r"<tbody>\s*<tr>(.*?)</tr>", table, re.S)
        assert row is not None, table
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
        assert cells[:4] == ["1", "failed", "w&lt;b&gt;", str(job.token)]
        assert cells[6] == "&lt;script&gt;alert(1)&lt;/script&gt;"
        assert "<script>alert(1)" not in body
        status, body = _fetch(_opener(), f"{url}/queues/attempts-q/jobs/{never}")
        assert status == 200 and "No attempts kept" in body
