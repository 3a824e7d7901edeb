"""The console's ASGI application: pages built by :func:`build_app` over an :class:`Upstream`.

Pages are server-rendered Jinja2 templates with autoescaping on, so resource names,
holders, payloads and error texts (user data) always render as text. Live parts use
htmx (vendored in ``static/``): the leases table re-reads its page of ``List`` when
the shared Watch (:mod:`console.feed`) says something under its prefix changed, and
every page's banner follows the lease server's health, both over one server-sent
events connection per tab.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from console.feed import LeaseFeed
from console.operators import COOKIE, Operators, Session
from console.upstream import Unreachable, Upstream
from fencing import limits
from fencing.client import EventKind, LeaseEvent, Refusal
from fencing.errors import FencingError, InvalidArgumentError, NotFoundError

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
#: Rows per page of the leases and jobs tables.
PAGE_SIZE = 50
#: The timeline reads at most this many revisions of the log back from its head.
TIMELINE_WINDOW = 10_000
#: ... and shows at most this many events (newest).
TIMELINE_EVENTS = 50
#: Once the replay is quiet this long, it has caught up (seconds).
TIMELINE_QUIET = 0.3
#: How often a tab's leases table may refresh at most (seconds): events coalesce.
REFRESH_EVERY = 0.25
#: Comment lines keep an idle event stream open through proxies (seconds).
KEEPALIVE = 15.0
#: Every page: scripts only from the console itself (no inline script, no eval), never
#: framed (an action's confirmation cannot be clicked through another site's frame).
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
JOB_STATES = ("ready", "scheduled", "waiting", "running", "succeeded", "dead", "cancelled")
ACTIONS = ("retry", "cancel", "requeue-dead", "pause", "resume")
#: The actions on a whole queue (no job id).
QUEUE_ACTIONS = ("requeue-dead", "pause", "resume")


@dataclass
class Settings:
    """What :func:`build_app` needs besides the clients."""

    allow_actions: bool = False
    operators: Operators = field(default_factory=lambda: Operators({}))
    page_size: int = PAGE_SIZE


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["ms"] = _format_ms
    env.filters["at"] = _format_at
    return env


def _format_ms(ms: float) -> str:
    return f"{ms / 1000:.1f} s"


def _format_at(unix_ms: float) -> str:
    import datetime

    if not unix_ms:
        return "-"
    moment = datetime.datetime.fromtimestamp(unix_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


class Console:
    """The handlers, sharing the upstream clients, the feed and the settings."""

    def __init__(self, upstream: Upstream, settings: Settings) -> None:
        self.upstream = upstream
        self.settings = settings
        self.feed = LeaseFeed(upstream)
        self.env = _templates()

    # -- rendering ------------------------------------------------------------------------

    def session(self, request: Request) -> Session | None:
        return self.settings.operators.session(request.cookies.get(COOKIE))

    def render(
        self, request: Request, name: str, context: Mapping[str, Any], status: int = 200
    ) -> HTMLResponse:
        full = {
            "request": request,
            "outages": self.upstream.outages(),
            "session": self.session(request),
            "allow_actions": self.settings.allow_actions,
            "guards": list(self.upstream.guards),
            "lease_addr": self.upstream.lease_addr,
            **context,
        }
        return HTMLResponse(
            self.env.get_template(name).render(full), status_code=status, headers=HEADERS
        )

    def error(self, request: Request, status: int, title: str, detail: str) -> HTMLResponse:
        return self.render(
            request, "error.html", {"status": status, "title": title, "detail": detail}, status
        )

    # -- leases ---------------------------------------------------------------------------

    async def _leases_page(self, request: Request) -> dict[str, Any]:
        prefix = request.query_params.get("prefix", "")
        page = request.query_params.get("page", "")
        try:
            limits.check_prefix(prefix) if prefix else None
        except InvalidArgumentError as exc:
            raise HTTPException(400, str(exc)) from exc
        leases, next_page = await self.upstream.lease(
            self.upstream.leases.list_page(
                prefix, page_size=self.settings.page_size, page_token=page
            )
        )
        return {"prefix": prefix, "page": page, "leases": leases, "next_page": next_page}

    async def leases(self, request: Request) -> Response:
        return self.render(request, "leases.html", await self._leases_page(request))

    async def lease_rows(self, request: Request) -> Response:
        return self.render(request, "_lease_rows.html", await self._leases_page(request))

    async def events(self, request: Request) -> Response:
        """Server-sent events: ``lease`` when something under ``prefix`` changed,
        ``status`` (the banner's HTML) when the lease server's health changed."""
        prefix = request.query_params.get("prefix", "")
        sub = self.feed.subscribe(prefix)

        async def stream() -> AsyncIterator[str]:
            try:
                yield self._status_event(request)
                while not self.feed.closed.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(KEEPALIVE):
                            await sub.changed.wait()
                    if not sub.changed.is_set():
                        yield ": keepalive\n\n"
                        continue
                    sub.changed.clear()
                    if self.feed.closed.is_set():
                        return
                    if sub.health.is_set():
                        sub.health.clear()
                        yield self._status_event(request)
                    yield f"event: lease\ndata: {self.feed.revision}\n\n"
                    await asyncio.sleep(REFRESH_EVERY)
            finally:
                self.feed.unsubscribe(sub)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    def _status_event(self, request: Request) -> str:
        html = self.env.get_template("_banner.html").render(outages=self.upstream.outages())
        data = "".join(f"data: {line}\n" for line in html.splitlines() or [""])
        return f"event: status\n{data}\n"

    # -- a resource -----------------------------------------------------------------------

    async def resource(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            limits.check_resource(name)
        except InvalidArgumentError as exc:
            return self.error(request, 404, "No such resource", str(exc))
        state = await self.upstream.lease(self.upstream.leases.describe(name))
        timeline, complete = await self._timeline(name)
        guards = await asyncio.gather(*(self._guard_view(a, name) for a in self.upstream.guards))
        known = state.last_token or timeline or any(g["fence"] or g["refusals"] for g in guards)
        if not known:
            return self.error(
                request,
                404,
                "No such resource",
                f"{name!r} was never leased, fenced or refused here.",
            )
        return self.render(
            request,
            "resource.html",
            {
                "name": name,
                "state": state,
                "timeline": timeline,
                "complete": complete,
                "guard_views": guards,
            },
        )

    async def _timeline(self, resource: str) -> tuple[list[LeaseEvent], bool]:
        """The resource's grants, releases and expiries still in the log's last
        :data:`TIMELINE_WINDOW` revisions, newest first; and whether that is all of them."""
        leases = self.upstream.leases
        probe = await self.upstream.lease(leases.watch_stream(resource))
        head = probe.start_revision or 0
        await probe.aclose()
        if head == 0:
            return [], True
        start = max(1, head - TIMELINE_WINDOW)
        # Revision 0 asks for "from now": the replay starts after revision 1 at the
        # earliest, so the log's very first event is never shown.
        complete = start == 1
        events: list[LeaseEvent] = []
        stream = await self.upstream.lease(leases.watch_stream(resource, after_revision=start))
        async with stream:
            feed = aiter(stream)
            while True:
                try:
                    async with asyncio.timeout(TIMELINE_QUIET):
                        event = await anext(feed)
                except (TimeoutError, StopAsyncIteration):
                    break
                if event.kind is EventKind.RESYNC:
                    events.clear()  # pruned: what follows is all there is
                    complete = False
                    if event.revision >= head:
                        break
                    continue
                if event.kind is not EventKind.RENEWED:
                    events.append(event)
                if event.revision >= head:
                    break
        return list(reversed(events[-TIMELINE_EVENTS:])), complete

    async def _guard_view(self, address: str, resource: str) -> dict[str, Any]:
        client = self.upstream.guards[address]
        view: dict[str, Any] = {"address": address, "fence": 0, "refusals": [], "error": ""}
        try:
            view["fence"] = await self.upstream.guard(address, client.describe_fence(resource))
            refusals: list[Refusal] = await self.upstream.guard(
                address, client.list_refusals(resource)
            )
            view["refusals"] = refusals
        except (Unreachable, FencingError) as exc:
            view["error"] = str(exc)
        return view

    # -- guards ---------------------------------------------------------------------------

    async def guards(self, request: Request) -> Response:
        async def view(address: str) -> dict[str, Any]:
            client = self.upstream.guards[address]
            try:
                info = await self.upstream.guard(address, client.describe_guard())
            except (Unreachable, FencingError) as exc:
                return {"address": address, "info": None, "error": str(exc), "lag": None}
            lag = None
            if info.watch_state and self.feed.revision:
                lag = max(0, self.feed.revision - info.watch_revision)
            return {"address": address, "info": info, "error": "", "lag": lag}

        views = await asyncio.gather(*(view(a) for a in self.upstream.guards))
        return self.render(request, "guards.html", {"views": views, "revision": self.feed.revision})

    # -- queues ---------------------------------------------------------------------------

    async def queues(self, request: Request) -> Response:
        stats = await self.upstream.lease(self.upstream.queue.stats())
        schedules = await self.upstream.lease(self.upstream.queue.list_schedules())
        return self.render(request, "queues.html", {"stats": stats, "schedules": schedules})

    async def queue(self, request: Request) -> Response:
        name = request.path_params["queue"]
        state = request.query_params.get("state", "")
        page = request.query_params.get("page", "")
        if state and state not in JOB_STATES:
            return self.error(request, 400, "Bad request", f"state must be one of {JOB_STATES}")
        stats = await self.upstream.lease(self.upstream.queue.stats(name))
        if not stats or not any(
            (s.ready, s.waiting, s.running, s.succeeded, s.dead, s.cancelled, s.scheduled)
            for s in stats
        ):
            return self.error(request, 404, "No such queue", f"queue {name!r} has no jobs.")
        jobs, next_page = await self.upstream.lease(
            self.upstream.queue.list_jobs_page(
                name, state=state, page_size=self.settings.page_size, page_token=page
            )
        )
        schedules = await self.upstream.lease(self.upstream.queue.list_schedules(name))
        return self.render(
            request,
            "queue.html",
            {
                "queue": name,
                "stats": stats[0],
                "state": state,
                "states": JOB_STATES,
                "jobs": jobs,
                "page": page,
                "next_page": next_page,
                "schedules": schedules,
                "csrf": self._csrf(request),
            },
        )

    async def job(self, request: Request) -> Response:
        name = request.path_params["queue"]
        job_id = request.path_params["job"]
        try:
            job = await self.upstream.lease(
                self.upstream.queue.get_job(job_id, queue=name, include_payload=True)
            )
        except NotFoundError:
            return self.error(request, 404, "No such job", f"no job {job_id} in queue {name!r}.")
        return self.render(request, "job.html", {"job": job, "csrf": self._csrf(request)})

    # -- actions --------------------------------------------------------------------------

    def _csrf(self, request: Request) -> str:
        session = self.session(request)
        return session.csrf if session is not None else ""

    def _allowed(self, request: Request) -> Session | Response:
        """The operator's session, or the response refusing the action."""
        if not self.settings.allow_actions:
            return self.error(
                request,
                403,
                "Read-only console",
                "This console was started without --allow-actions: it refuses every action.",
            )
        session = self.session(request)
        if session is None and request.method == "POST":
            return self.error(request, 403, "Refused", "Log in as an operator first.")
        if session is None:
            here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?{urlencode({'next': here})}", status_code=303)
        return session

    async def confirm(self, request: Request) -> Response:
        allowed = self._allowed(request)
        if isinstance(allowed, Response):
            return allowed
        action, queue, job_id = self._action_target(request.path_params, request.query_params)
        return self.render(
            request,
            "confirm.html",
            {"action": action, "queue": queue, "job_id": job_id, "csrf": allowed.csrf},
        )

    def _action_target(
        self, path: Mapping[str, Any], params: Mapping[str, str]
    ) -> tuple[str, str, int]:
        action = str(path["action"])
        if action not in ACTIONS:
            raise HTTPException(404, f"no action {action!r}")
        queue = str(params.get("queue", ""))
        try:
            job_id = int(params.get("job", "0") or 0)
        except ValueError as exc:
            raise HTTPException(400, "job must be a job id") from exc
        if not queue:
            raise HTTPException(400, f"queue is required to {action}")
        if action not in QUEUE_ACTIONS and job_id <= 0:
            raise HTTPException(400, f"job is required to {action}")
        return action, queue, job_id

    async def act(self, request: Request) -> Response:
        allowed = self._allowed(request)
        if isinstance(allowed, Response):
            return allowed
        form = await request.form()
        fields = {k: str(v) for k, v in form.items()}
        if not self.settings.operators.csrf_ok(allowed, fields.get("csrf", "")):
            return self.error(request, 403, "Refused", "Missing or wrong CSRF token.")
        action, queue, job_id = self._action_target(request.path_params, fields)
        q = self.upstream.queue
        try:
            if action == "retry":
                result = await self.upstream.lease(q.retry_job(job_id, queue=queue))
                outcome = "retried" if result.changed else "not retried (no such state)"
            elif action == "cancel":
                result = await self.upstream.lease(
                    q.cancel_job(
                        job_id,
                        queue=queue,
                        reason=f"cancelled from the console by {allowed.operator}",
                        fence=list(self.upstream.guards.values()),
                    )
                )
                outcome = "cancelled" if result.changed else "not cancelled (already finished)"
                if result.fence_token:
                    outcome += f"; fenced at token {result.fence_token}"
            elif action == "pause":
                changed = await self.upstream.lease(q.pause(queue))
                outcome = "paused" if changed else "already paused"
            elif action == "resume":
                changed = await self.upstream.lease(q.resume(queue))
                outcome = "resumed" if changed else "not paused"
            else:
                count = await self.upstream.lease(q.requeue_dead(queue))
                outcome = f"requeued {count} dead jobs"
        except NotFoundError:
            return self.error(request, 404, "No such job", f"no job {job_id} in queue {queue!r}.")
        log.warning(
            "console action %s queue=%s job=%d by=%s: %s",
            action,
            queue,
            job_id,
            allowed.operator,
            outcome,
            extra={
                "action": action,
                "queue": queue,
                "job_id": job_id,
                "operator": allowed.operator,
            },
        )
        target = f"/queues/{queue}/jobs/{job_id}" if job_id else f"/queues/{queue}"
        return self.render(
            request, "done.html", {"outcome": outcome, "target": target, "action": action}
        )

    # -- login ----------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        return self.render(
            request, "login.html", {"next": request.query_params.get("next", "/"), "failed": False}
        )

    async def login(self, request: Request) -> Response:
        form = await request.form()
        name, password = str(form.get("operator", "")), str(form.get("password", ""))
        target = str(form.get("next", "/"))
        if not target.startswith("/") or target.startswith("//"):
            target = "/"  # never redirect off this console
        session_id = self.settings.operators.login(name, password)
        if session_id is None:
            log.warning("console login failed for %r", name, extra={"operator": name})
            return self.render(request, "login.html", {"next": target, "failed": True}, 401)
        log.info("console login by %s", name, extra={"operator": name})
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, session_id, httponly=True, samesite="strict")
        return response

    async def logout(self, request: Request) -> Response:
        self.settings.operators.logout(request.cookies.get(COOKIE))
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    # -- errors ---------------------------------------------------------------------------

    async def unreachable(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Unreachable)
        return self.render(
            request,
            "error.html",
            {
                "status": 503,
                "title": f"The {exc.server} is unreachable",
                "detail": str(exc),
                "retry": True,
            },
            503,
        )

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        title = {404: "Not found", 403: "Refused", 400: "Bad request"}.get(exc.status_code, "Error")
        return self.error(request, exc.status_code, title, str(exc.detail))

    async def fencing_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, FencingError)
        status = 400 if isinstance(exc, InvalidArgumentError) else 502
        return self.error(request, status, exc.reason, str(exc))


def build_app(upstream: Upstream, settings: Settings | None = None) -> Starlette:
    """The console's ASGI app over ``upstream``; it starts the shared Watch on startup
    and closes the clients on shutdown."""
    console = Console(upstream, settings or Settings())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        console.feed.start()
        try:
            yield
        finally:
            await console.feed.stop()
            await upstream.aclose()

    routes = [
        Route("/", lambda request: RedirectResponse("/leases", status_code=303)),
        Route("/leases", console.leases),
        Route("/leases/rows", console.lease_rows),
        Route("/events", console.events),
        Route("/resources/{name:path}", console.resource),
        Route("/guards", console.guards),
        Route("/queues", console.queues),
        Route("/queues/{queue}", console.queue),
        Route("/queues/{queue}/jobs/{job:int}", console.job),
        Route("/actions/{action}", console.confirm, methods=["GET"]),
        Route("/actions/{action}", console.act, methods=["POST"]),
        Route("/login", console.login_form, methods=["GET"]),
        Route("/login", console.login, methods=["POST"]),
        Route("/logout", console.logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            Unreachable: console.unreachable,
            HTTPException: console.http_error,
            FencingError: console.fencing_error,
        },
    )
    app.state.console = console
    return app
