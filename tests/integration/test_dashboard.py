"""``sentinel ui``: every page against a real ZooKeeper, served by a real uvicorn on a port.

One registry and one dashboard are shared by the module (what the pages show is read, never
changed, by most tests); the tests that change something or need other settings serve
their own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from sentinel import HealthCheck
from sentinel.cli import build_parser
from sentinel.cli.ui import _doctor_args, build
from sentinel.client import Sentinel
from sentinel.testing.zookeeper import LocalZooKeeper
from sentinel.ui.server import listen, url
from tests.conftest import sentinel_in_process

pytestmark = pytest.mark.integration

#: What no page may show: a property's secret value, and the dashboard's own identity's.
SECRET = "hunter2-do-not-show"
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
    ui = Sentinel(hosts, "ui", namespace, announce=False).start()
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
    return httpx.get(url, timeout=10, **kwargs)  # type: ignore[arg-type]


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
    assert "unserved: p2" not in page  # p2 has no instance at all: no partition in the cache
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
    with dashboard(ui, doctor_args=_doctor_args(doctor)) as served:
        page = _get(f"{served}/doctor").text
    errors = [f for f in expected if f["severity"] == "error"]
    assert errors  # p2 of orders-db has no live instance
    assert f'<span id="problems">{len(errors)}</span>' in page
    for finding in expected:
        assert f'data-severity="{finding["severity"]}" data-check="{finding["check"]}"' in page


def test_a_change_reaches_an_open_stream(base, registry):
    _, publisher, _ = registry
    [registration] = [r for r in publisher.registrations if r.path.endswith("main:api-1")]
    with httpx.stream("GET", f"{base}/events", timeout=10) as stream:
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
    assert httpx.post(f"{base}/services", timeout=10).status_code == 405
    # DNS rebinding: another name resolving to this address is not this dashboard
    rebound = _get(f"{base}/services", headers={"host": "evil.example:80"})
    assert rebound.status_code == 400 and "orders-db" not in rebound.text
    for page in (typo.text, rebound.text):
        assert "Traceback" not in page


def test_no_secret_in_any_page(base):
    for path in (*PAGES, "/services/api", "/services/orders-db"):
        page = _get(f"{base}{path}").text
        assert SECRET not in page, path
    assert "password=***" in _get(f"{base}/services/api").text
