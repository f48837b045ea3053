"""Curator's x-discovery format, as real Java Curator writes it: what Python reads of it equals
what Curator's own ServiceProvider returns (tests/peers/CuratorRegistry.java, compiled here
against Debian's libcurator-discovery-java)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from benchmarks.common import compile_peer
from benchmarks.compare import INSTALL, JARS
from sentinel.registry.curator import CURATOR_PARTITION, read_instances

pytestmark = pytest.mark.integration

PEER = Path(__file__).resolve().parents[1] / "peers" / "CuratorRegistry.java"


@pytest.fixture(scope="module")
def curator_java(tmp_path_factory) -> list[str]:
    java, why_not = compile_peer(
        tmp_path_factory.mktemp("curator"), PEER, JARS, "CuratorRegistry", INSTALL
    )
    if java is None:
        pytest.skip(f"Java Curator cannot run here ({why_not})")
    return java


@pytest.fixture
def java_registry(curator_java, zookeeper) -> Iterator[tuple[dict, KazooClient]]:
    """The Java peer's registry under /jvm-<n>, live while the test runs; what Curator's
    ServiceProvider returned, and a plain kazoo client to read it with."""
    base = f"/jvm-{uuid.uuid4().hex[:8]}"
    peer = subprocess.Popen(
        [*curator_java, zookeeper.connect_string, base],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    zk = KazooClient(zookeeper.connect_string)
    try:
        provider = json.loads(peer.stdout.readline())
        zk.start(timeout=10)
        yield {"base": base, **provider}, zk
    finally:
        zk.stop()
        zk.close()
        peer.communicate("\n", timeout=60)


def test_python_reads_what_curators_service_provider_returns(java_registry):
    registry, zk = java_registry
    endpoints, skipped = read_instances(zk, registry["base"], "orders")
    assert skipped == ()
    up = [e for e in endpoints if e.status == "up"]
    assert [e.label for e in up] == registry["current"]["ids"]
    # Curator renders a uriSpec with UriSpec.build(instance); so does the endpoint's uri.
    rendered = sorted(e.uri for e in up if e.properties["curator"]["id"] in ("plain", "both"))
    assert (
        rendered
        == registry["current"]["uris"]
        == [
            "http://10.0.0.1:8080/v1",
            "https://10.0.0.3:443/orders/both[x]",
        ]
    )
    by_label = {e.label: e for e in endpoints}
    assert {e.partition for e in endpoints} == {CURATOR_PARTITION}
    # An sslPort makes an https endpoint on it (Curator's {scheme} rule); the port stays known.
    assert (by_label["ssl-only"].scheme, by_label["ssl-only"].port) == ("https", 8443)
    assert (by_label["both"].scheme, by_label["both"].port) == ("https", 443)
    assert by_label["both"].properties["curator"]["port"] == 80
    assert (by_label["plain"].scheme, by_label["plain"].uri) == ("http", "http://10.0.0.1:8080/v1")
    assert by_label["static"].properties["curator"]["serviceType"] == "STATIC"
    # Spring Cloud's ZookeeperInstance payload: Jackson's @class moves out of the payload.
    spring = by_label["spring"].properties
    assert spring["payload"] == {
        "id": "orders-1",
        "name": "orders",
        "metadata": {"tenant-group": "p1", "zone": "eu-1"},
    }
    assert spring["curator"]["payloadClass"] == "java.util.LinkedHashMap"
    assert by_label["spring"].registered_at > 1.7e9  # registrationTimeUTC, in seconds


def test_the_compatible_serialization_mode_decodes_the_same(java_registry):
    registry, zk = java_registry
    (old,), skipped = read_instances(zk, f"{registry['base']}-compat", "orders")
    assert skipped == () and registry["compat"]["ids"] == [old.label] == ["old"]
    assert old.status == "up" and old.uri == "http://10.0.0.7:8080"
    assert old.properties["payload"]["metadata"] == {"tenant-group": "p1", "zone": "eu-1"}


def test_nodes_curator_would_not_parse_are_skipped_and_named_the_rest_served(java_registry):
    registry, zk = java_registry
    parent = f"{registry['base']}/orders"
    good = zk.get(f"{parent}/plain")[0]
    hostile = {
        "not-json": b"\xff not json",
        "no-port": json.dumps({"name": "orders", "id": "no-port", "address": "10.0.0.9"}),
        "copied": good,  # another instance's value: its id is not this node's name
        "bad-type": json.dumps(
            {"name": "orders", "id": "bad-type", "address": "h", "port": 1, "serviceType": "X"}
        ),
    }
    for name, value in hostile.items():
        zk.create(f"{parent}/{name}", value if isinstance(value, bytes) else value.encode())
    endpoints, skipped = read_instances(zk, registry["base"], "orders")
    assert sorted(e.path.rsplit("/", 1)[-1] for e in skipped) == sorted(hostile)
    assert [e.label for e in endpoints if e.status == "up"] == registry["current"]["ids"]
