"""Curator's x-discovery format, as real Java Curator writes it: what Python reads of it equals
what Curator's own ServiceProvider returns (tests/peers/CuratorRegistry.java, compiled here
against Debian's libcurator-discovery-java)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from prometheus_client import REGISTRY

from sentinel import CacheConfig
from sentinel.curator import SPRING_PAYLOAD_CLASS, CuratorPublisher, SpringPayload
from sentinel.errors import PayloadClassMismatch, RegistryError, ServiceNotFound, ValidationError
from sentinel.events import InstancesChanged
from sentinel.registry.curator import CURATOR_PARTITION, CuratorInstance, read_instances
from sentinel.testing.helpers import TcpProxy, expire_session, wait_until

pytestmark = pytest.mark.integration


def start_peer(java: list[str], hosts: str) -> tuple[str, subprocess.Popen]:
    """The Java peer registering under a base path of its own, ``/jvm-<n>``."""
    base = f"/jvm-{uuid.uuid4().hex[:8]}"
    peer = subprocess.Popen(
        [*java, hosts, base], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    return base, peer


@pytest.fixture
def java_registry(curator_peer, zookeeper) -> Iterator[tuple[dict, KazooClient]]:
    """A Java registry under /jvm-<n> of the test's own, written by the worker's Curator peer
    and live while the test runs (closed after it); what Curator's ServiceProvider returned,
    and a plain kazoo client to read it with."""
    base = f"/jvm-{uuid.uuid4().hex[:8]}"
    provider = curator_peer.ask("registry", base)
    zk = KazooClient(zookeeper.connect_string)
    try:
        zk.start(timeout=10)
        yield {"base": base, **provider}, zk
    finally:
        zk.stop()
        zk.close()
        curator_peer.ask("close", base)


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


def test_a_client_follows_a_curator_service_through_its_cache(java_registry, make_client, raw_zk):
    registry, zk = java_registry
    base = registry["base"]
    client = make_client("jvm-reader", cache=CacheConfig(curator_base_paths=(base,)))
    assert [e.label for e in client.eligible_instances("orders")] == registry["current"]["ids"]
    assert client.get_service("orders").label in registry["current"]["ids"]
    # Nothing is written into the namespace for it (no spec, no /clients entry).
    assert not raw_zk.exists("/services/orders") and not raw_zk.exists("/clients/orders")
    assert client.cache_stats.clients_write_failures == 0
    events, lock = [], threading.Lock()

    def record(event):
        with lock:
            events.append(event)

    client.listen("orders", record)

    def changed(kind):
        with lock:
            return [
                [e.label for e in getattr(event, kind)]
                for event in events
                if isinstance(event, InstancesChanged) and getattr(event, kind)
            ]

    def propagated() -> float:
        sample = REGISTRY.get_sample_value(
            "sentinel_propagation_delay_seconds_count", {"section": "instances"}
        )
        return sample or 0.0

    observed = propagated()
    node = {"name": "orders", "id": "late", "address": "10.0.0.8", "port": 9000}
    zk.create(f"{base}/orders/late", json.dumps(node).encode())
    assert wait_until(lambda: changed("added") == [["late"]], timeout=10)
    assert propagated() == observed + 1  # the one node read for the creation
    zk.set(f"{base}/orders/late", json.dumps({**node, "enabled": False}).encode())
    assert wait_until(
        lambda: (
            {e.label: e.status for e in client.cached_instances("orders")}.get("late") == "down"
        ),
        timeout=10,
    )
    decode_errors = client.cache_stats.decode_errors
    zk.create(f"{base}/orders/garbage", b"\xff not json")
    assert wait_until(lambda: client.cache_stats.decode_errors == decode_errors + 1, timeout=10)
    zk.delete(f"{base}/orders/late")
    assert wait_until(lambda: changed("removed") == [["late"]], timeout=10)
    assert [e.label for e in client.eligible_instances("orders")] == registry["current"]["ids"]


def test_a_killed_java_publisher_leaves_the_python_cache(curator_java, zookeeper, make_client):
    base, peer = start_peer(curator_java, zookeeper.connect_string)
    try:
        registered = json.loads(peer.stdout.readline())["current"]["ids"]
        client = make_client("jvm-reader", cache=CacheConfig(curator_base_paths=(base,)))
        assert [e.label for e in client.eligible_instances("orders")] == registered
        peer.kill()
        peer.wait()
        # Its session (4 s) expires; only the STATIC instance, a persistent node, stays.
        assert wait_until(
            lambda: [e.label for e in client.cached_instances("orders")] == ["static"],
            timeout=20,
        )
    finally:
        if peer.poll() is None:
            peer.kill()
        peer.stdout.close()
        peer.stdin.close()


def test_the_namespace_wins_a_name_both_hold_and_a_missing_name_names_both(
    java_registry, make_client
):
    registry, _ = java_registry
    make_client("native").register("orders", "p1", "10.9.9.9", 80, label="native")
    client = make_client("reader", cache=CacheConfig(curator_base_paths=(registry["base"],)))
    assert [e.label for e in client.eligible_instances("orders")] == ["native"]
    with pytest.raises(ServiceNotFound, match=f"nor under {registry['base']}"):
        client.get_service("payments")


def test_curator_services_need_persistent_watches_and_say_so(java_registry, make_client):
    registry, _ = java_registry
    client = make_client(
        "old-mode",
        persistent_watches=False,
        cache=CacheConfig(curator_base_paths=(registry["base"],)),
    )
    with pytest.raises(RegistryError, match="persistent watches"):
        client.get_service("orders")


def test_changes_while_cut_off_and_across_a_session_expiry_reach_the_cache(
    java_registry, make_client, zookeeper
):
    registry, zk = java_registry
    parent = f"{registry['base']}/orders"
    host, port = zookeeper.connect_string.split(":")
    proxy = TcpProxy(host, int(port))
    try:
        client = make_client(
            "cut-reader",
            hosts=proxy.address,
            cache=CacheConfig(curator_base_paths=(registry["base"],), resync_jitter=0),
        )

        def labels():
            return {e.label: e.port for e in client.cached_instances("orders")}

        client.prefetch("orders")
        assert labels()["plain"] == 8080
        session = client.session_id
        proxy.cut()
        assert wait_until(lambda: client.connection_state == "suspended", timeout=15)
        # Meanwhile: one instance changed, one deleted, one created. The server reports them
        # on the same session (the nodes the cache holds were handed to it).
        plain = json.loads(zk.get(f"{parent}/plain")[0])
        zk.set(f"{parent}/plain", json.dumps({**plain, "port": 8081}).encode())
        zk.delete(f"{parent}/static")
        zk.create(f"{parent}/new", json.dumps({**plain, "id": "new"}).encode())
        proxy.restore()
        assert wait_until(
            lambda: (
                (labels().get("plain"), "static" in labels(), labels().get("new"))
                == (8081, False, 8080)
            ),
            timeout=15,
        ), labels()
        assert client.session_id == session
        # A session's end takes the watch: the service is followed and read again.
        expire_session(client)
        assert wait_until(lambda: client.session_id not in (None, session), timeout=15)
        zk.delete(f"{parent}/new")
        assert wait_until(lambda: "new" not in labels(), timeout=15)
        zk.create(f"{parent}/newer", json.dumps({**plain, "id": "newer"}).encode())
        assert wait_until(lambda: "newer" in labels(), timeout=15)
    finally:
        proxy.close()


def test_sentinel_resolve_follows_a_curator_path(java_registry, cli):
    registry, _ = java_registry
    resolved = cli("resolve", "orders", "--curator-path", registry["base"], "--json")
    assert resolved.returncode == 0, resolved.stderr
    document = json.loads(resolved.stdout)
    assert sorted(i["label"] for i in document["instances"]) == registry["current"]["ids"]
    assert document["picks"][0]["uri"].startswith(("http://10.0.0.", "https://10.0.0."))
    assert cli("init").returncode == 0
    missing = cli("resolve", "orders")  # without the option: the namespace alone
    assert missing.returncode == 1 and "not registered" in missing.stderr
    refused = cli("resolve", "orders", "--curator-path", "services")
    assert refused.returncode == 2 and "curator_base_paths" in refused.stderr


def discover(peer, base: str, service: str) -> dict:
    """What Java Curator's ServiceProvider sees of ``service`` under ``base``, now (a provider
    started for the question, on the peer's session)."""
    return peer.ask("discover", base, service)


