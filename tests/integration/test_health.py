"""Readiness checks on the publisher against a real ZooKeeper and real HTTP servers: the
status follows a flipping endpoint within interval x threshold, a noisy check does not flap
(status writes counted by the node's version), hostile endpoints and callables are bounded
failures, and drains are never overridden."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from sentinel.policies import Threshold

from sentinel import HealthCheck
from sentinel.collector import MetricCollector, parse_config
from sentinel.errors import NoInstanceAvailable, ValidationError
from sentinel.health import readiness
from sentinel.health.damping import Damper
from sentinel.testing.helpers import expire_session, wait_until
from sentinel.testing.httpserver import raw_server
from sentinel.zk.ephemeral import EphemeralNodes

pytestmark = pytest.mark.integration

SENTINEL = str(Path(sys.executable).with_name("sentinel"))
# Scheduling, the write and its watch on a loaded two-core machine: the margin every "within"
# bound below adds to what the check's settings promise.
MARGIN = 1.0


class _Readiness(ThreadingHTTPServer):
    daemon_threads = True
    code = 200


@contextmanager
def readiness_server() -> Iterator[_Readiness]:
    """A standard-library HTTP server on a free loopback port whose ``/ready`` answers
    ``server.code``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(server.code if self.path == "/ready" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    server = _Readiness(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _register_called(client, label: str, function, interval: float, port: int = 8080):
    """Register ``web``/``p1``/``label`` with a call check of ``function`` every ``interval``
    seconds, bounded by as much."""
    health = HealthCheck.call(function, interval=interval, timeout=interval)
    return client.register("web", "p1", "127.0.0.1", port, label=label, health=health)


def _sample(name: str, **labels: str) -> float:
    """A health metric of service ``web``'s HTTP checks as the client's registry exports it."""
    value = REGISTRY.get_sample_value(name, {"service": "web", "source": "check:http", **labels})
    return value or 0.0


def _unavailable(client, service: str, policy=None) -> bool:
    try:
        client.eligible_instances(service, policy=policy)
    except NoInstanceAvailable:
        return True
    return False


def _status(raw_zk, registration) -> str:
    data, _ = raw_zk.get(registration.path)
    return json.loads(data)["status"]


def _wait_status(raw_zk, registration, status: str, timeout: float) -> float | None:
    return wait_until(lambda: _status(raw_zk, registration) == status, timeout, interval=0.005)


def test_status_follows_a_flipping_readiness_endpoint(make_client, raw_zk):
    client = make_client()
    check = HealthCheck.http(
        "/ready", interval=0.2, timeout=0.2, failures_before_down=3, successes_before_up=2
    )
    with readiness_server() as server:
        registration = client.register(
            "web", "p1", "127.0.0.1", server.server_port, label="a", health=check
        )
        data, stat = raw_zk.get(registration.path)
        node = json.loads(data)
        assert node["health"] == "check:http"
        # Created `starting`; the first result may be written already (the check runs at once).
        assert (stat.version, node["status"]) in ((0, "starting"), (1, "up"))
        assert _wait_status(raw_zk, registration, "up", check.timeout + MARGIN) is not None
        assert client.get_service("web").port == server.server_port

        downs = _sample("sentinel_health_status_changes_total", status="down")
        server.code = 503
        flipped = time.monotonic()
        assert _wait_status(raw_zk, registration, "down", 0.2 * 3 + MARGIN) is not None
        took = time.monotonic() - flipped
        assert took >= 0.2 * 2, f"down after {took:.2f} s: fewer than 3 failures in a row"
        assert _sample("sentinel_health_status_changes_total", status="down") == downs + 1
        assert _sample("sentinel_health_checks_down") == 1
        assert wait_until(lambda: _unavailable(client, "web"), MARGIN)

        server.code = 200
        flipped = time.monotonic()
        assert _wait_status(raw_zk, registration, "up", 0.2 * 2 + MARGIN) is not None
        took = time.monotonic() - flipped
        assert took >= 0.2 * 1, f"up after {took:.2f} s: fewer than 2 passes in a row"
        # Three state changes, three writes: starting -> up -> down -> up.
        assert raw_zk.exists(registration.path).version == 3
        assert _sample("sentinel_health_checks_down") == 0


def test_a_noisy_check_does_not_flap(make_client, raw_zk, monkeypatch):
    """A seeded callable failing about a quarter of the time at random (seed 9: 23 failures
    in the first 80 results, never three in a row; then passes): the instance stays up, one
    status write in all (starting -> up), where the same results undamped would have changed
    its status over 40 times. Writes are counted by the node's version (one per set).

    What the damper is given is recorded where it takes it: a run that misses its 0.1 s
    deadline on a loaded machine is a failure the callable never returned (the scheduler's,
    rightly), and three in a row take the instance down. The seeded promise is checked when
    the damper got exactly the callable's results; otherwise the writes are checked against
    the damping of what it got."""
    rng = random.Random(9)
    results: list[bool] = []
    damped: list[bool] = []

    def noisy() -> bool:
        results.append(rng.random() >= 0.2 if len(results) < 80 else True)
        return results[-1]

    class Recorded(Damper):
        def observe(self, passed: bool) -> str | None:
            damped.append(passed)
            return super().observe(passed)

    monkeypatch.setattr(readiness, "Damper", Recorded)
    client = make_client()
    registration = _register_called(client, "noisy", noisy, 0.1)
    assert wait_until(lambda: len(results) >= 80, 80 * 0.1 + 10 * MARGIN)
    assert _wait_status(raw_zk, registration, "up", 10 * MARGIN) is not None
    writes = raw_zk.exists(registration.path).version
    given = list(damped)  # after the read: it holds the result of every write counted
    undamped = Damper(1, 1)
    assert results[:80].count(False) >= 20
    assert sum(undamped.observe(r) is not None for r in results[:80]) > 40
    if given == results[: len(given)]:  # the callable's results, none missed or late
        assert writes == 1  # starting -> up, nothing since
    else:
        replay = Damper(3, 2)  # the check's thresholds (the defaults)
        changes = sum(replay.observe(r) is not None for r in given)
        # at most one write per change: a state that lasted less than a write is not written
        assert 1 <= writes <= changes, (writes, changes, given)


def _hang(conn: socket.socket) -> None:
    conn.recv(4096)
    time.sleep(30)  # holds the connection and never answers


def _garbage(conn: socket.socket) -> None:
    with conn:
        conn.recv(4096)
        conn.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n")


def _huge(conn: socket.socket) -> None:
    with conn:
        conn.recv(4096)
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5368709120\r\n\r\n")
            chunk = b"x" * 65536
            for _ in range(5368709120 // len(chunk)):
                conn.sendall(chunk)
        except OSError:
            return  # the check closed the connection after the status line


def test_hostile_endpoints_are_bounded_failures_and_a_5_gb_body_is_not_read(make_client, raw_zk):
    client = make_client()
    check = dict(interval=0.3, timeout=0.3)
    with raw_server(_hang) as hang, raw_server(_garbage) as garbage, raw_server(_huge) as huge:
        registrations = {
            name: client.register(
                "web", "p1", "127.0.0.1", port, label=name, health=HealthCheck.http("/", **check)
            )
            for name, port in (("hang", hang), ("garbage", garbage), ("huge", huge))
        }
        # The first result decides: within one timeout (plus the margin) of the start.
        for name, wanted in (("hang", "down"), ("garbage", "down"), ("huge", "up")):
            took = _wait_status(raw_zk, registrations[name], wanted, 0.3 + MARGIN)
            assert took is not None, f"{name} is not {wanted}"
        # And they stay so, one write each: no result of a hostile endpoint flips them.
        time.sleep(0.3 * 4)  # four more results of each: the claim is about their absence
        for name, wanted in (("hang", "down"), ("garbage", "down"), ("huge", "up")):
            assert _status(raw_zk, registrations[name]) == wanted
            assert raw_zk.exists(registrations[name].path).version == 1


def test_a_raising_or_never_returning_callable_is_a_failure_logged_once(
    make_client, raw_zk, caplog
):
    never = threading.Event()
    calls = {"raise": 0, "hang": 0, "ok": 0}

    def raising() -> bool:
        calls["raise"] += 1
        raise ConnectionError("database unreachable")

    def hanging() -> bool:
        calls["hang"] += 1
        never.wait()
        return True

    def fine() -> bool:
        calls["ok"] += 1
        return True

    client = make_client()
    caplog.set_level("INFO", logger="sentinel.health")
    try:
        regs = {
            name: _register_called(client, name, function, 0.1, port=5432 + i)
            for i, (name, function) in enumerate(
                (("raise", raising), ("hang", hanging), ("ok", fine))
            )
        }
        assert _wait_status(raw_zk, regs["raise"], "down", 0.1 + MARGIN) is not None
        assert _wait_status(raw_zk, regs["hang"], "down", 0.1 + MARGIN) is not None
        assert _wait_status(raw_zk, regs["ok"], "up", 0.1 + MARGIN) is not None
        assert wait_until(lambda: calls["raise"] >= 10 and calls["ok"] >= 10, 10 * 0.1 + MARGIN)
        assert calls["hang"] == 1  # not called again while its first call has not returned
        failures = [r for r in caplog.records if "readiness check failed" in r.getMessage()]
        assert len([r for r in failures if "raise" in r.getMessage()]) == 1
        assert "ConnectionError: database unreachable" in failures[0].getMessage()
        assert len([r for r in failures if "p1:hang" in r.getMessage()]) == 1
    finally:
        never.set()


def test_a_check_never_overrides_a_drain(make_client, raw_zk):
    healthy = threading.Event()
    healthy.set()
    calls = [0]

    def check() -> bool:
        calls[0] += 1
        return healthy.is_set()

    client = make_client()
    registration = _register_called(client, "a", check, 0.1)
    assert _wait_status(raw_zk, registration, "up", 0.1 + MARGIN) is not None
    client.update_registration(registration, status="draining")
    version = raw_zk.exists(registration.path).version
    healthy.clear()
    count = calls[0]
    assert wait_until(lambda: calls[0] >= count + 5, 5 * 0.1 + MARGIN)  # 3 failures and more
    assert _status(raw_zk, registration) == "draining"
    assert raw_zk.exists(registration.path).version == version
    # Undrained by hand (`sentinel undrain` writes "up"): the check's state is written back.
    client.update_registration(registration, status="up")
    assert _wait_status(raw_zk, registration, "down", 0.1 * 2 + MARGIN) is not None


def test_deregistration_stops_the_check_and_close_stops_its_threads(make_client, raw_zk):
    calls = [0]

    def check() -> bool:
        calls[0] += 1
        return True

    client = make_client()
    before = threading.active_count()
    registration = _register_called(client, "a", check, 0.05)
    assert _wait_status(raw_zk, registration, "up", 0.05 + MARGIN) is not None
    assert client.deregister(registration)
    count = calls[0]
    assert wait_until(lambda: calls[0] > count + 1, 0.5) is None  # at most one run in flight
    assert raw_zk.exists(registration.path) is None  # no status write re-created it
    client.close()
    assert wait_until(lambda: threading.active_count() <= before, 5) is not None


def test_a_health_argument_that_is_not_a_check_writes_nothing(make_client, raw_zk):
    client = make_client()
    with pytest.raises(ValidationError):
        client.register("web", "p1", "127.0.0.1", 8080, label="a", health="http://x/ready")
    with pytest.raises(ValidationError):
        client.register(
            "web", "p1", "127.0.0.1", 8080, label="a", health=HealthCheck.http("/r", interval=0)
        )
    assert raw_zk.exists("/services/web") is None


def test_the_collector_runs_the_same_check_from_outside_and_policies_read_it(make_client, raw_zk):
    publisher, app = make_client("publisher"), make_client("app")
    config = parse_config(
        {
            "cluster": "health",
            "services": [
                {
                    "service": "web",
                    "interval": "200ms",
                    "timeout": "200ms",
                    "jitter": "20ms",
                    "source": {"type": "health", "http": "/ready", "failures_before_down": 2},
                }
            ],
        }
    )
    healthy = Threshold("health", above=0, max_age=5)
    with readiness_server() as a, readiness_server() as b:
        for label, server in (("a", a), ("b", b)):
            publisher.register("web", "p1", "127.0.0.1", server.server_port, label=label)
        b.code = 500
        with MetricCollector(make_client("collector"), config):
            assert wait_until(
                lambda: (
                    app.eligible_instances("web", policy=healthy)[0].label == "a"
                    and len(app.eligible_instances("web", policy=healthy)) == 1
                ),
                0.2 + 5 * MARGIN,
                ignore=(NoInstanceAvailable,),
            )
            a.code = 503
            flipped = time.monotonic()
            assert wait_until(lambda: _unavailable(app, "web", healthy), 0.2 * 2 + 2 * MARGIN)
            assert time.monotonic() - flipped >= 0.2  # two failures in a row, not one
            b.code = 200
            assert wait_until(
                lambda: [e.label for e in app.eligible_instances("web", policy=healthy)] == ["b"],
                0.2 * 2 + 2 * MARGIN,
                ignore=(NoInstanceAvailable,),
            )
    # The verdict is a metric in /metrics (the collector's node); the status is the publisher's.
    assert json.loads(raw_zk.get("/metrics/web/p1:b")[0])["metrics"] == {"health": 1}
    assert json.loads(raw_zk.get("/services/web/p1:a")[0])["status"] == "up"


def test_ls_shows_each_instance_health_source_and_state(make_client, raw_zk, cli_in_process):
    client = make_client()
    checked = _register_called(client, "checked", lambda: False, 0.1)
    client.register("web", "p1", "127.0.0.1", 8081, label="plain")
    assert _wait_status(raw_zk, checked, "down", 0.1 + MARGIN) is not None
    table = cli_in_process("ls", "web")
    assert table.returncode == 0, table.stderr
    rows = {line.split()[1]: line for line in table.stdout.splitlines()[1:]}
    assert "check:call down" in rows["checked"]
    assert "registry up" in rows["plain"]
    listed = json.loads(cli_in_process("ls", "web", "--json").stdout)
    health = {i["label"]: i["health"] for i in listed["instances"]}
    assert health == {
        "checked": {"source": "check:call", "state": "down"},
        "plain": {"source": "registry", "state": "up"},
    }


def test_the_cli_publisher_holds_a_checked_registration_until_sigterm(zookeeper, namespace, raw_zk):
    with readiness_server() as server:
        process = subprocess.Popen(
            [
                SENTINEL,
                "register",
                "web",
                "p1",
                "127.0.0.1",
                str(server.server_port),
                "--label",
                "sidecar",
                "--check-http",
                "/ready",
                "--check-interval",
                "0.2",
                "--check-timeout",
                "0.2",
                "--zk",
                zookeeper.connect_string,
                "--namespace",
                namespace,
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            line = json.loads(process.stdout.readline())
            assert line == {
                "event": "registered",
                "service": "web",
                "instance": "p1:sidecar",
                "status": "starting",
                "health": "check:http",
            }
            path = "/services/web/p1:sidecar"
            assert wait_until(lambda: json.loads(raw_zk.get(path)[0])["status"] == "up", 5)
            server.code = 503
            assert wait_until(lambda: json.loads(raw_zk.get(path)[0])["status"] == "down", 5)
            process.send_signal(signal.SIGTERM)
            assert process.wait(10) == 0
            assert raw_zk.exists(path) is None
            assert "Traceback" not in process.stderr.read()
        finally:
            if process.poll() is None:
                process.kill()
            process.stdout.close()
            process.stderr.close()


def test_the_cli_publisher_refuses_bad_check_options_before_connecting(cli_in_process):
    result = cli_in_process("register", "web", "p1", "127.0.0.1", "80", "--check-http", "ftp://x")
    assert result.returncode == 2
    assert "url 'ftp://x'" in result.stderr
    result = cli_in_process(
        "register", "web", "p1", "127.0.0.1", "80", "--check-tcp", "--check-timeout", "9"
    )
    assert result.returncode == 2 and "timeout" in result.stderr


def test_a_write_based_on_what_was_kept_is_skipped_once_that_changed(raw_zk):
    """The guard of a check's status write (EphemeralNodes.put(expect=)): a change computed
    from what was kept is not written over what replaced it since (a drain adopted meanwhile)."""
    nodes = EphemeralNodes(raw_zk)
    nodes.start()
    try:
        assert nodes.put("/guarded", b"up")
        base = nodes.kept("/guarded")
        assert nodes.put("/guarded", b"draining")  # what the drain's adoption keeps
        assert not nodes.put("/guarded", b"down", expect=base)
        assert raw_zk.get("/guarded")[0] == b"draining"
        assert nodes.put("/guarded", b"down", expect=nodes.kept("/guarded"))
        assert raw_zk.get("/guarded")[0] == b"down"
    finally:
        nodes.close(5)


def test_a_session_expiry_restores_the_checked_status_and_the_check_goes_on(make_client, raw_zk):
    healthy = threading.Event()
    client = make_client()
    registration = _register_called(client, "a", healthy.is_set, 0.1)
    assert _wait_status(raw_zk, registration, "down", 0.1 + MARGIN) is not None
    old = expire_session(client)
    # Re-created by the new session with the status the check had published, not `starting`.
    assert wait_until(
        lambda: (
            (stat := raw_zk.exists(registration.path)) is not None and stat.ephemeralOwner != old
        ),
        10,
    )
    assert _status(raw_zk, registration) == "down"
    healthy.set()
    assert _wait_status(raw_zk, registration, "up", 0.1 * 2 + MARGIN) is not None


def test_status_follows_an_instances_grpc_health_service(make_client, raw_zk):
    """``HealthCheck.grpc``: a real grpcio server's standard health service, flipped between
    SERVING and NOT_SERVING, takes the instance down and back up."""
    from sentinel.testing.grpcserver import SERVICE, LoopbackGRPCServer

    client = make_client()
    check = HealthCheck.grpc(
        SERVICE, interval=0.2, timeout=0.2, failures_before_down=2, successes_before_up=1
    )
    with LoopbackGRPCServer("a") as server:
        registration = client.register(
            "rpc", "p1", "127.0.0.1", server.port, label="a", health=check
        )
        assert json.loads(raw_zk.get(registration.path)[0])["health"] == "check:grpc"
        assert _wait_status(raw_zk, registration, "up", check.timeout + MARGIN) is not None
        server.set_serving(False)
        assert _wait_status(raw_zk, registration, "down", 0.2 * 2 + MARGIN) is not None
        assert wait_until(lambda: _unavailable(client, "rpc"), MARGIN)
        server.set_serving(True)
        assert _wait_status(raw_zk, registration, "up", 0.2 + MARGIN) is not None


def test_the_cli_publisher_follows_a_grpc_health_service(zookeeper, namespace, raw_zk):
    from sentinel.testing.grpcserver import SERVICE, LoopbackGRPCServer

    with LoopbackGRPCServer("a") as server:
        process = subprocess.Popen(
            [
                *(SENTINEL, "register", "rpc", "p1", "127.0.0.1", str(server.port), "--label"),
                *("a", "--check-grpc", SERVICE, "--check-interval", "0.2", "--check-timeout"),
                *("0.2", "--zk", zookeeper.connect_string, "--namespace", namespace, "--json"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            registered = process.stdout.readline()
            assert registered, process.stderr.read()
            assert json.loads(registered)["health"] == "check:grpc"
            path = "/services/rpc/p1:a"
            assert wait_until(lambda: json.loads(raw_zk.get(path)[0])["status"] == "up", 5)
            server.set_serving(False)
            assert wait_until(lambda: json.loads(raw_zk.get(path)[0])["status"] == "down", 5)
            process.send_signal(signal.SIGTERM)
            assert process.wait(10) == 0
        finally:
            if process.poll() is None:
                process.kill()
            process.stdout.close()
            process.stderr.close()
