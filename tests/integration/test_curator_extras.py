"""Sentinel's extras on services a Curator registry holds: partitions read from a payload field,
a shard policy, collector metrics and per-client credentials, all kept in the namespace, with
nothing written into the Curator base path (issue 27 item 2)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from sentinel.policies import MinLag

from sentinel import CacheConfig
from sentinel.auth import ClientKeyring
from sentinel.auth.config import AuthConfig
from sentinel.curator import CuratorPublisher, CuratorSource
from sentinel.errors import (
    InstanceNotRegistered,
    NoInstanceAvailable,
    RegistryError,
    ValidationError,
)
from sentinel.registry.layout import client_path, instance_path, metrics_path, service_path
from sentinel.registry.records import InstanceRecord, ServiceSpec
from sentinel.testing.helpers import expire_session, wait_until

pytestmark = pytest.mark.integration

SERVICE = "orders-db"
BY_SHARD = "payload.metadata.shard"


@pytest.fixture
def base() -> str:
    """A Curator base path of the test's own (Curator's are server-wide, not namespaced)."""
    return f"/jvm-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def root_zk(zookeeper) -> Iterator[KazooClient]:
    """A kazoo client at the server's root: where Curator's nodes are."""
    zk = KazooClient(zookeeper.connect_string)
    zk.start(timeout=10)
    yield zk
    zk.stop()
    zk.close()


# Three database replicas, each with a Spring Cloud payload whose metadata names its shard: a
# and b in p1, c in p2 (CuratorRegistry.java's "instances").
JAVA_DATABASES = (
    "instances",
    SERVICE,
    "a=10.0.1.1:5432:p1",
    "b=10.0.1.2:5432:p1",
    "c=10.0.1.3:5432:p2",
)


@pytest.fixture
def java_databases(curator_java, zookeeper, base) -> Iterator[subprocess.Popen]:
    """The three replicas registered by a Java Curator process of the test's own (to kill)."""
    command, *arguments = JAVA_DATABASES
    peer = subprocess.Popen(
        [*curator_java, zookeeper.connect_string, base, command, *arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert json.loads(peer.stdout.readline()) == {"registered": 3}
        yield peer
    finally:
        if peer.poll() is None:
            peer.communicate("\n", timeout=60)
        else:
            peer.stdout.close()
            peer.stdin.close()


@pytest.fixture
def java_databases_on_peer(curator_peer, base) -> Iterator[None]:
    """The three replicas registered by the worker's Curator peer, closed after the test."""
    command, *arguments = JAVA_DATABASES
    assert curator_peer.ask(command, base, *arguments) == {"registered": 3}
    yield
    curator_peer.ask("close", base)


def admin_of(make_client, base: str, partition_from: str | None = BY_SHARD, **spec):
    """The operator's client, with the service's spec naming the Curator registry."""
    admin = make_client("admin", announce=False)
    admin.ensure_service(
        SERVICE, curator=CuratorSource(base, partition_from=partition_from), **spec
    )
    return admin


def reader(make_client, client_id: str = "app", **kwargs):
    """A client following the service (Curator registries are followed with persistent
    watches, whatever the suite's mode)."""
    client = make_client(client_id, persistent_watches=True, **kwargs)
    client.prefetch(SERVICE)
    return client


def labels(client, partition: str | None = None) -> list[str]:
    return sorted(
        e.label
        for e in client.cached_instances(SERVICE)
        if partition is None or e.partition == partition
    )


def test_java_databases_route_tenants_by_shard_and_least_lag_with_credentials(
    java_databases, make_client, base, root_zk, raw_zk
):
    """The issue's scenario: Java registered the replicas; the namespace gives them a shard
    policy, the collector's metrics and a credential; Python routes each tenant to its
    partition's least-lagging replica, and a killed Java process leaves the cache."""
    admin = make_client("admin", announce=False)
    admin.shard_maps.create("tenants", "directory", buckets=8)
    admin.shard_maps.assign("tenants", "acme", "p1")
    admin.shard_maps.assign("tenants", "globex", "p2")
    admin.ensure_service(
        SERVICE,
        scheme="postgresql",
        shard_policy="tenants",
        curator=CuratorSource(base, partition_from=BY_SHARD),
    )
    for partition, label, lag in (("p1", "a", 5.0), ("p1", "b", 1.0), ("p2", "c", 3.0)):
        admin.update_metrics(SERVICE, partition, label, {"replication_lag": lag})
    app = reader(make_client, auth=AuthConfig(keys=ClientKeyring.generate()))
    admin.credentials.publish(SERVICE, "app", {"user": "app", "password": "s3cret"})

    assert wait_until(lambda: app.get_service(SERVICE, "acme").auth is not None)
    endpoint = app.get_service(SERVICE, "acme", MinLag())
    assert (endpoint.label, endpoint.partition, endpoint.uri) == (
        "b",
        "p1",
        "postgresql://10.0.1.2:5432",
    )
    assert dict(endpoint.auth) == {"user": "app", "password": "s3cret"}
    assert endpoint.properties["payload"]["metadata"] == {"shard": "p1"}
    assert app.get_service(SERVICE, "globex", MinLag()).label == "c"
    # The credential was confirmed where a rotation waits for it: the namespace's /clients.
    assert raw_zk.exists(client_path(SERVICE, "app")) is not None

    # The collector's next round: b falls behind, and acme moves to a.
    admin.update_metrics(SERVICE, "p1", "b", {"replication_lag": 9.0})
    assert wait_until(lambda: app.get_service(SERVICE, "acme", MinLag()).label == "a")

    # Nothing Python did wrote into the Curator base path.
    assert root_zk.get_children(base) == [SERVICE]
    assert sorted(root_zk.get_children(f"{base}/{SERVICE}")) == ["a", "b", "c"]

    java_databases.kill()
    java_databases.wait()
    # Its session (4 s) expires and its ephemeral nodes go; the namespace's parts stay.
    assert wait_until(lambda: labels(app) == [], timeout=20)
    with pytest.raises(NoInstanceAvailable):
        app.get_service(SERVICE, "acme")


def test_metrics_are_refused_for_an_instance_the_registry_does_not_hold(
    java_databases_on_peer, make_client, base, raw_zk
):
    admin = admin_of(make_client, base)
    admin.update_metrics(SERVICE, "p2", "c", {"replication_lag": 1.0})
    assert raw_zk.exists(metrics_path(SERVICE, "p2", "c")) is not None
    for partition, label in (("p2", "a"), ("p1", "nobody")):  # a is p1's
        with pytest.raises(InstanceNotRegistered):
            admin.update_metrics(SERVICE, partition, label, {"replication_lag": 1.0})
        assert raw_zk.exists(metrics_path(SERVICE, partition, label)) is None
    # A service whose spec names no registry is refused as before.
    admin.ensure_service("native")
    with pytest.raises(InstanceNotRegistered):
        admin.update_metrics("native", "p2", "c", {"replication_lag": 1.0})


def test_instances_without_a_partition_are_skipped_counted_and_the_rest_served(
    zookeeper, make_client, base
):
    with CuratorPublisher(zookeeper.connect_string, base) as publisher:
        publisher.register(
            SERVICE, "10.0.0.1", 5432, instance_id="good", payload={"metadata": {"shard": "p1"}}
        )
        for instance_id, payload in (
            ("no-metadata", {"zone": "eu"}),
            ("no-shard", {"metadata": {"zone": "eu"}}),
            ("not-a-name", {"metadata": {"shard": "../p1"}}),
            ("a-number", {"metadata": {"shard": 7}}),
            ("no-payload", None),
        ):
            publisher.register(SERVICE, "10.0.0.2", 5432, instance_id=instance_id, payload=payload)
        admin_of(make_client, base)
        app = reader(make_client)
        assert [(e.partition, e.label) for e in app.cached_instances(SERVICE)] == [("p1", "good")]
        assert app.cache_stats.decode_errors == 5
        assert app.get_service(SERVICE).label == "good"


def test_an_instance_moves_partition_with_its_payload_and_keeps_its_metrics_name(
    zookeeper, make_client, base, root_zk
):
    with CuratorPublisher(zookeeper.connect_string, base) as publisher:
        registration = publisher.register(
            SERVICE, "10.0.0.1", 5432, instance_id="r1", payload={"metadata": {"shard": "p1"}}
        )
        admin_of(make_client, base)
        app = reader(make_client)
        assert labels(app, "p1") == ["r1"]
        # Another program rewrites the node with another shard (Curator's updateService).
        data, _ = root_zk.get(registration.path)
        value = json.loads(data)
        value["payload"]["metadata"]["shard"] = "p2"
        root_zk.set(registration.path, json.dumps(value).encode())
        assert wait_until(lambda: labels(app, "p2") == ["r1"])
        assert labels(app) == ["r1"]  # moved, not copied

        # Across a session's end the watch is given again and the service read again.
        expire_session(app, hosts=zookeeper.connect_string)
        publisher.register(
            SERVICE, "10.0.0.2", 5432, instance_id="r2", payload={"metadata": {"shard": "p1"}}
        )
        assert wait_until(lambda: labels(app) == ["r1", "r2"])


def test_a_spec_change_reads_the_instances_again_as_it_says(zookeeper, make_client, base, raw_zk):
    with CuratorPublisher(zookeeper.connect_string, base) as publisher:
        publisher.register(
            SERVICE,
            "10.0.0.1",
            5432,
            instance_id="r1",
            payload={"metadata": {"shard": "p1", "zone": "eu-1"}},
        )
        admin = admin_of(make_client, base)
        app = reader(make_client)
        assert [e.partition for e in app.cached_instances(SERVICE)] == ["p1"]

        def write_spec(spec: ServiceSpec) -> None:
            path = service_path(SERVICE)
            raw_zk.set(path, spec.to_bytes(path))

        write_spec(ServiceSpec(SERVICE, curator=CuratorSource(base, "payload.metadata.zone")))
        assert wait_until(lambda: [e.partition for e in app.cached_instances(SERVICE)] == ["eu-1"])
        write_spec(ServiceSpec(SERVICE, scheme="postgresql", curator=CuratorSource(base)))
        assert wait_until(
            lambda: [e.uri for e in app.cached_instances(SERVICE)] == ["postgresql://10.0.0.1:5432"]
        )
        # No registry any more: the namespace's own instances, as for any service.
        write_spec(ServiceSpec(SERVICE))
        assert wait_until(lambda: app.cached_instances(SERVICE) == ())
        admin.register(SERVICE, "p1", "10.9.9.9", 80, label="native")
        assert wait_until(lambda: labels(app) == ["native"])


def test_children_written_under_the_spec_are_not_instances_and_publishing_there_is_refused(
    zookeeper, make_client, base, raw_zk
):
    """Who can create a node under the service's spec must not add an instance the Curator
    registry does not hold."""
    with CuratorPublisher(zookeeper.connect_string, base) as publisher:
        publisher.register(
            SERVICE, "10.0.0.1", 5432, instance_id="r1", payload={"metadata": {"shard": "p1"}}
        )
        admin = admin_of(make_client, base)
        app = reader(make_client)
        assert labels(app) == ["r1"]
        forged = InstanceRecord(SERVICE, "p1", "evil", "10.6.6.6", 5432)
        path = instance_path(SERVICE, "p1", "evil")
        raw_zk.create(path, forged.to_bytes(path), ephemeral=True)
        # A marker change after the forged node: once it is applied, so was the forgery.
        publisher.register(
            SERVICE, "10.0.0.2", 5432, instance_id="r2", payload={"metadata": {"shard": "p1"}}
        )
        assert wait_until(lambda: labels(app) == ["r1", "r2"])
        assert all(e.host != "10.6.6.6" for e in app.eligible_instances(SERVICE))
        # A fresh reader does not take it either.
        assert labels(reader(make_client, "fresh")) == ["r1", "r2"]
        with pytest.raises(ValidationError, match="CuratorPublisher"):
            admin.register(SERVICE, "p1", "10.0.0.9", 5432, label="mine")


def test_a_spec_naming_a_registry_needs_persistent_watches_and_says_so(make_client, base):
    admin_of(make_client, base)
    one_shot = make_client("one-shot", persistent_watches=False)
    with pytest.raises(RegistryError, match="persistent watches"):
        one_shot.get_service(SERVICE)


def test_a_curator_service_is_left_out_of_the_snapshot_file(zookeeper, make_client, base, tmp_path):
    with CuratorPublisher(zookeeper.connect_string, base) as publisher:
        publisher.register(SERVICE, "10.0.0.1", 5432, payload={"metadata": {"shard": "p1"}})
        admin = admin_of(make_client, base)
        admin.ensure_service("native")
        admin.register("native", "p1", "10.0.0.2", 80)
        snapshot = tmp_path / "cache.json"
        app = reader(make_client, cache=CacheConfig(snapshot_path=str(snapshot)))
        app.get_service(SERVICE)
        app.get_service("native")
        app.close()  # writes the file with what the client followed, but the Curator service
    written = snapshot.read_text()
    assert "native" in written and SERVICE not in written


def test_ls_doctor_and_prune_count_a_jvm_service_by_its_registry(
    zookeeper, make_client, base, raw_zk, cli_in_process
):
    cli = cli_in_process
    with CuratorPublisher(zookeeper.connect_string, base) as publisher:
        for instance_id, shard in (("r1", "p1"), ("r2", "p2")):
            publisher.register(
                SERVICE,
                "10.0.0.1",
                5432,
                instance_id=instance_id,
                payload={"metadata": {"shard": shard}},
            )
        publisher.register(SERVICE, "10.0.0.3", 5432, instance_id="unplaced", payload={})
        admin = admin_of(make_client, base)
        admin.update_metrics(SERVICE, "p1", "r1", {"replication_lag": 1.0})
        forged = InstanceRecord(SERVICE, "p1", "evil", "10.6.6.6", 5432)
        path = instance_path(SERVICE, "p1", "evil")
        raw_zk.create(path, forged.to_bytes(path))

        listed = json.loads(cli("ls", "--json").stdout)
        assert [d for d in listed if d["service"] == SERVICE] == [
            {
                "service": SERVICE,
                "scheme": "http",
                "shard_policy": None,
                "failover": None,
                "source": f"curator:{base}",
                "instances": 2,
                "up": 2,
                "partitions": {"p1": 1, "p2": 1},
            }
        ]
        one = json.loads(cli("ls", SERVICE, "--json").stdout)
        assert [(i["partition"], i["label"], i["metrics"]) for i in one["instances"]] == [
            ("p1", "r1", {"replication_lag": 1.0}),
            ("p2", "r2", {}),
        ]
        assert (one["source"], one["skipped"]) == (f"curator:{base}", 1)
        assert f"instances from curator:{base}" in cli("ls").stdout

        findings = json.loads(cli("doctor", "--json").stdout)
        checks = {f["check"] for f in findings}
        assert "orphaned metrics" not in checks  # r1's metrics are the registry's instance's
        assert "no live instance" not in checks
        assert any(
            f["check"] == "ignored instances" and f"{SERVICE}" in f["detail"] for f in findings
        )
        # prune keeps what the registry holds.
        pruned = json.loads(cli("prune", "--older-than", "0", "--json").stdout)
        assert pruned == {"removed": []}
        assert raw_zk.exists(metrics_path(SERVICE, "p1", "r1")) is not None


def test_the_collector_sidecar_publishes_metrics_for_jvm_instances(
    zookeeper, make_client, base, raw_zk
):
    """The metric collector follows a Curator service as any: it scrapes each JVM
    instance's exporter and publishes into the namespace, and MinLag steers by it."""
    from sentinel.collector import MetricCollector
    from tests.integration.test_collector import Exporter, collecting

    exporters = {label: Exporter(lag) for label, lag in (("a", 5.0), ("b", 1.0))}
    try:
        with CuratorPublisher(zookeeper.connect_string, base) as publisher:
            for label, exporter in exporters.items():
                publisher.register(
                    SERVICE,
                    "127.0.0.1",
                    exporter.port,
                    instance_id=label,
                    payload={"metadata": {"shard": "p1"}},
                )
            admin_of(make_client, base)
            app = reader(make_client)
            policy = MinLag(cutoff=30, max_age=5)

            def picked() -> str:
                return app.get_service(SERVICE, policy=policy).label

            collector = reader(make_client, "collector-1")
            with MetricCollector(collector, collecting(SERVICE)):
                assert wait_until(lambda: picked() == "b", 15, ignore=(NoInstanceAvailable,))
                exporters["b"].lag.set(9.0)
                assert wait_until(lambda: picked() == "a", 15)
            assert json.loads(raw_zk.get(metrics_path(SERVICE, "p1", "b"))[0])["metrics"] == {
                "replication_lag": 9.0
            }
    finally:
        for exporter in exporters.values():
            exporter.close()