PYTHON_PUBLISHER = textwrap.dedent(
    """
    import sys, time
    from sentinel.curator import SPRING_PAYLOAD_CLASS, CuratorPublisher, SpringPayload
    publisher = CuratorPublisher(sys.argv[1], sys.argv[2], session_timeout=2.0).start()
    publisher.register("payments", "10.7.0.1", 8080, instance_id="doomed")
    print("registered", flush=True)
    time.sleep(600)
    """
)


def test_java_curator_sees_what_a_python_publisher_registers(curator_peer, zookeeper):
    base = f"/py-{uuid.uuid4().hex[:8]}"
    hosts = zookeeper.connect_string
    with CuratorPublisher(hosts, base) as publisher:
        publisher.register(
            "payments",
            "10.7.0.2",
            8080,
            instance_id="api-1",
            payload={"zone": "eu-1"},
            uri_spec="{scheme}://{address}:{port}/v2",
        )
        secure = publisher.register("payments", "10.7.0.3", ssl_port=8443, instance_id="api-2")
        publisher.register("payments", "10.7.0.4", 8080, instance_id="off", enabled=False)
        seen = discover(curator_peer, base, "payments")
        # Curator's provider leaves the disabled one out, as Sentinel's lookups do (Debian's
        # Curator 5.4 reads `enabled` though it does not write it).
        assert seen["ids"] == ["api-1", "api-2"]
        assert seen["uris"] == ["http://10.7.0.2:8080/v2"]
        assert seen["zones"]["api-1"] == "eu-1" and seen["one"] in seen["ids"]
        assert publisher.deregister(secure) is True
        assert discover(curator_peer, base, "payments")["ids"] == ["api-1"]
    assert discover(curator_peer, base, "payments")["ids"] == []  # closed: all gone


