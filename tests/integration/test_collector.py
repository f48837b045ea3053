"""The metric collector against a real ZooKeeper, scraping real Prometheus endpoints.

Each replica's exposition endpoint is ``prometheus_client``'s own HTTP server with a registry
of its own, so the collector scrapes exactly what a real exporter would serve.
"""

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Gauge, start_http_server
from sentinel.policies import MinLag

from sentinel.collector import MetricCollector, parse_config
from sentinel.errors import NoInstanceAvailable
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import free_ports
from tests.conftest import sentinel_in_process
from tests.integration.exposition import scrape

pytestmark = pytest.mark.integration

SENTINEL = str(Path(sys.executable).with_name("sentinel"))


class Exporter:
    """One instance's /metrics: a ``pg_lag_seconds`` gauge served over HTTP."""

    def __init__(self, lag=0.0):
        self.registry = CollectorRegistry()
        self.lag = Gauge("pg_lag_seconds", "replication lag", registry=self.registry)
        self.lag.set(lag)
        self.server, self.thread = start_http_server(0, "127.0.0.1", registry=self.registry)
        self.port = self.server.server_port

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporters():
    made = []

    def make(lag=0.0):
        made.append(Exporter(lag))
        return made[-1]

    yield make
    for exporter in made:
        exporter.close()


def collecting(service="db", interval="500ms", timeout="500ms", jitter="50ms", cluster="test"):
    return parse_config(
        {
            "cluster": cluster,
            "services": [
                {
                    "service": service,
                    "interval": interval,
                    "timeout": timeout,
                    "jitter": jitter,
                    "source": {
                        "type": "prometheus",
                        "metrics": {"replication_lag": "pg_lag_seconds"},
                    },
                }
            ],
        }
    )


def published(raw_zk, service, name):
    """The metrics node of one instance, decoded (None if never published)."""
    node = raw_zk.exists(f"/metrics/{service}/{name}")
    if node is None:
        return None
    return json.loads(raw_zk.get(f"/metrics/{service}/{name}")[0])


def error_count(reason, service="db"):
    value = REGISTRY.get_sample_value(
        "sentinel_collector_scrape_errors_total",
        {"service": service, "source": "prometheus", "reason": reason},
    )
    return value or 0.0


def test_published_lag_steers_min_lag(make_client, exporters, raw_zk):
    publisher, app = make_client("publisher"), make_client("app")
    publisher.ensure_service("db", scheme="postgresql")
    replicas = {label: exporters(lag) for label, lag in (("r1", 5.0), ("r2", 1.0), ("r3", 3.0))}
    for label, exporter in replicas.items():
        publisher.register("db", "p1", "127.0.0.1", exporter.port, label=label)
    policy = MinLag(cutoff=30, max_age=5)

    def picked():
        return app.get_service("db", policy=policy).label

    with MetricCollector(make_client("collector-1"), collecting()):
        assert wait_until(lambda: picked() == "r2", 15, ignore=(NoInstanceAvailable,))
        replicas["r2"].lag.set(9.0)
        assert wait_until(lambda: picked() == "r3", 15)
        replicas["r3"].lag.set(40.0)  # over the cut-off: r1 is the best left
        assert wait_until(lambda: picked() == "r1", 15)
    # The values went through /metrics in ZooKeeper, not a side channel.
    lags = {label: published(raw_zk, "db", f"p1:{label}")["metrics"] for label in replicas}
    assert lags == {label: {"replication_lag": e.lag._value.get()} for label, e in replicas.items()}


def test_hung_and_dead_endpoints_stall_nobody_and_age(make_client, exporters, raw_zk):
    publisher = make_client("publisher")
    publisher.ensure_service("db")
    healthy, doomed = exporters(1.0), exporters(2.0)
    # A listener that never accepts: connections complete in the kernel, requests never answer.
    hung = socket.create_server(("127.0.0.1", 0), backlog=16)
    try:
        publisher.register("db", "p1", "127.0.0.1", healthy.port, label="healthy")
        publisher.register("db", "p1", "127.0.0.1", doomed.port, label="doomed")
        publisher.register("db", "p1", "127.0.0.1", hung.getsockname()[1], label="hung")
        timeouts = error_count("timeout")
        errors = error_count("error")
        config = collecting(interval="400ms", timeout="300ms", jitter="0ms")
        with MetricCollector(make_client("collector-1"), config):
            assert wait_until(lambda: published(raw_zk, "db", "p1:doomed"), 10)
            doomed.close()  # from now on its collections fail: connection refused
            # One collection at a time per instance: once one failed, none is left in flight.
            assert wait_until(lambda: error_count("error") > errors, 10)
            last_good = published(raw_zk, "db", "p1:doomed")["measured_at"]
            seen = set()

            def healthy_advanced():
                seen.add(published(raw_zk, "db", "p1:healthy")["measured_at"])
                return len(seen) >= 6 and error_count("timeout") >= timeouts + 3

            # Six fresh values in a row while the hung instance times out every round.
            assert wait_until(healthy_advanced, 20)
            assert published(raw_zk, "db", "p1:hung") is None
            # The dead instance's last good value stays as measured: policies see it age.
            assert published(raw_zk, "db", "p1:doomed")["measured_at"] == last_good
            assert max(seen) > last_good
    finally:
        hung.close()


