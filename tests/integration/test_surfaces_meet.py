"""Where the surfaces meet (issue 51): ``doctor``, ``ls``, ``resolve``, ``explain()`` and
``NoInstanceAvailable`` speak of regions and of health in the same words, ``ServiceConflict``
names the field that differs, and a service nothing uses can be retired in one transaction.

Against real ZooKeeper: the session's server is region ``east``, a second one started for the
module is ``west``; readiness checks run against a real HTTP server that answers 503.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sentinel import HealthCheck, Sentinel
from sentinel.errors import (
    NoInstanceAvailable,
    RegistryConflict,
    ServiceConflict,
    ServiceInUse,
    ServiceNotFound,
)
from sentinel.regions import Region, Regions
from sentinel.registry import retire
from sentinel.registry.failover import Failover
from sentinel.registry.retire import retire_service
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from tests.conftest import sentinel_in_process

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def west() -> Iterator[LocalZooKeeper]:
    with LocalZooKeeper() as zk:
        yield zk


@pytest.fixture
def regions_file(zookeeper, west, namespace, tmp_path) -> str:
    document = {
        "local": "east",
        "regions": {
            name: {"hosts": zk.connect_string, "namespace": namespace}
            for name, zk in (("east", zookeeper), ("west", west))
        },
    }
    path = tmp_path / "regions.json"
    path.write_text(json.dumps(document))
    return str(path)


def by_service(result, service: str) -> list[dict]:
    """The doctor findings (``--json``) that name ``service`` first."""
    return [f for f in json.loads(result.stdout) if f["detail"].startswith(f"{service} ")]


def test_doctor_in_every_region_names_the_region_that_serves_a_failed_over_service(
    zookeeper, west, namespace, regions_file
):
    rule = Failover(regions=("west",))
    with (
        Sentinel(zookeeper.connect_string, "east-pub", namespace, regions=False) as east_pub,
        Sentinel(west.connect_string, "west-pub", namespace, regions=False) as west_pub,
    ):
        east_pub.ensure_service("api", failover=rule)  # no instance in east: it fails over
        west_pub.register("api", "main", "10.2.0.1", 8080, label="w1")
        # A client in east follows api (an error if nothing served it) and is answered by west.
        regions = Regions(
            "east",
            [
                Region("east", zookeeper.connect_string, namespace=namespace),
                Region("west", west.connect_string, namespace=namespace),
            ],
        )
        with Sentinel(zookeeper.connect_string, "east-app", namespace, regions=regions) as client:
            assert client.get_service("api").host == "10.2.0.1"
            for extra in ((), ("--region", "all")):
                result = sentinel_in_process(
                    "doctor", "--json", "--regions", regions_file, "--timeout", "5", *extra
                )
                (finding,) = [f for f in by_service(result, "api") if f["region"] == "east"]
                assert finding["severity"] == "ok", finding
                assert "served from west (failover rule west)" in finding["detail"]
                assert not [f for f in json.loads(result.stdout) if f["severity"] == "error"]
                assert result.returncode == 0, result.stdout
            resolved = sentinel_in_process("resolve", "api", "--regions", regions_file)
            assert resolved.returncode == 0, resolved.stderr
            assert "region west:" in resolved.stdout
            listed = sentinel_in_process("ls", "--json", "--regions", regions_file)
            assert [d["failover"] for d in json.loads(listed.stdout)] == ["west"]


def test_a_failed_over_service_no_region_serves_is_an_error_not_an_empty_service(
    zookeeper, west, namespace, regions_file
):
    with Sentinel(zookeeper.connect_string, "east-pub", namespace, regions=False) as east_pub:
        east_pub.ensure_service("lonely", failover=Failover(regions=("west",)))
        result = sentinel_in_process(
            "doctor", "--json", "--regions", regions_file, "--region", "all", "--timeout", "5"
        )
    (finding,) = by_service(result, "lonely")
    assert (finding["severity"], finding["check"], finding["region"]) == (
        "error",
        "no live instance",
        "east",
    )
    assert "its failover rule (west) finds no other region serving it" in finding["detail"]
    assert result.returncode == 1


class _Failing(ThreadingHTTPServer):
    daemon_threads = True


@contextmanager
def failing_server() -> Iterator[int]:
    """An HTTP server on a free loopback port whose ``/ready`` answers 503; its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    server = _Failing(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_checks_failing_on_every_instance_are_named_by_the_error_resolve_ls_and_doctor(
    make_client, cli_in_process
):
    publisher, reader = make_client("publisher"), make_client("reader")
    check = HealthCheck.http("/ready", interval=2.0, timeout=2.0, failures_before_down=1)
    with failing_server() as port:
        for label in ("a", "b"):
            publisher.register("web", "main", "127.0.0.1", port, label=label, health=check)
        reader.prefetch("web")
        assert wait_until(
            lambda: [i.status for i in reader.cached_instances("web")] == ["down", "down"], 10
        )
        with pytest.raises(NoInstanceAvailable) as raised:
            reader.get_service("web")
        message = str(raised.value)
        assert "none is up; 2 status down: failing its readiness check GET /ready" in message
        assert f"GET http://127.0.0.1:{port}/ready: status 503" in message
        verdicts = reader.explain("web").verdicts
        assert verdicts["main:a"].startswith("status down: failing its readiness check GET /ready")

        resolved = cli_in_process("resolve", "web")
        assert resolved.returncode == 1
        assert "excluded by status up" not in resolved.stdout
        assert resolved.stdout.count("failing its readiness check GET /ready") >= 3  # 2 rows, error

        listed = json.loads(cli_in_process("ls", "web", "--json").stdout)
        assert {(i["check_name"], i["check_result"]) for i in listed["instances"]} == {
            ("GET /ready", f"GET http://127.0.0.1:{port}/ready: status 503")
        }
        table = cli_in_process("ls", "web").stdout
        assert table.count(f"check:http down (GET http://127.0.0.1:{port}/ready") == 2

        doctor = cli_in_process("doctor", "--json")
        (finding,) = by_service(doctor, "web")
        assert finding["severity"] == "error" and finding["check"] == "no live instance"
        assert "has 2 instance(s) but none is eligible: none is up" in finding["detail"]
        assert "failing its readiness check GET /ready" in finding["detail"]
        assert finding["fix"].startswith("make GET /ready pass on them")


def test_what_a_check_publishes_holds_no_query_and_no_application_message(make_client, raw_zk):
    def leaky() -> bool:
        raise RuntimeError("cannot log in as app with password=hunter2")

    client = make_client("publisher")
    fast = {"interval": 2.0, "timeout": 2.0, "failures_before_down": 1}
    with failing_server() as port:
        called = client.register(
            "web", "main", "127.0.0.1", port, label="c", health=HealthCheck.call(leaky, **fast)
        )
        asked = client.register(
            "web",
            "main",
            "127.0.0.1",
            port,
            label="h",
            health=HealthCheck.http("/ready?token=s3cret", **fast),
        )
        nodes = {r.path: r for r in (called, asked)}
        assert wait_until(
            lambda: all(json.loads(raw_zk.get(p)[0])["status"] == "down" for p in nodes), 10
        )
        published = {p: json.loads(raw_zk.get(p)[0]) for p in nodes}
    assert (published[called.path]["check_name"], published[called.path]["check_result"]) == (
        "call test_what_a_check_publishes_holds_no_query_and_no_application_message.<locals>.leaky",
        "raised RuntimeError",
    )
    assert published[asked.path]["check_name"] == "GET /ready"
    assert published[asked.path]["check_result"] == (
        f"GET http://127.0.0.1:{port}/ready: status 503"
    )
    assert not [p for p in nodes if b"hunter2" in raw_zk.get(p)[0] or b"s3cret" in raw_zk.get(p)[0]]


def test_a_differing_failover_rule_is_named_with_the_way_to_change_it(make_client, raw_zk):
    client = make_client("publisher")
    client.ensure_service("orders", failover=Failover(regions=("west",)))
    before = raw_zk.get("/services/orders")
    with pytest.raises(ServiceConflict) as raised:
        client.ensure_service("orders", failover=Failover(regions=("north",)))
    message = str(raised.value)
    assert "exists with failover=west; asked for failover=north" in message
    assert "set_failover" in message and "sentinel failover orders RULE" in message
    assert "scheme" not in message  # only the field that differs
    assert raw_zk.get("/services/orders") == before


def test_doctor_tells_an_empty_service_from_a_broken_one(make_client, cli_in_process):
    publisher = make_client("publisher")
    publisher.ensure_service("old")  # no instance, nobody follows it: retirable
    publisher.ensure_service("wanted")  # no instance, a client follows it: broken
    make_client("reader").prefetch("wanted")
    publisher.register("stopped", "main", "10.0.0.9", 80, status="down")
    result = cli_in_process("doctor", "--json")
    (old,) = by_service(result, "old")
    assert (old["severity"], old["check"]) == ("warn", "empty service")
    assert old["fix"].startswith("sentinel service retire old")
    (wanted,) = by_service(result, "wanted")
    assert (wanted["severity"], wanted["check"]) == ("error", "no live instance")
    assert "1 client(s) follow it" in wanted["detail"]
    (stopped,) = by_service(result, "stopped")
    assert stopped["severity"] == "error" and "1 status down" in stopped["detail"]
    assert "retire" not in wanted["fix"] + stopped["fix"]


def test_retire_refuses_a_service_in_use_unless_forced(make_client, raw_zk, cli_in_process):
    publisher = make_client("publisher")
    publisher.register("api", "main", "10.0.0.1", 80, label="a")
    publisher.update_metrics(publisher.registrations[0], {"lag": 1})
    refused = cli_in_process("service", "retire", "api")
    assert refused.returncode == 1
    assert "service 'api' is in use: 1 instance(s) registered" in refused.stderr
    assert raw_zk.exists("/services/api/main:a") and raw_zk.exists("/metrics/api/main:a")
    with pytest.raises(ServiceInUse) as raised:
        retire_service(raw_zk, "api")
    assert (raised.value.instances, raised.value.followers) == (1, 0)

    forced = cli_in_process("service", "retire", "api", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    document = json.loads(forced.stdout)
    assert document["instances"] == 1 and "/services/api" in document["removed"]
    for path in ("/services/api", "/metrics/api", "/clients/api"):
        assert raw_zk.exists(path) is None, path
    missing = cli_in_process("service", "retire", "api")
    assert missing.returncode == 1 and "not registered" in missing.stderr
    bad = cli_in_process("service", "retire", "no/such")
    assert bad.returncode == 2


def test_retire_refuses_a_followed_service_and_retires_an_empty_one(
    make_client, raw_zk, cli_in_process
):
    publisher = make_client("publisher")
    publisher.ensure_service("followed")
    reader = make_client("reader")
    reader.prefetch("followed")
    assert wait_until(lambda: raw_zk.get_children("/clients/followed"), 5)
    refused = cli_in_process("service", "retire", "followed")
    assert refused.returncode == 1 and "1 client(s) following it" in refused.stderr
    assert raw_zk.exists("/services/followed")

    publisher.ensure_service("empty")
    retired = cli_in_process("service", "retire", "empty")
    assert retired.returncode == 0, retired.stderr
    assert retired.stdout.startswith("retired empty:")
    assert raw_zk.exists("/services/empty") is None
    assert "empty" not in [d["service"] for d in json.loads(cli_in_process("ls", "--json").stdout)]
    with pytest.raises(ServiceNotFound):
        retire_service(raw_zk, "empty")


def test_a_registration_during_a_retirement_leaves_everything_in_place(
    make_client, raw_zk, monkeypatch
):
    publisher = make_client("publisher")
    publisher.ensure_service("racy")
    raw_zk.ensure_path("/metrics/racy")
    listed = retire._subtree

    def subtree_then_a_registration(zk, root):
        found = listed(zk, root)
        if root == "/services/racy":  # planned without it, committed with it there
            publisher.register("racy", "main", "10.0.0.2", 80, label="late")
        return found

    monkeypatch.setattr(retire, "_subtree", subtree_then_a_registration)
    with pytest.raises(RegistryConflict, match="nothing was removed"):
        retire_service(raw_zk, "racy")
    assert raw_zk.exists("/services/racy/main:late")
    assert raw_zk.exists("/metrics/racy") and raw_zk.exists("/clients/racy")
