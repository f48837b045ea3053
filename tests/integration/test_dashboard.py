"""``sentinel ui``: every page against a real ZooKeeper, served by a real uvicorn on a port.

One registry and one dashboard are shared by the module (what the pages show is read, never
changed, by most tests); the tests that change something or need other settings serve
their own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from kazoo.client import KazooClient
from kazoo.security import make_digest_acl

from sentinel import HealthCheck
from sentinel.auth import ClientKeyring
from sentinel.auth.config import AuthConfig
from sentinel.cli import build_parser
from sentinel.cli.ui import build, doctor_options
from sentinel.client import Sentinel
from sentinel.testing.zookeeper import LocalZooKeeper
from sentinel.ui.server import listen, url
from tests.conftest import SENTINEL, sentinel_in_process

pytestmark = pytest.mark.integration

#: What no page may show: a property's secret value, and the dashboard's own identity's.
SECRET = "hunter2-do-not-show"
CREDENTIAL = "credential-do-not-show"
PAGES = ("/", "/services", "/topology", "/regions", "/rotations", "/shards", "/agents", "/doctor")


@contextlib.contextmanager
def dashboard(sentinel: Sentinel, **options: object) -> Iterator[str]:
    """The dashboard of ``sentinel`` served on a free loopback port: its base URL."""
    sock = listen("127.0.0.1", 0)
    server = build(
        sentinel,
        sock,
        address="127.0.0.1",
        allow_hosts=[],
        max_streams=int(options.pop("max_streams", 32)),  # type: ignore[call-overload]
        **options,  # type: ignore[arg-type]
    ).start()
    try:
        yield url(sock).rstrip("/")
    finally:
        server.stop()


@pytest.fixture(scope="module")
def registry(zookeeper: LocalZooKeeper) -> Iterator[tuple[str, Sentinel, Sentinel]]:
    """A namespace with a sharded service (p2 unserved, one replica drained, one failing its
    check), an unsharded one followed by an app, and a publisher's secret property; and the
    dashboard's own client. Yields (namespace, publisher, dashboard client)."""
    namespace = f"/test-ui-{time.monotonic_ns()}"
    hosts = zookeeper.connect_string
    publisher = Sentinel(hosts, "publisher", namespace).start()
    publisher.shard_maps.create("tenants", "directory", partitions=["p1", "p2"], buckets=4)
    publisher.shard_maps.assign_many("tenants", {"acme": "p1", "globex": "p2", "initech": "p1"})
    publisher.ensure_service("orders-db", scheme="postgresql", shard_policy="tenants")
    replicas = {
        label: publisher.register("orders-db", "p1", "10.0.0.1", port, label=label, zone="z1")
        for label, port in (("replica-a", 5432), ("replica-b", 5433))
    }
    publisher.update_metrics(replicas["replica-a"], {"replication_lag": 3})
    publisher.update_registration(replicas["replica-b"], status="draining")
    publisher.register(
        "api",
        "main",
        "10.1.0.1",
        8080,
        label="api-1",
        properties={"password": SECRET, "tier": "web"},
    )
    failing = HealthCheck.call(lambda: False, interval=0.1, timeout=0.1)
    publisher.register("api", "main", "10.1.0.2", 8080, label="api-2", health=failing)
    web = Sentinel(hosts, "web-1", namespace, app="web").start()
    web.get_service("api")
    web.get_service("orders-db", "acme")
    # The dashboard's client holds a credential of its own: decrypted in its cache, never shown.
    ui = Sentinel(
        hosts, "ui", namespace, announce=False, auth=AuthConfig(keys=ClientKeyring.generate())
    ).start()
    publisher.credentials.publish("api", "ui", {"user": "ui", "password": CREDENTIAL})
    _until(lambda: ui.get_service("api").auth is not None)
    _until(lambda: ui.session.zk.exists("/services/api/main:api-2") is not None)
    yield namespace, publisher, ui
    for client in (ui, web, publisher):
        client.close()