def spring_discover(peer, base: str, service: str) -> dict:
    """What a ServiceDiscovery typed to Spring Cloud's ZookeeperInstance (a stand-in with its
    name and fields, tests/peers/org/...) reads, as a Spring Boot service's DiscoveryClient
    does."""
    return peer.ask("spring-discover", base, service)


def publishing_example(hosts: str, base: str) -> str:
    """docs/interop.md's publishing example (the block with SpringPayload and SIGTERM), on the
    test's server and base path."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "interop.md"
    section = doc.read_text().split("## Publishing for Java", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    for old, new in (('"zk1:2181"', repr(hosts)), ('"/services"', repr(base))):
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    return code


def test_a_spring_reader_reads_every_instance_a_python_publisher_writes(curator_peer, zookeeper):
    """Issue 39: a Python instance published as docs/interop.md showed (a plain mapping
    payload) made a Java reader typed to Spring's ZookeeperInstance throw ClassCastException
    for the whole query. The docs' example now publishes Spring's payload; into a base path
    of Spring instances a publisher writes Spring's payload (SpringPayload, or none) and
    refuses any other class, naming it; Curator typed to the class reads every instance."""
    base = f"/spring-{uuid.uuid4().hex[:8]}"
    hosts = zookeeper.connect_string
    registered = curator_peer.ask("spring-instances", base, "orders", "boot-1=10.8.0.1:8080")
    example = subprocess.Popen([sys.executable, "-c", publishing_example(hosts, base)])
    zk = KazooClient(hosts)
    zk.start(timeout=10)
    try:
        assert registered == {"registered": 1}
        assert wait_until(lambda: zk.exists(f"{base}/payments/payments-1"), timeout=30)
        # Another replica, as the example's identity: the service node is that identity's.
        with CuratorPublisher(hosts, base, identity="payments:s3cret") as publisher:
            publisher.register("payments", "10.8.0.3", 8080, instance_id="py-2")  # none: Spring's
            publisher.register(
                "orders", "10.8.0.4", 8080, instance_id="py-3", payload=SpringPayload()
            )
            for payload in ({"zone": "eu-1"}, {"@class": "com.acme.Other", "zone": "eu-1"}, 7):
                with pytest.raises(PayloadClassMismatch) as refused:
                    publisher.register(
                        "payments", "10.8.0.5", 8080, instance_id="x", payload=payload
                    )
                assert refused.value.expected == SPRING_PAYLOAD_CLASS
                assert SPRING_PAYLOAD_CLASS in str(refused.value)
                assert "SpringPayload" in str(refused.value)
            assert zk.exists(f"{base}/payments/x") is None
            assert spring_discover(curator_peer, base, "payments") == {
                "ids": ["payments-1", "py-2"],
                "metadata": {"payments-1": {"zone": "eu-1"}, "py-2": {}},
            }
            assert spring_discover(curator_peer, base, "orders") == {
                "ids": ["boot-1", "py-3"],
                "metadata": {"boot-1": {"zone": "eu-1"}, "py-3": {}},
            }
        # The example stops on SIGTERM and deregisters at once.
        example.send_signal(signal.SIGTERM)
        assert example.wait(timeout=30) == 0
        assert zk.exists(f"{base}/payments/payments-1") is None
        # The payload that broke it, written around the check: the whole query fails.
        node = {"name": "orders", "id": "map", "address": "10.8.0.6", "port": 1}
        node["payload"] = {"@class": "java.util.LinkedHashMap", "zone": "eu-1"}
        zk.create(f"{base}/orders/map", json.dumps(node).encode())
        broken = spring_discover(curator_peer, base, "orders")
        assert broken == {"error": "java.lang.ClassCastException"}
    finally:
        if example.poll() is None:
            example.kill()
            example.wait()
        zk.stop()
        zk.close()
        curator_peer.ask("close", base)


def test_a_killed_python_publisher_leaves_java_within_its_session(curator_peer, zookeeper):
    base = f"/py-{uuid.uuid4().hex[:8]}"
    hosts = zookeeper.connect_string
    process = subprocess.Popen(
        [sys.executable, "-c", PYTHON_PUBLISHER, hosts, base], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "registered"
        assert discover(curator_peer, base, "payments")["ids"] == ["doomed"]
        process.kill()
        process.wait()
        assert wait_until(lambda: discover(curator_peer, base, "payments")["ids"] == [], timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()


def test_a_python_registration_is_re_created_after_its_session_expires(zookeeper):
    base = f"/py-{uuid.uuid4().hex[:8]}"
    with CuratorPublisher(zookeeper.connect_string, base) as publisher:
        registration = publisher.register("payments", "10.7.0.5", 8080, instance_id="kept")
        unrooted = KazooClient(zookeeper.connect_string)
        unrooted.start(timeout=10)
        try:
            before = unrooted.exists(registration.path)
            session, password = publisher._zk.client_id
            intruder = KazooClient(zookeeper.connect_string, client_id=(session, password))
            intruder.start(timeout=10)
            intruder.stop()  # closing the joined session ends it on the server
            intruder.close()
            assert wait_until(
                lambda: (
                    (stat := unrooted.exists(registration.path)) is not None
                    and stat.ephemeralOwner not in (0, before.ephemeralOwner)
                ),
                timeout=20,
            )
            instance = CuratorInstance.from_bytes(
                registration.path, unrooted.get(registration.path)[0]
            )
            assert (instance.address, instance.port) == ("10.7.0.5", 8080)
        finally:
            unrooted.stop()
            unrooted.close()


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ({"port": None}, "needs a port"),
        ({"port": 0}, "port must be a port number"),
        ({"address": "not a host!"}, "host"),
        ({"instance_id": "a/b"}, "instance id"),
        ({"uri_spec": "{scheme"}, "not closed"),
        ({"payload": {"x": float("nan")}}, "payload is not JSON"),
    ],
)
def test_a_bad_registration_is_refused_and_writes_nothing(zookeeper, arguments, reason):
    base = f"/py-{uuid.uuid4().hex[:8]}"
    with CuratorPublisher(zookeeper.connect_string, base) as publisher:
        with pytest.raises(ValidationError, match=reason):
            publisher.register(
                **{"service": "payments", "address": "10.7.0.6", "port": 80, **arguments}
            )
        assert not publisher._zk.exists(f"{base}/payments")


def test_sentinel_ls_and_doctor_show_a_curator_path_and_its_bad_nodes(java_registry, cli):
    registry, zk = java_registry
    base = registry["base"]
    assert cli("init").returncode == 0
    zk.create(f"{base}/orders/garbage", b"not json")
    zk.create(f"{base}/orders/copied", zk.get(f"{base}/orders/plain")[0])
    listed = cli("ls", "--curator-path", base, "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == [
        {"service": "orders", "source": f"curator:{base}", "instances": 6, "up": 6, "skipped": 2}
    ]
    one = json.loads(cli("ls", "orders", "--curator-path", base, "--json").stdout)
    assert sorted(i["label"] for i in one["instances"]) == registry["current"]["ids"]
    assert (one["source"], one["skipped"]) == (f"curator:{base}", 2)
    doctor = cli("doctor", "--curator-path", base, "--json")
    assert doctor.returncode == 1  # a node Curator could not read is a problem
    curator = [f for f in json.loads(doctor.stdout) if f["check"] == "curator"]
    assert sorted((f["severity"], f["detail"].split(":")[0]) for f in curator) == [
        ("error", f"{base}/orders/garbage"),
        ("warn", base),  # Curator's default ACL: anyone may write there
        ("warn", f"{base}/orders"),
        ("warn", f"{base}/orders/copied"),
        ("warn", f"{base}/orders/static"),  # Curator's STATIC instance: persistent
    ]
    missing = cli("doctor", "--curator-path", "/no-such-base", "--json")
    assert {"severity": "error", "check": "curator"}.items() <= next(
        f for f in json.loads(missing.stdout) if f["check"] == "curator"
    ).items()
