"""Quiet and helpful: one warning per outage, suggestions for typos, and where a value came from."""

from __future__ import annotations

import json
import logging
import signal
import subprocess

import pytest

from sentinel import Sentinel
from sentinel.errors import ServiceNotFound, ZooKeeperUnavailable
from sentinel.testing.helpers import TcpProxy, wait_until
from tests.conftest import SENTINEL

pytestmark = pytest.mark.integration


def _kazoo(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("kazoo") and r.levelno == level]


def _count(caplog: pytest.LogCaptureFixture, level: int, text: str) -> int:
    return sum(text in r.getMessage() for r in _kazoo(caplog, level))


def test_an_unreachable_zookeeper_is_one_warning_not_one_per_retry(zookeeper, caplog):
    # A server that takes each connection and drops it (a refused one fails the start at
    # once, without retries: tests/integration/test_connection.py).
    host, port = zookeeper.connect_string.split(":")
    proxy = TcpProxy(host, int(port))
    proxy.cut()
    try:
        with caplog.at_level(logging.DEBUG, logger="kazoo"):
            client = Sentinel(proxy.address, "lonely", connect_timeout=3)
            with pytest.raises(ZooKeeperUnavailable, match=proxy.address):
                client.start()
    finally:
        proxy.close()
    warnings = _kazoo(caplog, logging.WARNING)
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "Connection dropped" in warnings[0].getMessage()
    assert "retrying" in warnings[0].getMessage()
    # The retries happened, and are still there for whoever asks for DEBUG.
    retries = [r for r in _kazoo(caplog, logging.DEBUG) if "Connection dropped" in r.getMessage()]
    assert len(retries) >= 2


def test_each_outage_of_a_session_is_one_warning(zookeeper, namespace, caplog):
    host, port = zookeeper.connect_string.split(":")
    proxy = TcpProxy(host, int(port))
    try:
        with Sentinel(proxy.address, "flaky", namespace, session_timeout=30) as client:
            with caplog.at_level(logging.DEBUG, logger="kazoo"):
                for outage in (1, 2):
                    retries = _count(caplog, logging.DEBUG, "Connection dropped")
                    proxy.cut()
                    # Several refused attempts, each logged by kazoo, make one outage.
                    assert wait_until(
                        lambda n=retries: (
                            _count(caplog, logging.DEBUG, "Connection dropped") >= n + 2
                        ),
                        timeout=20,
                    )
                    proxy.restore()
                    assert wait_until(lambda: client.connection_state == "connected", timeout=20)
                    assert wait_until(
                        lambda n=outage: _count(caplog, logging.INFO, "failed attempt") == n
                    )
            assert len(_kazoo(caplog, logging.WARNING)) == 2
    finally:
        proxy.close()


def test_a_service_not_found_suggests_the_closest_names(make_client):
    publisher, reader = make_client("publisher"), make_client("reader")
    publisher.register("orders-db", "p1", "10.0.0.1", 5432)
    publisher.register("billing", "main", "10.0.0.2", 80)
    with pytest.raises(ServiceNotFound, match=r"did you mean 'orders-db'\?") as raised:
        reader.get_service("order-db")
    assert raised.value.suggestions == ("orders-db",)
    assert raised.value.service == "order-db"
    with pytest.raises(ServiceNotFound) as unlike:
        reader.get_service("zzzzzz")
    assert unlike.value.suggestions == () and "did you mean" not in str(unlike.value)
    with pytest.raises(ServiceNotFound, match="did you mean 'billing'"):
        reader.read_service("biling")


def test_watch_events_shows_only_the_kinds_asked_for(zookeeper, namespace, make_client):
    publisher = make_client("publisher")
    publisher.shard_maps.ensure("tenants", "directory", partitions=["p1", "p2"])
    publisher.ensure_service("orders-db", "postgresql", shard_policy="tenants")
    first = publisher.register("orders-db", "p1", "10.0.0.1", 5432, scheme="postgresql")
    publisher.shard_maps.assign("tenants", "acme", "p1")
    zk_options = ["--zk", zookeeper.connect_string, "--namespace", namespace]
    process = subprocess.Popen(
        [SENTINEL, "watch", "--events", "shard,connection", "--json", *zk_options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "watching every service" in process.stderr.readline()
        # Metrics and instances change first; only the shard move may be printed.
        publisher.update_metrics(first, {"replication_lag": 3})
        publisher.register("orders-db", "p2", "10.0.0.2", 5432, scheme="postgresql")
        publisher.shard_maps.assign("tenants", "acme", "p2")
        moved = json.loads(process.stdout.readline())
        assert moved["event"] == "ShardKeysChanged"
        assert moved["changes"] == {"acme": ["p1", "p2"]}
        process.send_signal(signal.SIGINT)
        assert process.wait(10) == 0
        rest = [json.loads(line)["event"] for line in process.stdout.read().splitlines()]
        assert set(rest) <= {"ShardKeysChanged", "ConnectionChanged"}, rest
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
        process.stderr.close()


def test_watch_refuses_an_unknown_event_kind_and_lists_the_kinds(cli_in_process):
    result = cli_in_process("watch", "--events", "shard,metric")
    assert result.returncode == 2
    assert "unknown event kind 'metric'" in result.stderr
    assert "instances, metrics, shard, spec, service, auth, connection" in result.stderr