@pytest.fixture(scope="module")
def base(registry: tuple[str, Sentinel, Sentinel]) -> Iterator[str]:
    """The shared dashboard's URL (read-only)."""
    with dashboard(registry[2]) as served:
        yield served


def _until(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _get(url: str, **kwargs: object) -> httpx.Response:
    return HTTP.get(url, **kwargs)  # type: ignore[arg-type]


#: One client for the module: a new one per request costs a TLS context (~0.1 s here).
HTTP = httpx.Client(timeout=10)


def test_services_page_counts_instances_by_health(base: str) -> None:
    _until(
        lambda: (
            'data-instances="2"' in _get(f"{base}/services").text.split('id="service-api"')[1][:400]
        )
    )
    page = _get(f"{base}/services").text
    api = re.search(r'<tr id="service-api"[^>]*>', page)
    orders = re.search(r'<tr id="service-orders-db"[^>]*>', page)
    assert api and orders
    assert 'data-up="1" data-instances="2"' in api.group(0)
    assert 'data-failing="true"' in api.group(0)
    assert 'data-up="1" data-instances="2"' in orders.group(0)
    assert "unserved: p1" not in page and "unserved: p2" in page  # declared, none there
    failing = _get(f"{base}/services?failing=1").text
    assert 'id="service-api"' in failing


def _row(page: str, row_id: str) -> str:
    match = re.search(rf'<tr id="{re.escape(row_id)}"[^>]*>', page)
    assert match, f"no row {row_id} in the page"
    return match.group(0)


def test_a_service_page_gives_each_instance_explains_verdict(base, registry):
    _, _, ui = registry
    page = _get(f"{base}/services/orders-db").text
    verdicts = ui.explain_partition("orders-db", "p1").verdicts
    assert verdicts["p1:replica-b"] == "status draining"
    assert 'data-status="draining" data-eligible="false"' in _row(page, "instance-p1-replica-b")
    assert f'<td class="verdict">{verdicts["p1:replica-b"]}</td>' in page
    assert "replication_lag=3" in page
    empty = page.split('<section id="partition-p2"')[1].split("</section>")[0]
    assert '<p class="bad problem">has no live instance</p>' in empty
    api = _get(f"{base}/services/api").text
    # the failing readiness check: source, state and result, in explain()'s words
    down = ui.explain_partition("api", None).verdicts["main:api-2"]
    assert down.startswith("status down: failing its readiness check")
    assert 'data-status="down" data-eligible="false"' in _row(api, "instance-main-api-2")
    assert "check:call down" in api
    assert down.replace("<", "&lt;").replace(">", "&gt;") in api
    assert 'data-client="web-1"' in api  # a follower


def test_topology_rotations_shards_and_agents_show_the_registry(base):
    topology = _get(f"{base}/topology").text
    assert re.search(r'data-source="web" data-target="api" data-health="failing"', topology)
    if shutil.which("dot"):
        assert '<figure class="graph" id="graph"><svg' in topology
    else:
        print("Graphviz's dot is not installed: the topology is a list only")
    rotations = _get(f"{base}/rotations").text
    assert 'data-service="orders-db" data-client="web-1"' in rotations
    shards = _get(f"{base}/shards").text
    assert '<tr data-partition="p1"><td>p1</td><td class="num">2</td></tr>' in shards
    assert "orders-db: no live instance in p2" in shards
    assert "agrees with its buckets" in shards
    agents = _get(f"{base}/agents").text
    assert f'<section data-host="{socket.gethostname()}"' in agents
    assert '<tr data-client="web-1">' in agents


def test_the_doctor_page_shows_the_commands_findings(registry):
    namespace, _, ui = registry
    expected = json.loads(
        sentinel_in_process(
            "doctor", "--json", "--zk", ui.session.hosts, "--namespace", namespace
        ).stdout
    )
    doctor = argparse.Namespace(
        **vars(
            build_parser().parse_args(["ui", "--zk", ui.session.hosts, "--namespace", namespace])
        )
    )
    with dashboard(ui, doctor_args=doctor_options(doctor)) as served:
        page = _get(f"{served}/doctor").text
    errors = [f for f in expected if f["severity"] == "error"]
    assert errors  # p2 of orders-db has no live instance
    assert f'<span id="problems">{len(errors)}</span>' in page
    for finding in expected:
        assert f'data-severity="{finding["severity"]}" data-check="{finding["check"]}"' in page


def test_a_change_reaches_an_open_stream(base, registry):
    _, publisher, _ = registry
    [registration] = [r for r in publisher.registrations if r.path.endswith("main:api-1")]
    with HTTP.stream("GET", f"{base}/events") as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        assert next(lines) == "retry: 2000"
        publisher.update_registration(registration, weight=3)
        try:
            for line in lines:  # bounded by the read timeout
                if line.startswith("data: {"):
                    change = json.loads(line[6:])
                    if change["service"] == "api":
                        break
        finally:
            publisher.update_registration(registration, weight=1)
    assert change["kind"] == "InstancesChanged" and change["version"] >= 1
    page = _get(f"{base}/services/api").text
    assert 'data-version="' in page


def test_every_response_carries_the_security_headers(base):
    for path in (*PAGES, "/services/api", "/static/live.js", "/nowhere"):
        headers = _get(f"{base}{path}").headers
        assert "default-src 'self'" in headers["content-security-policy"], path
        assert "frame-ancestors 'none'" in headers["content-security-policy"], path
        assert headers["x-content-type-options"] == "nosniff", path
        assert headers["referrer-policy"] == "same-origin", path


def test_bad_input_gets_a_clean_404_or_400(base):
    typo = _get(f"{base}/services/orders-dbb")
    assert typo.status_code == 404 and "did you mean" in typo.text and "orders-db" in typo.text
    assert _get(f"{base}/services/nothing-here").status_code == 404
    assert _get(f"{base}/no/such/page").status_code == 404
    for query in ("?failing=maybe", "?junk=1", "?failing=1&x=%00"):
        assert _get(f"{base}/services{query}").status_code == 400, query
    assert _get(f"{base}/services/api?failing=1").status_code == 400
    assert _get(f"{base}/services/{'a' * 5000}").status_code == 400
    assert _get(f"{base}/services/{'a/' * 2000}").status_code == 404
    assert _get(f"{base}/services/bad%20name").status_code == 400
    assert _get(f"{base}/services/.hidden").status_code == 400
    assert HTTP.post(f"{base}/services").status_code == 405
    # DNS rebinding: another name resolving to this address is not this dashboard
    rebound = _get(f"{base}/services", headers={"host": "evil.example:80"})
    assert rebound.status_code == 400 and "orders-db" not in rebound.text
    for page in (typo.text, rebound.text):
        assert "Traceback" not in page


def test_no_secret_in_any_page(base, registry):
    _, _, ui = registry
    assert dict(ui.get_service("api").auth or {})["password"] == CREDENTIAL  # in the cache
    for path in (*PAGES, "/services/api", "/services/orders-db"):
        page = _get(f"{base}{path}").text
        assert SECRET not in page and CREDENTIAL not in page, path
    assert "password=***" in _get(f"{base}/services/api").text


@contextlib.contextmanager
def _viewer(served: str, path: str) -> Iterator[tuple[httpx.Client, str]]:
    """A viewer (a browser of its own, its cookie in its jar) that opened ``path``: it, and
    the CSRF token of the page's forms."""
    with httpx.Client(timeout=10) as viewer:
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', viewer.get(f"{served}{path}").text)
        assert token, "the page offers no action"
        yield viewer, token.group(1)


def test_an_action_needs_the_flag_this_origin_and_the_sessions_token(registry):
    _, _, ui = registry
    path = "/services/orders-db/instances/p1:replica-a/drain"
    with dashboard(ui) as served:  # read-only: no form, and a well-formed POST is refused
        assert 'name="csrf"' not in _get(f"{served}/services/orders-db").text
        refused = HTTP.post(f"{served}{path}", headers={"origin": served})
        assert refused.status_code == 403 and "--allow-actions" in refused.text
    with (
        dashboard(ui, allow_actions=True) as served,
        _viewer(served, "/services/orders-db") as (viewer, token),
        _viewer(served, "/services/orders-db") as (other, _),
    ):
        form = {"csrf": token}
        attempts = {
            "no token": (viewer, {"origin": served}, {}),
            "a token of no session": (viewer, {"origin": served}, {"csrf": "0" * 64}),
            "another session's token": (other, {"origin": served}, form),
            "no cookie": (HTTP, {"origin": served}, form),
            "cross-site Origin": (viewer, {"origin": "https://evil.example"}, form),
            "cross-site fetch": (viewer, {"sec-fetch-site": "cross-site"}, form),
            "no Origin at all": (viewer, {}, form),
        }
        for why, (client, headers, data) in attempts.items():
            response = client.post(f"{served}{path}", headers=headers, data=data)
            assert response.status_code == 403, why
        assert _status(ui, "orders-db", "p1:replica-a") == "up"  # nothing was written
        done = viewer.post(f"{served}{path}", headers={"origin": served}, data=form)
        assert done.status_code == 303, done.text[-600:]
        assert done.headers["location"] == "/services/orders-db"
        _until(lambda: _status(ui, "orders-db", "p1:replica-a") == "draining")
        back = path.replace("/drain", "/undrain")
        undone = viewer.post(f"{served}{back}", headers={"origin": served}, data=form)
        assert undone.status_code == 303
        _until(lambda: _status(ui, "orders-db", "p1:replica-a") == "up")


def _status(sentinel: Sentinel, service: str, name: str) -> str:
    return next(e.status for e in sentinel.cached_instances(service) if e.name == name)


def test_an_identity_sees_and_does_only_what_its_acls_allow(zookeeper):
    """A service whose nodes only its owner may read is listed by name only; an instance only
    its owner may write cannot be drained through a dashboard of another identity."""
    namespace = f"/test-ui-acl-{time.monotonic_ns()}"
    hosts = zookeeper.connect_string
    owner = Sentinel(hosts, "owner", namespace, identity="owner:owner-pw").start()
    owner.register("hidden", "main", "10.2.0.1", 80, label="h1")
    owner.register("open", "main", "10.2.0.2", 80, label="o1")
    admin = KazooClient(f"{hosts}{namespace}", auth_data=[("digest", "owner:owner-pw")])
    admin.start(10)
    try:
        private = [make_digest_acl("owner", "owner-pw", all=True)]
        for node in ("/services/hidden", "/services/hidden/main:h1"):
            admin.set_acls(node, private)
    finally:
        admin.stop()
        admin.close()
    viewer_password = "viewer-pw-do-not-show"
    viewer = Sentinel(
        hosts, "viewer", namespace, identity=f"viewer:{viewer_password}", announce=False
    ).start()
    try:
        with dashboard(viewer, allow_actions=True) as served:
            services = _get(f"{served}/services").text
            assert 'data-service="hidden" data-failing="true"' in _row(services, "service-hidden")
            assert "not readable" in services and "10.2.0.1" not in services
            hidden = _get(f"{served}/services/hidden")
            assert hidden.status_code == 403 and "10.2.0.1" not in hidden.text
            assert 'data-instances="1"' in _row(services, "service-open")
            with _viewer(served, "/services/open") as (browser, token):
                drain = browser.post(
                    f"{served}/services/open/instances/main:o1/drain",
                    headers={"origin": served},
                    data={"csrf": token},
                )
            assert drain.status_code == 403 and "refused by ZooKeeper" in drain.text
            [instance] = owner.read_service("open").instances  # from ZooKeeper itself
            assert instance.status == "up"
            for path in (*PAGES, "/services/open", "/services/hidden"):
                assert viewer_password not in _get(f"{served}{path}").text, path
    finally:
        viewer.close()
        owner.close()


#: Live streams the console script's dashboard serves at once in the test, and the streams
#: asked for beyond them (each must be refused, the process serving on). The refusal is a
#: count against the cap, the same for the 9th stream as the 5,000th; 1,000 is a fifth of the
#: CPU 5,000 took (most of this file's) and still 125 times the cap.
CAP, BEYOND_THE_CAP = 8, 1000


async def _beyond_the_cap(port: int, while_held: Callable[[], None]) -> list[bytes]:
    """CAP streams opened and held, BEYOND_THE_CAP more asked for (500 at a time), then
    ``while_held()`` run with the CAP streams still open: the status line each of the
    others got."""
    request = f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()

    async def stream() -> tuple[asyncio.StreamWriter, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        return writer, await asyncio.wait_for(reader.readline(), 10)

    held = [await stream() for _ in range(CAP)]
    assert all(status.startswith(b"HTTP/1.1 200") for _, status in held)
    statuses: list[bytes] = []
    gate = asyncio.Semaphore(500)  # connections at once: well under the fd limit

    async def refused() -> None:
        async with gate:
            writer, status = await stream()
            statuses.append(status)
            writer.close()

    await asyncio.gather(*(refused() for _ in range(BEYOND_THE_CAP)))
    await asyncio.to_thread(while_held)
    for writer, _ in held:
        writer.close()
        with contextlib.suppress(ConnectionError):  # the server may have gone meanwhile
            await writer.wait_closed()
    return statuses


@pytest.mark.parametrize("command", ["ui", "agent"])
def test_the_command_serves_until_sigterm_with_streams_open(registry, command):
    """``sentinel ui`` and ``sentinel agent --ui``: the console script prints where it
    serves, the pages are served, and SIGTERM ends it (exit 0) though streams are open.
    ``sentinel ui`` with --max-streams 8 also refuses 1,000 more streams (503) and serves on
    (a process of its own: the test's connections do not share its interpreter)."""
    namespace, _, ui = registry
    if command == "ui":
        arguments = ["ui", "--port", "0", "--allow-actions", "--max-streams", str(CAP)]
    else:
        directory = tempfile.mkdtemp(prefix="agent-")  # the agent's socket's: 0700, root's
        arguments = ["agent", "--socket", os.path.join(directory, "agent.sock"), "--ui", "0"]
    connection = ["--json", "--zk", ui.session.hosts, "--namespace", namespace]
    with subprocess.Popen([SENTINEL, *arguments, *connection], stdout=subprocess.PIPE) as served:
        try:
            assert served.stdout is not None
            for line in served.stdout:  # its events, up to its dashboard's address
                event = json.loads(line)
                if event["event"] in ("serving", "serving_ui") and "url" in event:
                    break
            base = event["url"].rstrip("/")
            assert base.startswith("http://127.0.0.1:")
            page = _get(f"{base}/services").text
            assert 'id="service-orders-db"' in page
            offered = 'name="csrf"' in _get(f"{base}/services/orders-db").text
            assert offered == (command == "ui")  # the agent offers no action
            assert ("served by agent" in page) == (command == "agent")

            def stop() -> None:  # with streams open
                with HTTP.stream("GET", f"{base}/events") as stream:
                    assert stream.status_code == (503 if command == "ui" else 200)
                    assert _get(f"{base}/services").status_code == 200  # pages still served
                    served.send_signal(signal.SIGTERM)
                    assert served.wait(10) == 0

            if command == "ui":
                port = int(base.rsplit(":", 1)[1])
                statuses = asyncio.run(_beyond_the_cap(port, stop))
                assert len(statuses) == BEYOND_THE_CAP
                assert all(status.startswith(b"HTTP/1.1 503") for status in statuses)
            else:
                stop()
        finally:
            served.kill()


def test_a_taken_port_is_exit_4_before_connecting(registry):
    taken = listen("127.0.0.1", 0)
    try:
        port = str(taken.getsockname()[1])
        done = sentinel_in_process("ui", "--port", port, "--zk", "127.0.0.1:1", "--timeout", "1")
    finally:
        taken.close()
    assert done.returncode == 4
    assert "another process listens there" in done.stderr and "Traceback" not in done.stderr
