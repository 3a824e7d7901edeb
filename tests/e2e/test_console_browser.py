"""The web console in a real browser (Debian's chromium through Playwright) over real
servers: live leases, refused writes, a cancel by an operator, a read-only console,
hostile names, and a lease server that goes away and comes back.

Each test saves what the browser shows as a PNG: into docs/console/ (the docs show them)
when FENCING_UPDATE_SCREENSHOTS=1, else into the test's temporary directory, so a test run
leaves the working tree as it was.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Dialog, Page, expect, sync_playwright

from fencing import GuardClient, LeaseClient, QueueClient, StaleTokenError
from fencing.testing import RunningServers, running_servers
from lease_server.server import start_lease_server
from tests.e2e.console_helpers import CHROMIUM, OPERATOR, PASSWORD, running_console

pytestmark = pytest.mark.e2e

DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
#: The issue's bound: a change shows on an open page within 2 s, without a reload.
LIVE = 2_000


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: docs/console/ only when asked to update them."""
    if os.environ.get("FENCING_UPDATE_SCREENSHOTS") == "1":
        return DOCS_SHOTS
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServers]:
    data = tmp_path_factory.mktemp("console")
    with running_servers(f"sqlite:{data / 'leases.db'}", f"sqlite:{data / 'guard.db'}") as s:
        yield s


@pytest.fixture(scope="module")
def console(servers: RunningServers) -> Iterator[str]:
    with running_console(servers.lease_address, servers.guard_address) as url:
        yield url


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1100, "height": 640})
    dialogs: list[str] = []
    pg = context.new_page()

    def dialog(d: Dialog) -> None:
        dialogs.append(d.message)
        d.dismiss()

    pg.on("dialog", dialog)
    # Script errors and Content-Security-Policy violations show as console errors (a
    # 403 or 404 page is a "Failed to load resource" error too: that one is expected).
    errors: list[str] = []
    pg.on(
        "console",
        lambda m: (
            errors.append(m.text)
            if m.type == "error" and "Failed to load resource" not in m.text
            else None
        ),
    )
    yield pg
    context.close()
    assert dialogs == [], f"a script ran: {dialogs}"
    assert errors == [], f"errors in the browser: {errors}"


