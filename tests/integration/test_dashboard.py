"""``sentinel ui``: every page against a real ZooKeeper, served by a real uvicorn on a port.

One registry and one dashboard are shared by the module (what the pages show is read, never
changed, by most tests); the tests that change something or need other settings serve
their own.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from sentinel import HealthCheck
from sentinel.cli.ui import build
from sentinel.client import Sentinel
from sentinel.testing.zookeeper import LocalZooKeeper
from sentinel.ui.server import listen, url

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