def run_collector(config_path, zookeeper, namespace, port, client_id):
    return subprocess.Popen(
        [
            *(SENTINEL, "collector", "run", "--config", str(config_path), "--json"),
            *("--zk", zookeeper.connect_string, "--namespace", namespace),
            *("--session-timeout", "3", "--metrics-port", str(port), "--client-id", client_id),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_collectors_split_the_work_and_survive_a_sigkill(
    make_client, exporters, raw_zk, zookeeper, namespace, tmp_path
):
    publisher = make_client("publisher")
    publisher.ensure_service("db")
    exporter = exporters(0.5)  # every instance is scraped at the same endpoint
    names = [f"p{i % 2}:r{i}" for i in range(10)]
    for name in names:
        partition, label = name.split(":")
        publisher.register("db", partition, "127.0.0.1", exporter.port, label=label)
    config_path = tmp_path / "collector.toml"
    config_path.write_text(
        'cluster = "pair"\n[[services]]\nservice = "db"\ninterval = "500ms"\njitter = "50ms"\n'
        'timeout = "500ms"\n[services.source]\ntype = "prometheus"\n'
        'metrics = { replication_lag = "pg_lag_seconds" }\n'
    )
    port = free_ports(1)[0]
    other = run_collector(config_path, zookeeper, namespace, port, "collector-b")
    try:
        with MetricCollector(make_client("collector-a"), collecting(cluster="pair")) as local:
            assert wait_until(lambda: len(local.members) == 2, 30)
            # Rendezvous gives each member a share.
            assert wait_until(lambda: 0 < len(local.owned) < len(names), 15)
            mine = {name for _, name in local.owned}

            # The sidecar collects the rest: its own /metrics says so, over HTTP, parsed by
            # prometheus_client.
            scrapes = (
                "sentinel_collector_scrapes_total",
                (("service", "db"), ("source", "prometheus")),
            )

            def sidecar_collecting():
                samples = scrape(port)
                return (
                    samples.get(("sentinel_collector_members", ())) == 2
                    and samples.get(("sentinel_collector_instances", (("service", "db"),)))
                    == len(names) - len(mine)
                    and samples.get(scrapes, 0) >= len(names) - len(mine)
                )

            assert wait_until(sidecar_collecting, 15, ignore=(OSError,))
            assert wait_until(lambda: all(published(raw_zk, "db", n) for n in names), 15)

            other.send_signal(signal.SIGKILL)
            other.wait(10)
            killed_at = time.time()
            # Within the session timeout (3 s) plus scheduling, this member takes them all.
            assert wait_until(lambda: len(local.owned) == len(names), 20)
            assert {name for _, name in local.owned} >= mine  # its own share never moved
            assert wait_until(
                lambda: all(
                    (published(raw_zk, "db", n) or {}).get("measured_at", 0) > killed_at
                    for n in names
                ),
                15,
            )
    finally:
        if other.poll() is None:
            other.kill()
        other.wait(10)
        other.stdout.close()
        other.stderr.close()


@pytest.mark.parametrize(
    ("service", "message"),
    [
        ('service = "db"\n[services.source]\ntype = "snmp"\n', "unknown source 'snmp'"),
        ('[services.source]\ntype = "command"\ncommand = "true"\n', "missing required field"),
        (
            'service = "db"\ninterval = "soon"\n[services.source]\ntype = "command"\n'
            'command = "true"\n',
            "interval: 'soon' is not a positive duration",
        ),
    ],
)
def test_bad_configuration_exits_2_and_publishes_nothing(
    service, message, zookeeper, namespace, raw_zk, tmp_path
):
    config_path = tmp_path / "collector.toml"
    config_path.write_text("[[services]]\n" + service)
    connection = ["--zk", zookeeper.connect_string, "--namespace", namespace]
    result = sentinel_in_process("collector", "run", "--config", str(config_path), *connection)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and str(config_path) in result.stderr
    assert raw_zk.get_children("/") == []  # not even the namespace's sections


def test_check_validates_without_connecting(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(
        "services:\n  - service: relay\n    interval: 2s\n"
        "    source: {type: command, command: [queue-depth]}\n"
    )
    bad.write_text("services:\n  - service: relay\n    source: {type: command}\n")
    checked = sentinel_in_process("collector", "check", "--config", str(good), "--json")
    assert checked.returncode == 0, checked.stderr
    (service,) = json.loads(checked.stdout)["services"]
    assert (service["service"], service["source"], service["interval"]) == ("relay", "command", 2)
    refused = sentinel_in_process("collector", "check", "--config", str(bad))
    assert refused.returncode == 2
    assert "services[0] (relay).source: missing required field 'command'" in refused.stderr


def test_a_second_collector_with_another_configuration_takes_no_work(
    make_client, exporters, raw_zk
):
    """A test collector started with a broken configuration in the fleet's cluster: it is
    refused, owns nothing, and the fleet's member keeps collecting every instance."""
    publisher = make_client("publisher")
    publisher.ensure_service("db")
    exporter = exporters(0.5)
    names = [f"p1:r{i}" for i in range(6)]
    for name in names:
        publisher.register("db", "p1", "127.0.0.1", exporter.port, label=name[3:])
    broken = parse_config(
        {
            "cluster": "fleet",
            "services": [{"service": "db", "source": {"type": "command", "command": "false"}}],
        }
    )
    fleet_config = collecting(cluster="fleet")
    assert broken.digest != fleet_config.digest
    reports: list[tuple[str, dict]] = []
    with MetricCollector(make_client("collector-fleet"), fleet_config) as fleet:
        assert wait_until(lambda: len(fleet.owned) == len(names), 15)
        with MetricCollector(
            make_client("collector-test"), broken, lambda *report: reports.append(report)
        ) as test:
            assert wait_until(lambda: len(fleet.members) == 2 and len(test.members) == 2, 15)
            assert wait_until(lambda: any(kind == "refused" for kind, _ in reports), 15)
            refused = next(details for kind, details in reports if kind == "refused")
            assert refused == {
                "cluster": "fleet",
                "config": broken.digest,
                "cluster_config": fleet_config.digest,
                "members": 1,
            }
            assert test.owned == frozenset() and test.peers == (fleet.member,)
            assert fleet.peers == (fleet.member,)
            assert len(fleet.owned) == len(names)  # nothing moved to the refused member
            since = time.time()
            # Publishing went on for every instance while the test collector was up.
            assert wait_until(
                # a node not yet published (None) is not yet after ``since``
                lambda: all(
                    (published(raw_zk, "db", n) or {}).get("measured_at", 0) > since for n in names
                ),
                15,
            )
        assert not any(kind == "assigned" and d["members"] > 1 for kind, d in reports)


def test_members_with_the_same_settings_agree_whatever_their_workers():
    one = parse_config({"cluster": "c", "workers": 4, "services": [_COMMAND_SERVICE]})
    other = parse_config({"services": [_COMMAND_SERVICE], "cluster": "c", "workers": 32})
    moved = parse_config({"cluster": "d", "services": [_COMMAND_SERVICE]})
    assert one.digest == other.digest != moved.digest


_COMMAND_SERVICE = {"service": "db", "source": {"type": "command", "command": "true"}}


def test_a_member_registration_with_a_garbage_digest_moves_no_work(make_client, exporters):
    """Anyone who may register in the members' service can write any ``config`` property:
    a list (unhashable), a mapping, a number. Such members count towards no configuration:
    the cluster keeps its configuration and its work, whatever their number."""
    publisher = make_client("publisher")
    publisher.ensure_service("db")
    exporter = exporters(0.5)
    for i in range(4):
        publisher.register("db", "p1", "127.0.0.1", exporter.port, label=f"r{i}")
    config = collecting(cluster="fleet")
    with MetricCollector(make_client("collector-fleet"), config) as fleet:
        assert wait_until(lambda: len(fleet.owned) == 4, 15)
        for n, garbage in enumerate((["x"], {"a": 1}, 7)):
            publisher.register(
                "metric-collector-fleet",
                "fleet",
                "127.0.0.1",
                1000 + n,
                label=f"liar-{n}",
                properties={"config": garbage},
            )
        assert wait_until(lambda: len(fleet.members) == 4, 15)
        fleet._changed()  # reassign now, as the membership event does
        assert wait_until(lambda: fleet.peers == (fleet.member,), 15)
        assert len(fleet.owned) == 4 and fleet._thread.is_alive()