def _name(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def test_a_lease_appears_live_and_disappears_on_release(
    servers: RunningServers, console: str, page: Page, shots: Path
) -> None:
    prefix = _name("orders")
    page.goto(f"{console}/leases?prefix={prefix}")
    rows = page.locator("#lease-rows tr[data-resource]")
    expect(rows).to_have_count(0)
    with LeaseClient(servers.lease_address, holder="worker-1") as leases:
        lease = leases.acquire(f"{prefix}/eu", 30)
        expect(rows).to_have_count(1, timeout=LIVE)
        row = rows.first
        expect(row.locator("td").nth(1)).to_have_text("worker-1")
        expect(row.locator("td").nth(2)).to_have_text(str(lease.token))
        first = row.locator("td").nth(3).inner_text()
        expect(row.locator("td").nth(3)).not_to_have_text(first, timeout=LIVE)  # counts down
        page.screenshot(path=str(shots / "leases.png"))
        lease.release()
        expect(rows).to_have_count(0, timeout=LIVE)


def test_a_stale_write_shows_on_the_resource_page_with_reason_and_token(
    servers: RunningServers, console: str, page: Page, shots: Path
) -> None:
    resource = _name("ledger")
    with (
        LeaseClient(servers.lease_address, holder="old-holder") as old,
        LeaseClient(servers.lease_address, holder="new-holder") as new,
        GuardClient(servers.guard_address) as guard,
    ):
        first = old.acquire(resource, 30)
        guard.put(first, "balance", b"100")
        first.release()
        second = new.acquire(resource, 30)
        guard.put(second, "balance", b"200")
        page.goto(f"{console}/resources/{resource}")
        refusals = page.locator("tr.refusal")
        expect(refusals).to_have_count(0)  # control: nothing refused yet
        with pytest.raises(StaleTokenError):
            guard.put(first, "balance", b"late")
        page.reload()
        expect(refusals).to_have_count(1)
        cells = refusals.first.locator("td")
        expect(cells.nth(1)).to_have_text("STALE_TOKEN")
        expect(cells.nth(2)).to_have_text(str(first.token))
        expect(cells.nth(3)).to_have_text(str(second.token))
        expect(page.get_by_test_id("fence")).to_have_text(str(second.token))
        expect(page.get_by_test_id("holder")).to_contain_text("new-holder")
        timeline = page.locator("table.timeline tbody tr")
        expect(timeline.first).to_contain_text("ACQUIRED")
        expect(page.locator("table.timeline")).to_contain_text("RELEASED")
        page.screenshot(path=str(shots / "resource.png"), full_page=True)
        second.release()
    page.get_by_role("link", name="Guards").click()
    row = page.locator(f"tr[data-guard='{servers.guard_address}']")
    expect(row).to_contain_text("monotonic")
    expect(row).to_contain_text("STALE_TOKEN")
    page.screenshot(path=str(shots / "guards.png"))


def test_an_operator_cancels_a_running_job_and_the_workers_late_write_is_refused(
    servers: RunningServers, page: Page, shots: Path
) -> None:
    queue = _name("emails")
    with (
        running_console(servers.lease_address, servers.guard_address, allow_actions=True) as url,
        QueueClient(servers.queue_address, worker="mailer-1") as worker,
        GuardClient(servers.guard_address) as guard,
    ):
        worker.enqueue(queue, b"to: ops@example.com", resource=f"{queue}/outbox")
        (job,) = worker.claim(queue, ttl=60)
        guard.put(job, "sent", b"1")  # control: the worker's claim writes before the cancel
        page.goto(f"{url}/queues/{queue}/jobs/{job.id}")
        expect(page.get_by_test_id("job-state")).to_have_text("running")
        page.get_by_role("link", name="Cancel…").click()
        # Not logged in: the action sends to the login page first.
        page.fill("input[name=operator]", OPERATOR)
        page.fill("input[name=password]", PASSWORD)
        page.get_by_role("button", name="log in").click()
        expect(page.locator("h1")).to_have_text("Confirm: cancel")  # back where it was going
        page.screenshot(path=str(shots / "confirm.png"))
        page.get_by_role("button", name="Yes, cancel").click()
        expect(page.get_by_test_id("outcome")).to_contain_text("cancelled")
        with pytest.raises(StaleTokenError):
            guard.put(job, "sent", b"2")
        page.goto(f"{url}/queues/{queue}/jobs/{job.id}")
        expect(page.get_by_test_id("job-state")).to_have_text("cancelled")
        page.screenshot(path=str(shots / "job.png"), full_page=True)
        page.goto("about:blank")  # leave before this console stops (its event stream)


def test_an_operator_pauses_a_queue_and_its_page_shows_it_paused(
    servers: RunningServers, page: Page, shots: Path
) -> None:
    queue = _name("exports")
    with (
        running_console(servers.lease_address, servers.guard_address, allow_actions=True) as url,
        QueueClient(servers.queue_address, worker="exporter-1") as worker,
    ):
        worker.enqueue(queue, b"nightly")
        page.goto(f"{url}/queues/{queue}")
        expect(page.get_by_test_id("paused")).to_have_text("not paused")  # control
        page.get_by_role("link", name="Pause…").click()
        page.fill("input[name=operator]", OPERATOR)
        page.fill("input[name=password]", PASSWORD)
        page.get_by_role("button", name="log in").click()
        expect(page.locator("h1")).to_have_text("Confirm: pause")
        page.get_by_role("button", name="Yes, pause").click()
        expect(page.get_by_test_id("outcome")).to_have_text("paused")
        page.get_by_role("link", name="Back").click()
        expect(page.get_by_test_id("paused")).to_have_text("paused")
        expect(page.get_by_role("link", name="Resume…")).to_have_count(1)
        page.screenshot(path=str(shots / "queue-paused.png"), full_page=True)
        (stats,) = worker.stats(queue)
        assert stats.paused
        assert worker.claim(queue, ttl=30) == []
        worker.resume(queue)
        page.goto("about:blank")  # leave before this console stops (its event stream)


def test_a_read_only_console_refuses_actions(
    servers: RunningServers, console: str, page: Page
) -> None:
    queue = _name("reports")
    with QueueClient(servers.queue_address, worker="w") as worker:
        worker.enqueue(queue, b"x")
        (job,) = worker.claim(queue, ttl=60)
        shown = page.goto(f"{console}/actions/cancel?queue={queue}&job={job.id}")
        assert shown is not None and shown.status == 403
        posted = page.request.post(
            f"{console}/actions/cancel", form={"queue": queue, "job": str(job.id), "csrf": "x"}
        )
        assert posted.status == 403
        assert worker.get_job(job.id).state == "running"
        page.goto(f"{console}/queues/{queue}/jobs/{job.id}")
        assert page.get_by_role("link", name="Cancel…").count() == 0


def test_hostile_names_render_as_text(servers: RunningServers, console: str, page: Page) -> None:
    resource = "<script>alert(1)</script>" + uuid.uuid4().hex[:4]
    holder = '"><img src=x onerror=alert(2)>'
    with LeaseClient(servers.lease_address, holder=holder) as leases:
        lease = leases.acquire(resource, 30)
        page.goto(f"{console}/leases?prefix=%3Cscript")
        row = page.locator("#lease-rows tr[data-resource]").first
        expect(row.locator("td").nth(0)).to_have_text(resource)
        expect(row.locator("td").nth(1)).to_have_text(holder)
        assert page.locator("main img").count() == 0
        row.locator("a").click()
        expect(page.locator("h1 code")).to_have_text(resource)
        expect(page.get_by_test_id("holder")).to_contain_text(holder)
        assert page.locator("main img").count() == 0
        lease.release()
    missing = page.goto(f"{console}/resources/never-{uuid.uuid4().hex}")
    assert missing is not None and missing.status == 404
    expect(page.get_by_test_id("error-title")).to_contain_text("No such resource")
    missing = page.goto(f"{console}/queues/none/jobs/987654")
    assert missing is not None and missing.status == 404


def test_a_banner_while_the_lease_server_is_down_then_recovery(
    browser: Browser, tmp_path: Path, shots: Path
) -> None:
    with running_servers(f"sqlite:{tmp_path / 'leases.db'}") as servers:
        address = servers.lease_address
        with running_console(address, servers.guard_address) as url:
            context = browser.new_context(viewport={"width": 1100, "height": 400})
            page = context.new_page()
            page.goto(f"{url}/leases")
            banner = page.get_by_test_id("outage")
            expect(banner).to_have_count(0)
            servers.call(servers.lease.stop(0))
            expect(banner).to_have_count(1, timeout=5_000)
            expect(banner).to_contain_text(f"lease server at {address}")
            page.screenshot(path=str(shots / "outage.png"))
            restarted = servers.call(
                start_lease_server(f"sqlite:{tmp_path / 'leases.db'}", address)
            )
            try:
                expect(banner).to_have_count(0, timeout=5_000)
                with LeaseClient(address, holder="back") as leases, leases.hold("after", 30):
                    expect(page.locator("#lease-rows tr[data-resource]")).to_have_count(
                        1, timeout=LIVE
                    )
            finally:
                servers.call(restarted.stop(0))
            context.close()
