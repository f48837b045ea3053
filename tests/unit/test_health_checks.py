"""Readiness checks without ZooKeeper: validation, damping, the probes against hostile
servers on loopback, and the scheduler's bounds (hung and raising checks)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import socket
import threading
import time
from collections.abc import Callable

import pytest

from sentinel import telemetry
from sentinel.cli.watch import describe
from sentinel.collector import parse_config
from sentinel.collector.health import HealthSource
from sentinel.errors import ValidationError
from sentinel.events import InstancesChanged
from sentinel.health import HealthCheck
from sentinel.health.checks import MAX_STATUS_LINE, CheckFailed
from sentinel.health.damping import Damper
from sentinel.health.readiness import Readiness
from sentinel.health.scheduler import CheckScheduler, ScheduledCheck
from sentinel.health.sources import health_of
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.records import InstanceRecord
from sentinel.testing.helpers import wait_until
from sentinel.testing.httpserver import raw_server


@pytest.mark.parametrize(
    "build",
    [
        lambda: HealthCheck.http("/ready", interval=0),
        lambda: HealthCheck.http("/ready", interval=-1),
        lambda: HealthCheck.http("/ready", interval=math.nan),
        lambda: HealthCheck.http("/ready", interval=0.01),
        lambda: HealthCheck.http("/ready", interval=1, timeout=2),
        lambda: HealthCheck.http("/ready", timeout=0),
        lambda: HealthCheck.http("/ready", failures_before_down=0),
        lambda: HealthCheck.http("/ready", successes_before_up=True),
        lambda: HealthCheck.http("/ready", successes_before_up=1.5),
        lambda: HealthCheck.http("/ready", failures_before_down=101),
        lambda: HealthCheck.http(""),
        lambda: HealthCheck.http("ready"),
        lambda: HealthCheck.http("ftp://host/ready"),
        lambda: HealthCheck.http("http:///ready"),
        lambda: HealthCheck.http("http://host:99999/ready"),
        lambda: HealthCheck.http("http://admin:s3cret@host/ready"),
        lambda: HealthCheck.http("/ready HTTP/1.1\r\nX-Injected: 1"),
        lambda: HealthCheck.http("/r\u00e9ady"),
        lambda: HealthCheck.http("/" + "a" * 3000),
        lambda: HealthCheck.http(b"/ready"),
        lambda: HealthCheck.tcp(0),
        lambda: HealthCheck.tcp(65536),
        lambda: HealthCheck.tcp("5432"),
        lambda: HealthCheck.tcp(5432, host="bad host"),
        lambda: HealthCheck.call("not callable"),
        lambda: HealthCheck("script"),
        lambda: HealthCheck("grpc"),
        lambda: HealthCheck.grpc(port=0),
        lambda: HealthCheck.grpc(host="bad host"),
        lambda: HealthCheck.grpc(b"orders.Orders"),
        lambda: HealthCheck.grpc("orders\nOrders"),
        lambda: HealthCheck.grpc("o" * 300),
    ],
)
def test_bad_parameters_are_a_validation_error(build: Callable[[], HealthCheck]) -> None:
    with pytest.raises(ValidationError):
        build()


@pytest.mark.parametrize(
    "url", ["http://admin:s3cret@host/ready", "ftp://admin:s3cret@host", "http://s3cret@b?x"]
)
def test_a_url_with_credentials_is_refused_without_repeating_them(url: str) -> None:
    with pytest.raises(ValidationError) as caught:
        HealthCheck.http(url)
    assert "s3cret" not in str(caught.value) and "credentials" in str(caught.value)
    assert HealthCheck.http("/users/@me/ready").url == "/users/@me/ready"  # a path may hold @
    assert HealthCheck.http("http://host/ready?by=a@b").url == "http://host/ready?by=a@b"


def test_defaults_and_sources() -> None:
    check = HealthCheck.http()
    assert (check.interval, check.timeout) == (5.0, 2.0)
    assert (check.failures_before_down, check.successes_before_up) == (3, 2)
    assert check.source == "check:http"
    assert HealthCheck.tcp().source == "check:tcp"
    assert HealthCheck.call(lambda: True).source == "check:call"
    assert HealthCheck.grpc().source == "check:grpc"


def _changes(damper: Damper, results: list[bool]) -> list[tuple[int, str]]:
    return [(i, c) for i, r in enumerate(results) if (c := damper.observe(r)) is not None]


def test_first_result_decides_then_thresholds_in_both_directions() -> None:
    damper = Damper(failures_before_down=3, successes_before_up=2)
    results = [True, False, False, True, False, False, False, True, False, True, True]
    assert _changes(damper, results) == [(0, "up"), (6, "down"), (10, "up")]
    assert _changes(Damper(3, 2), [False]) == [(0, "down")]


def test_a_noisy_check_does_not_flap() -> None:
    """A seeded check failing 20 % of the time at random: undamped it would change state at
    every other result or so; damped (3 down, 2 up) it changes a handful of times, and never
    more often than once per two results (the bound the thresholds give)."""
    rng = random.Random(41)
    results = [rng.random() >= 0.2 for _ in range(1000)]
    undamped = _changes(Damper(1, 1), results)
    damped = _changes(Damper(3, 2), results)
    assert len(undamped) > 250
    assert len(damped) <= 20
    assert all(b - a >= 2 for (a, _), (b, _) in itertools.pairwise(damped))


# --- probes against hostile servers ---------------------------------------------------------


def _probe(url: str, timeout: float = 0.5) -> tuple[Exception | None, float]:
    probe = HealthCheck.http(url, interval=timeout, timeout=timeout).probe("127.0.0.1", 1)
    start = time.monotonic()
    try:
        probe()
    except Exception as exc:
        return exc, time.monotonic() - start
    return None, time.monotonic() - start


def _answer(reply: bytes) -> Callable[[socket.socket], None]:
    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(4096)
            conn.sendall(reply)

    return serve


def test_http_probe_passes_on_2xx_and_fails_on_others() -> None:
    with raw_server(_answer(b"HTTP/1.1 204 No Content\r\n\r\n")) as port:
        assert _probe(f"http://127.0.0.1:{port}/ready")[0] is None
    with raw_server(_answer(b"HTTP/1.1 503 Service Unavailable\r\n\r\n")) as port:
        failure, _ = _probe(f"http://127.0.0.1:{port}/ready")
        assert isinstance(failure, CheckFailed) and "503" in str(failure)
    with raw_server(_answer(b"HTTP/1.1 302 Found\r\nLocation: /login\r\n\r\n")) as port:
        assert isinstance(_probe(f"http://127.0.0.1:{port}/ready")[0], CheckFailed)


def test_http_probe_refuses_garbage() -> None:
    with raw_server(_answer(b"\x00\xffSSH-2.0-OpenSSH\r\n")) as port:
        failure, _ = _probe(f"http://127.0.0.1:{port}/")
        assert isinstance(failure, CheckFailed) and "not an HTTP status line" in str(failure)
    with raw_server(_answer(b"")) as port:
        assert isinstance(_probe(f"http://127.0.0.1:{port}/")[0], CheckFailed)
    with raw_server(_answer(b"H" * (MAX_STATUS_LINE * 4))) as port:
        failure, _ = _probe(f"http://127.0.0.1:{port}/")
        assert isinstance(failure, CheckFailed) and "no status line" in str(failure)


def test_http_probe_is_bounded_by_its_timeout_against_a_silent_or_dripping_server() -> None:
    def silent(conn: socket.socket) -> None:
        time.sleep(5)  # holds the connection open and says nothing
        conn.close()

    def drip(conn: socket.socket) -> None:
        with conn:
            try:
                for _ in range(50):  # one byte every 0.1 s, never a line
                    conn.sendall(b"H")
                    time.sleep(0.1)
            except OSError:
                return

    for serve in (silent, drip):
        with raw_server(serve) as port:
            failure, took = _probe(f"http://127.0.0.1:{port}/", timeout=0.5)
            assert failure is not None
            assert took < 0.5 + 0.5, f"{serve.__name__}: the probe took {took:.2f} s"


def test_http_probe_reads_the_status_line_of_a_5_gb_body_and_nothing_more() -> None:
    sent = [0]
    refused = threading.Event()

    def huge(conn: socket.socket) -> None:
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5000000000\r\n\r\n")
            chunk = b"x" * 65536
            try:
                while sent[0] < 5_000_000_000:
                    conn.sendall(chunk)
                    sent[0] += len(chunk)
            except OSError:
                refused.set()  # the probe closed the connection

    with raw_server(huge) as port:
        failure, took = _probe(f"http://127.0.0.1:{port}/", timeout=2)
        assert failure is None
        assert took < 2
        assert refused.wait(10)
        # What the server pushed before the close refused it: socket buffers, not the body.
        assert sent[0] < 64 * 2**20, f"{sent[0]} bytes were sent"


def test_tcp_probe() -> None:
    with raw_server(lambda conn: conn.close()) as port:
        HealthCheck.tcp(port).probe("127.0.0.1", 1)()
        HealthCheck.tcp().probe("127.0.0.1", port)()
    with pytest.raises(CheckFailed):
        HealthCheck.tcp(port, timeout=0.5, interval=0.5).probe("127.0.0.1", 1)()


def test_call_probe_passes_on_true_or_none_only() -> None:
    HealthCheck.call(lambda: True).probe("h", 1)()
    HealthCheck.call(lambda: None).probe("h", 1)()
    for value in (False, 0, "ok", 1):
        with pytest.raises(CheckFailed):
            HealthCheck.call(lambda value=value: value).probe("h", 1)()


# --- the scheduler ----------------------------------------------------------------------------


class _Results:
    def __init__(self) -> None:
        self.items: list[tuple[bool, str]] = []

    def __call__(self, passed: bool, detail: str) -> None:
        self.items.append((passed, detail))


def test_raising_and_hanging_checks_are_failures_and_do_not_stop_the_others() -> None:
    scheduler = CheckScheduler(workers=2)
    release = threading.Event()
    calls = {"hang": 0}

    def hang() -> None:
        calls["hang"] += 1
        release.wait(30)

    def boom() -> None:
        raise RuntimeError("the database is on fire")

    raising, hanging, healthy = _Results(), _Results(), _Results()
    scheduler.add(ScheduledCheck(boom, 0.05, 0.05, raising))
    scheduler.add(ScheduledCheck(hang, 0.05, 0.05, hanging))
    # The healthy check's deadline is long: a run past its deadline is a failure (rightly), and
    # on a loaded machine 50 ms can pass before a worker takes a run that returns at once;
    # what is checked here is that the others' raising and hanging never cost it a result.
    scheduler.add(ScheduledCheck(lambda: None, 0.05, 5.0, healthy))
    try:
        assert wait_until(lambda: len(hanging.items) >= 5 and len(healthy.items) >= 5)
        assert all(not passed for passed, _ in raising.items)
        assert "RuntimeError: the database is on fire" in raising.items[0][1]
        assert all(not passed for passed, _ in hanging.items)
        assert "no result within its timeout" in hanging.items[0][1]
        assert "has still not returned" in hanging.items[-1][1]
        assert calls["hang"] == 1  # never started again while hung
        assert all(passed for passed, _ in healthy.items)  # its worker was replaced
        assert scheduler.threads <= 3  # two workers and the replacement of the hung one
        release.set()
        count = calls["hang"]
        assert wait_until(lambda: calls["hang"] > count)  # returned, so it runs again
    finally:
        release.set()
        scheduler.close()


def test_many_checks_share_a_few_threads() -> None:
    scheduler = CheckScheduler(workers=4)
    results = [_Results() for _ in range(200)]
    try:
        for report in results:
            scheduler.add(ScheduledCheck(lambda: None, 0.1, 0.1, report))
        assert wait_until(lambda: all(len(r.items) >= 3 for r in results))
        assert scheduler.threads <= 4
        assert threading.active_count() < 50
    finally:
        scheduler.close()


# --- the collector's health source -----------------------------------------------------------


def _collection(source: dict) -> dict:
    return {"services": [{"service": "web", "interval": "1s", "source": source}]}


def test_the_collector_health_source_is_configured_like_the_publisher_check() -> None:
    config = parse_config(_collection({"type": "health", "http": "/ready"}))
    source = config.services[0].source
    assert source.check == HealthCheck.http("/ready")
    config = parse_config(_collection({"type": "health", "tcp": 6432, "failures_before_down": 5}))
    assert config.services[0].source.check == HealthCheck.tcp(6432, failures_before_down=5)
    assert parse_config(_collection({"type": "health", "tcp": True})).services[0].source.check == (
        HealthCheck.tcp()
    )
    config = parse_config(_collection({"type": "health", "grpc": "orders.Orders"}))
    assert config.services[0].source.check == HealthCheck.grpc("orders.Orders")
    config = parse_config(_collection({"type": "health", "grpc": True}))
    assert config.services[0].source.check == HealthCheck.grpc()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"type": "health"}, "give exactly one of http"),
        ({"type": "health", "http": "/r", "tcp": True}, "give exactly one of http"),
        ({"type": "health", "http": "ftp://x/r"}, "source.http: url 'ftp://x/r'"),
        ({"type": "health", "tcp": "5432"}, "source.tcp: port must be an integer"),
        ({"type": "health", "tcp": False}, "source.tcp: false checks nothing"),
        ({"type": "health", "tcp": True, "grpc": True}, "give exactly one of http"),
        ({"type": "health", "grpc": False}, "source.grpc: a gRPC health service name"),
        ({"type": "health", "grpc": 5}, "source.grpc: a gRPC health service name"),
        ({"type": "health", "http": "/r", "successes_before_up": 0}, "successes_before_up"),
        ({"type": "health", "http": "/r", "interval": "1s"}, "unknown field(s) 'interval'"),
    ],
)
def test_bad_health_source_configurations(source: dict, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_config(_collection(source), "c.toml")
    assert message in str(caught.value)


def test_the_collector_source_damps_each_instance_apart() -> None:
    with raw_server(lambda conn: conn.close()) as port:
        source = HealthSource(HealthCheck.tcp(failures_before_down=2))
        up = Endpoint.from_record(InstanceRecord("web", "p1", "a", "127.0.0.1", port))
        down = Endpoint.from_record(InstanceRecord("web", "p1", "b", "127.0.0.1", 1))
        assert source.collect(up, 0.5) == {"health": 1}
        assert source.collect(down, 0.5) == {"health": 0}  # the first result decides
        assert source.collect(up, 0.5) == {"health": 1}
    # The listener is closed: one failure is not enough to go down, two are.
    assert source.collect(up, 0.5) == {"health": 1}
    assert source.collect(up, 0.5) == {"health": 0}


# --- what operators see ------------------------------------------------------------------------


def test_watch_lines_name_the_health_source_unless_it_is_the_registry() -> None:
    def endpoint(label: str, status: str = "up", health: str | None = None) -> Endpoint:
        record = InstanceRecord("web", "p1", label, "10.0.0.1", 80, status=status, health=health)
        return Endpoint.from_record(record)

    plain, checked = endpoint("a"), endpoint("b", "starting", "check:http")
    watched = dataclasses.replace(endpoint("c"), metrics={"health": 0})
    event = InstancesChanged("web", added=(plain, checked, watched))
    assert [text for _, text in describe(event)] == [
        "+ p1:a http://10.0.0.1:80 (up)",
        "+ p1:b http://10.0.0.1:80 (starting, check:http)",
        "+ p1:c http://10.0.0.1:80 (up, collector down)",
    ]
    down = dataclasses.replace(checked, status="down")
    assert describe(InstancesChanged("web", updated=((checked, down),))) == [
        ("web", "~ p1:b status starting->down")
    ]


def test_health_of_prefers_the_publisher_check_then_the_collector_then_the_registry() -> None:
    assert health_of("check:tcp", "down", {"health": 1}) == ("check:tcp", "down")
    assert health_of(None, "up", {"health": 0}) == ("collector", "down")
    assert health_of(None, "up", {"health": 1}) == ("collector", "up")
    assert health_of(None, "draining", {"health": 1.0}) == ("registry", "draining")
    assert health_of(None, "up", {"health": "down"}) == ("registry", "up")


def test_a_health_source_from_the_registry_is_bounded() -> None:
    with pytest.raises(ValidationError):
        InstanceRecord("web", "p1", "a", "10.0.0.1", 80, health="x" * 33)
    with pytest.raises(ValidationError):
        InstanceRecord("web", "p1", "a", "10.0.0.1", 80, health={"nested": "object"})
    newer = InstanceRecord("web", "p1", "a", "10.0.0.1", 80, health="check:grpc")
    path = "/services/web/p1:a"
    assert InstanceRecord.from_bytes("web", "p1:a", path, newer.to_bytes(path)) == newer
    plain = InstanceRecord("web", "p1", "a", "10.0.0.1", 80)
    assert b"health" not in plain.to_bytes(path)  # unchanged for instances without a check


def test_grpc_probe_asks_the_standard_health_service() -> None:
    from sentinel.testing.grpcserver import SERVICE, LoopbackGRPCServer

    with LoopbackGRPCServer("a") as server:
        HealthCheck.grpc().probe("127.0.0.1", server.port)()  # the server as a whole
        HealthCheck.grpc(SERVICE, port=server.port).probe("127.0.0.1", 1)()
        HealthCheck.grpc(host="127.0.0.1").probe("::1", server.port)()
        with pytest.raises(CheckFailed, match=f"'no.Such' at 127.0.0.1:{server.port}: NOT_FOUND$"):
            HealthCheck.grpc("no.Such").probe("127.0.0.1", server.port)()
        server.set_serving(False)
        with pytest.raises(CheckFailed, match=f"'{SERVICE}' at 127.0.0.1:{server.port}: NOT_SERV"):
            HealthCheck.grpc(SERVICE).probe("127.0.0.1", server.port)()
        port = server.port
    with pytest.raises(CheckFailed, match="UNAVAILABLE"):
        HealthCheck.grpc().probe("127.0.0.1", port)()


def test_grpc_probe_is_bounded_by_its_timeout_against_a_silent_server() -> None:
    silent = threading.Event()
    with raw_server(lambda conn: silent.wait(10)) as port:
        started = time.monotonic()
        with pytest.raises(CheckFailed, match="DEADLINE_EXCEEDED"):
            HealthCheck.grpc(timeout=0.5, interval=1).probe("127.0.0.1", port)()
        took = time.monotonic() - started
        silent.set()
    assert took < 2, f"{took:.2f} s"


# --- the checks' series --------------------------------------------------------------------


def _series(metric) -> set[tuple[str, ...]]:
    """The label sets ``metric`` exports now."""
    return {
        tuple(sample.labels[name] for name in ("service", "source"))
        for family in metric.collect()
        for sample in family.samples
    }


def test_a_services_health_series_go_with_its_last_check() -> None:
    """A process checking instances of ever-new services kept two series of each, for good
    (issue 53's soak): they go with the service's last check, not before."""
    readiness = Readiness(lambda path: "up", lambda path, status, result: None)
    failing = HealthCheck.call(lambda: False, interval=0.05, timeout=0.04, failures_before_down=1)
    key = ("series-gone", "check:call")
    try:
        readiness.follow("/a", "series-gone", "h", 1, failing)
        readiness.follow("/b", "series-gone", "h", 2, failing)
        assert wait_until(lambda: key in _series(telemetry.HEALTH_DOWN)) is not None
        assert key in _series(telemetry.HEALTH_CHANGES)

        readiness.forget("/a")  # another check of the service goes on: its series stay
        assert key in _series(telemetry.HEALTH_DOWN) and key in _series(telemetry.HEALTH_CHANGES)
        readiness.forget("/b")
        assert key not in _series(telemetry.HEALTH_DOWN)
        assert key not in _series(telemetry.HEALTH_CHANGES)
    finally:
        readiness.close()
