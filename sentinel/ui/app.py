"""The dashboard's routes: each page renders a view model (:mod:`sentinel.ui.views`) read
through :class:`~sentinel.ui.source.RegistrySource`; ``/events`` is the live stream.

Pages are rendered on Starlette's thread pool (a read of ``/clients`` may wait for
ZooKeeper); the stream lives on the event loop. A page asked for with the header
``X-Sentinel-Fragment: main`` is only its ``<main>``: what the page's script puts in place
when the stream says something it shows changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import jinja2
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from prometheus_client import Counter
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from sentinel.errors import AccessDenied, InvalidName, SentinelError, ValidationError
from sentinel.registry.dependencies import DependencyGraph
from sentinel.registry.layout import validate_name
from sentinel.suggestions import close_matches, did_you_mean
from sentinel.ui import views
from sentinel.ui.live import ChangeFeed
from sentinel.ui.security import SESSION_COOKIE, Guard, Tokens, same_origin
from sentinel.ui.source import RegistrySource
from sentinel.zk.errors import translate

log = logging.getLogger(__name__)

PAGE_VIEWS = Counter("sentinel_ui_page_views", "Dashboard pages rendered", ["page"])

#: The pages in the navigation bar, in order: (path, title).
NAVIGATION = (
    ("/services", "Services"),
    ("/topology", "Topology"),
    ("/regions", "Regions"),
    ("/rotations", "Rotations"),
    ("/shards", "Shard maps"),
    ("/agents", "Agents"),
    ("/doctor", "Doctor"),
)

#: The most an action's form may hold (its token and nothing else).
MAX_FORM_BYTES = 4096
#: Seconds Graphviz may take to lay out the topology.
DOT_TIMEOUT = 10.0
#: What a status change action sets.
ACTIONS = {"drain": "draining", "undrain": "up"}


@dataclass(frozen=True)
class Settings:
    """How the dashboard is served.

    ``allow_actions``: drain and undrain are offered (and accepted); ``max_streams``: live
    streams open at once; ``hosts``: the ``Host`` values accepted (None: not checked, for an
    app tested without a server; an action's ``Origin`` must name the Host the request was
    sent to); ``agent``: the agent's name when an agent serves it.
    """

    allow_actions: bool = False
    max_streams: int = 100
    hosts: frozenset[str] | None = None
    agent: str | None = None


class Dashboard:
    """The pages of one dashboard: what they read and how they are rendered."""

    def __init__(self, source: RegistrySource, settings: Settings, feed: ChangeFeed) -> None:
        self.source = source
        self.settings = settings
        self.feed = feed
        self.tokens = Tokens()
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("sentinel.ui", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self._svg: dict[str, str] = {}  # laid out graphs by their dot text (a handful)

    # --- rendering ------------------------------------------------------------------------

    def render(self, request: Request, page: str, template: str, **context: Any) -> Response:
        """``template`` filled with ``context``, whole or (asked for) its ``<main>`` only."""
        session = request.cookies.get(SESSION_COOKIE)
        new_session = session is None or len(session) > 64
        if new_session:
            session = self.tokens.new_session()
        version, updated_at = self.feed.version, self.feed.updated_at
        html = self.templates.get_template(template).render(
            fragment=request.headers.get("x-sentinel-fragment") == "main",
            navigation=NAVIGATION,
            page=page,
            version=version,
            updated=datetime.datetime.fromtimestamp(updated_at, datetime.UTC).isoformat(
                timespec="seconds"
            ),
            csrf=self.tokens.token(str(session)),
            allow_actions=self.settings.allow_actions,
            agent=self.settings.agent,
            connection=self.source.sentinel.connection_state,
            **context,
        )
        PAGE_VIEWS.labels(page).inc()
        response = HTMLResponse(html)
        if new_session:
            response.set_cookie(
                SESSION_COOKIE, str(session), httponly=True, samesite="strict", path="/"
            )
        return response

    def error(self, request: Request, status: int, message: str) -> Response:
        """A page saying what went wrong, with ``status``."""
        html = self.templates.get_template("error.html").render(
            fragment=False,
            navigation=NAVIGATION,
            page="error",
            version=self.feed.version,
            updated="",
            csrf="",
            allow_actions=False,
            agent=self.settings.agent,
            connection=self.source.sentinel.connection_state,
            status=status,
            message=message,
        )
        return HTMLResponse(html, status_code=status)

    # --- pages ----------------------------------------------------------------------------

    def services(self, request: Request) -> Response:
        failing = _flag(request, "failing", allowed=("failing",))
        view = views.services_view(
            self.source.listed,
            self.source.snapshots,
            self._clients(),
            self.source.unreadable,
            failing_only=failing,
            declared=self.source.declared_partitions(),
        )
        return self.render(request, "services", "services.html", view=view)

    def service(self, request: Request) -> Response:
        _flag(request, None, allowed=())
        name = _name(request, "name", "service")
        snapshot = self.source.snapshots.get(name)
        if snapshot is None:
            if name in self.source.unreadable:
                raise HTTPException(403, f"{name}: {self.source.unreadable[name]}")
            if name in self.source.listed:
                raise HTTPException(503, f"service {name!r} is being loaded; try again")
            hint = close_matches(name, self.source.listed)
            raise HTTPException(
                404,
                f"service {name!r} is not registered" + (f"; {did_you_mean(hint)}" if hint else ""),
            )
        policy = snapshot.spec.shard_policy
        partitions: list[str | None] = [None]  # an unsharded service's instances
        if policy is not None:
            declared = self.source.declared_partitions().get(policy, ())
            partitions = [*views.declared_partitions(snapshot, declared)]
        explanations = {
            partition: self.source.sentinel.explain_partition(name, partition)
            for partition in partitions
        }
        view = views.service_view(
            name, snapshot, explanations, self._clients().get(name, {}), time.time()
        )
        return self.render(request, "service", "service.html", view=view)

    def topology(self, request: Request) -> Response:
        _flag(request, None, allowed=())
        clients = self._clients()
        snapshots = self.source.snapshots
        rows = {
            name: views.service_row(
                name, snapshots.get(name), clients.get(name, {}), self.source.unreadable.get(name)
            )
            for name in self.source.listed
        }
        view = views.topology_view(DependencyGraph.from_clients(clients), rows)
        svg = self._layout(views.topology_dot(view)) if view.edges else None
        return self.render(request, "topology", "topology.html", view=view, svg=svg)

    def regions(self, request: Request) -> Response:
        _flag(request, None, allowed=())
        sentinel = self.source.sentinel
        regions = sentinel.regions
        router = sentinel.regions_router
        rows = views.regions_view(
            None if regions is None else regions.local,
            sentinel.connection_state,
            sentinel.staleness,
            [] if regions is None else sorted(regions.regions),
            {} if router is None else router.states(),
        )
        rules = sorted(
            (name, s.spec.failover.describe())
            for name, s in self.source.snapshots.items()
            if s.spec.failover is not None and not s.spec.failover.local_only
        )
        return self.render(request, "regions", "regions.html", rows=rows, rules=rules)

    def rotations(self, request: Request) -> Response:
        _flag(request, None, allowed=())
        rows = views.follower_rows(self._clients())
        return self.render(request, "rotations", "rotations.html", rows=rows)

    def shards(self, request: Request) -> Response:
        _flag(request, None, allowed=())
        maps = [
            views.shard_map_view(policy, found)
            for policy, found in self._read(self.source.shard_maps)
        ]
        return self.render(request, "shards", "shards.html", maps=maps)

    def agents(self, request: Request) -> Response:
        _flag(request, None, allowed=())
        hosts = views.hosts_view(self._clients())
        return self.render(request, "agents", "agents.html", hosts=hosts)

    def doctor(self, request: Request) -> Response:
        _flag(request, None, allowed=())
        available = self.source.readers.findings is not None
        findings, regions = self._read(self.source.findings)
        view = views.findings_view(findings, regions)
        return self.render(request, "doctor", "doctor.html", view=view, available=available)

    # --- actions --------------------------------------------------------------------------

    async def act(self, request: Request) -> Response:
        """Drain or undrain an instance: only when allowed, from this origin, with the token."""
        if not self.settings.allow_actions:
            raise HTTPException(
                403, "actions are off: the dashboard was started without --allow-actions"
            )
        origin = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if not same_origin(request.headers, origin):
            raise HTTPException(
                403, "refused: the request does not come from this dashboard's pages"
            )
        body = await _bounded_body(request)
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
        token = next(iter(form.get("csrf", [])), None)
        if not self.tokens.valid(request.cookies.get(SESSION_COOKIE), token):
            raise HTTPException(403, "refused: the form's token is missing or not this session's")
        name = _name(request, "name", "service")
        action = request.path_params["action"]
        if action not in ACTIONS:
            raise HTTPException(404, f"no action {action!r}: drain or undrain")
        instance = request.path_params["instance"]
        set_status = self.source.readers.set_status
        if set_status is None:
            raise HTTPException(403, "this dashboard offers no action")

        def write() -> tuple[str, str] | str:
            try:
                return set_status(self.source.sentinel.session.zk, name, instance, ACTIONS[action])
            except (KazooException, KazooTimeoutError) as exc:
                raise translate(exc, f"{action} {name} {instance}") from None

        try:
            done = await run_in_threadpool(write)
        except AccessDenied as exc:
            raise HTTPException(403, f"refused by ZooKeeper: {exc}") from None
        except ValidationError as exc:  # a label several partitions hold, a bad name
            raise HTTPException(400, str(exc)) from None
        except SentinelError as exc:  # unreachable, or the node kept changing
            raise HTTPException(503, str(exc)) from None
        if isinstance(done, str):
            raise HTTPException(404, done)
        log.info("%s %s %s (was %s) from the dashboard", action, name, done[0], done[1])
        return RedirectResponse(f"/services/{name}", status_code=303)

    # --- the live stream ------------------------------------------------------------------

    async def events(self, request: Request) -> Response:
        _flag(request, None, allowed=())
        stream = self.feed.open()
        if stream is None:
            return Response(
                "too many live streams open; the page works without one (reload it)",
                status_code=503,
                headers={"retry-after": "10"},
                media_type="text/plain",
            )
        return StreamingResponse(
            self.feed.events(stream),
            media_type="text/event-stream",
            headers={"x-accel-buffering": "no"},
        )

    # --- reading --------------------------------------------------------------------------

    def _clients(self) -> dict[str, dict[str, Any]]:
        return self._read(self.source.clients)

    @staticmethod
    def _read(read: Callable[[], Any]) -> Any:
        """``read()``, a ZooKeeper failure made the page's error (503, or 403 for ACLs)."""
        try:
            return read()
        except (KazooException, KazooTimeoutError) as exc:
            error = translate(exc, "reading the registry")
            raise HTTPException(
                403 if isinstance(error, AccessDenied) else 503, str(error)
            ) from None
        except AccessDenied as exc:
            raise HTTPException(403, str(exc)) from None
        except SentinelError as exc:
            raise HTTPException(503, str(exc)) from None

    def _layout(self, dot: str) -> str | None:
        """The graph as inline SVG, laid out by Graphviz's ``dot`` (None: not installed, or it
        failed: the page lists the edges instead)."""
        if dot in self._svg:
            return self._svg[dot]
        program = shutil.which("dot")
        if program is None:
            return None
        try:
            done = subprocess.run(
                [program, "-Tsvg"],
                input=dot,
                capture_output=True,
                text=True,
                timeout=DOT_TIMEOUT,
                check=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("Graphviz could not lay out the topology: %s", exc)
            return None
        svg = done.stdout[done.stdout.find("<svg") :]
        if len(self._svg) >= 16:
            self._svg.clear()
        self._svg[dot] = svg
        return svg


def _flag(request: Request, name: str | None, allowed: tuple[str, ...]) -> bool:
    """Whether the query holds the flag ``name`` (``?failing`` or ``?failing=1``); any other
    parameter, or another value, is a 400."""
    params = request.query_params
    for key in params:
        if key != name:
            raise HTTPException(400, f"unknown query parameter {key[:64]!r}")
    if name is None or name not in params:
        return False
    if params[name] not in ("", "1", "true"):
        raise HTTPException(400, f"{name} takes no value (or 1)")
    return name in allowed


def _name(request: Request, param: str, kind: str) -> str:
    try:
        return validate_name(kind, request.path_params[param])
    except InvalidName as exc:
        raise HTTPException(400, str(exc)) from None


async def _bounded_body(request: Request) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(413, "the form is larger than an action's")
    return body


def create_app(
    source: RegistrySource, settings: Settings = Settings(), feed: ChangeFeed | None = None
) -> Starlette:
    """The dashboard of ``source``'s client: one change subscription, fanned out to every
    viewer's stream (``feed``; made here unless given)."""
    feed = feed or ChangeFeed(settings.max_streams)
    dashboard = Dashboard(source, settings, feed)
    source.on_listing = functools.partial(feed.publish, None, "listing")

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        feed.bind(asyncio.get_running_loop())
        remove = source.sentinel.listen(None, feed.on_change)
        try:
            yield
        finally:
            remove()
            feed.close_all()
            source.close()  # the app owns its source: it follows nothing once the app ends

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return dashboard.error(request, exc.status_code, str(exc.detail))

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.error("dashboard: %s on %s", type(exc).__name__, request.url.path, exc_info=exc)
        return dashboard.error(request, 500, f"unexpected {type(exc).__name__}; see the logs")

    routes = [
        Route("/", dashboard.services),
        Route("/services", dashboard.services),
        Route("/services/{name}", dashboard.service),
        Route("/services/{name}/instances/{instance}/{action}", dashboard.act, methods=["POST"]),
        Route("/topology", dashboard.topology),
        Route("/regions", dashboard.regions),
        Route("/rotations", dashboard.rotations),
        Route("/shards", dashboard.shards),
        Route("/agents", dashboard.agents),
        Route("/doctor", dashboard.doctor),
        Route("/events", dashboard.events),
        Mount("/static", StaticFiles(packages=[("sentinel.ui", "static")]), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error, Exception: unexpected},
    )
    app.add_middleware(Guard, hosts=settings.hosts)
    app.state.feed = feed
    return app
