"""Publishing instances against a real ZooKeeper: nodes, JSON, expiry, takeover, bad input."""

import json
import logging
import math
import threading
import time

import pytest
from kazoo.client import KazooClient, KazooState
from kazoo.protocol.states import Callback

from sentinel import Sentinel
from sentinel.errors import (
    ConnectionInterrupted,
    InstanceNotRegistered,
    InvalidName,
    ServiceConflict,
    ServiceNotFound,
    ValidationError,
    ValueTooLarge,
)
from sentinel.registry.records import MAX_VALUE_BYTES
from sentinel.testing.helpers import TcpProxy, expire_session, wait_until

pytestmark = pytest.mark.integration


def test_register_writes_an_ephemeral_node_with_versioned_json(make_client, raw_zk):
    client = make_client()
    registration = client.register(
        "billing-db",
        "p1",
        "10.0.0.5",
        5432,
        scheme="postgresql",
        label="replica-a",
        weight=2,
        zone="eu-1",
        properties={"role": "replica"},
    )
    assert registration.path == "/services/billing-db/p1:replica-a"
    data, stat = raw_zk.get(registration.path)
    assert stat.ephemeralOwner == client.session_id
    document = json.loads(data)
    assert document["v"] == 1
    assert {
        k: document[k]
        for k in (
            "partition",
            "label",
            "host",
            "port",
            "scheme",
            "status",
            "weight",
            "zone",
            "properties",
        )
    } == {
        "partition": "p1",
        "label": "replica-a",
        "host": "10.0.0.5",
        "port": 5432,
        "scheme": "postgresql",
        "status": "up",
        "weight": 2,
        "zone": "eu-1",
        "properties": {"role": "replica"},
    }
    spec, spec_stat = raw_zk.get("/services/billing-db")
    assert spec_stat.ephemeralOwner == 0
    assert json.loads(spec) == {
        "v": 1,
        "scheme": "postgresql",
        "shard_policy": None,
        "defaults": {},
    }
    assert sorted(raw_zk.get_children("/")) == [
        "auth",
        "clients",
        "metrics",
        "services",
        "shard_info",
    ]


def test_default_label_is_derived_from_host_and_port(make_client, raw_zk):
    registration = make_client().register("api", "p1", "::1", 8080)
    assert registration.label == "_6_--1_8080"  # ':' has no place in a label: see default_label
    assert raw_zk.exists("/services/api/p1:_6_--1_8080") is not None


def test_registering_the_same_identity_again_replaces_the_node(make_client, raw_zk):
    client = make_client()
    first = client.register("api", "p1", "h1", 80, label="a")
    _, before = raw_zk.get(first.path)
    client.register("api", "p1", "h2", 81, label="a")
    data, after = raw_zk.get(first.path)
    assert json.loads(data)["host"] == "h2"
    assert after.czxid == before.czxid and after.version == before.version + 1
    assert len(client.registrations) == 1


def test_deregister_removes_the_node_once(make_client, raw_zk):
    client = make_client()
    registration = client.register("api", "p1", "h", 80)
    other = client.register("api", "p2", "h", 81)
    assert client.deregister(registration) is True
    assert raw_zk.exists(registration.path) is None
    assert raw_zk.exists(other.path) is not None
    assert client.deregister(registration) is False
    assert client.registrations == (other,)


def _requests_sent(client, action) -> list[str]:
    """The ZooKeeper requests ``action`` sends from this thread (the cache's and the
    ephemeral worker's own requests run on other threads and are not counted)."""
    sent: list[str] = []
    me = threading.get_ident()
    call = client.session.zk._call

    def counting(request, async_object):
        if threading.get_ident() == me:
            sent.append(type(request).__name__)
        return call(request, async_object)

    client.session.zk._call = counting
    try:
        action()
    finally:
        del client.session.zk._call
    return sent


def _known(client, registration, owned: bool) -> None:
    """Wait until ``client``'s watch on the node has been read again since its last event:
    the node is then known to be its own (``owned``) or another session's, without a read."""
    path = registration.path
    assert wait_until(lambda: client.session.nodes.owns(path) is owned, timeout=10), (
        f"{path} never became known as {'ours' if owned else 'taken over'}"
    )


@pytest.mark.parametrize(
    ("mark_departures", "request_sent"),
    [(False, "Delete"), (True, "Transaction")],
    ids=["plain", "spec-marks-departures"],
)
def test_deregistration_costs_one_conditional_delete(
    make_client, raw_zk, mark_departures, request_sent
):
    # The floor (docs/decisions/deregistration-reads-before-deleting.md): the node's watch,
    # set when the registration was followed, says it is ours at the version it read. A
    # service whose spec marks departures pays it as one transaction (the delete with its
    # departure mark, docs/decisions/deregistration-marks-its-delete.md); any other, as one
    # delete, the mark never created.
    client = make_client()
    client.ensure_service("api", mark_departures=mark_departures)
    registration = client.register("api", "p1", "h", 80)
    _known(client, registration, owned=True)
    sent = _requests_sent(client, lambda: client.deregister(registration))
    assert sent == [request_sent]
    assert raw_zk.exists(registration.path) is None


def test_a_node_changed_since_it_was_read_is_read_again_before_the_delete(make_client, raw_zk):
    # An operator's drain changed our node's version and its event is not heard yet (made so
    # by hand: the race is too short to hit on purpose): the delete conditional on the version
    # last read fails, and the deregistration reads and deletes the node that is ours.
    client = make_client()
    registration = client.register("api", "p1", "h", 80)
    _known(client, registration, owned=True)
    client.session.nodes._seen[registration.path] = (
        7,
        *client.session.nodes._seen[registration.path][1:],
    )
    sent = _requests_sent(client, lambda: client.deregister(registration))
    assert sent == ["Delete", "Exists", "Delete"]
    assert raw_zk.exists(registration.path) is None


def test_a_node_written_past_the_trusted_versions_is_read_before_it_is_deleted(make_client, raw_zk):
    # Above the bound a take-over writes version 0 again (docs/decisions/
    # deregistration-reads-before-deleting.md): a version known there does not tell our node
    # from a successor's, so the read comes first.
    client = make_client()
    registration = client.register("api", "p1", "h", 80)
    data, _ = raw_zk.get(registration.path)
    for _ in range(8):
        raw_zk.set(registration.path, data)  # the same value: nothing to adopt
    assert wait_until(
        lambda: client.session.nodes._known(registration.path) == (True, 8), timeout=10
    )
    sent = _requests_sent(client, lambda: client.deregister(registration))
    assert sent == ["Exists", "Delete"]
    assert raw_zk.exists(registration.path) is None


def test_after_a_lost_connection_deregistration_reads_before_it_deletes(
    zookeeper, namespace, raw_zk
):
    # Events may be missed while the link is down: what the watch saw is no longer known.
    host, port = zookeeper.connect_string.split(":")
    proxy = TcpProxy(host, int(port))
    client = Sentinel(hosts=proxy.address, client_id="c", namespace=namespace, session_timeout=12)
    client.start()
    try:
        states: list[str] = []
        client.session.zk.add_listener(states.append)
        registration = client.register("api", "p1", "h", 80)
        _known(client, registration, owned=True)
        session = client.session_id
        proxy.cut()
        assert wait_until(lambda: KazooState.SUSPENDED in states, timeout=15), (
            "the connection never dropped, so this test proved nothing"
        )
        proxy.restore()
        assert wait_until(lambda: states[-1] == KazooState.CONNECTED, timeout=10)
        assert client.session_id == session  # the same session: its node was never re-created
        assert client.session.nodes.owns(registration.path) is None
        sent = _requests_sent(client, lambda: client.deregister(registration))
        assert sent == ["Exists", "Delete"]
        assert raw_zk.exists(registration.path) is None
    finally:
        client.close()
        proxy.close()


@pytest.mark.parametrize("expired", [False, True], ids=["rolling-restart", "after-expiry"])
def test_an_old_process_cannot_delete_its_successors_node(make_client, raw_zk, expired):
    old = make_client("old")
    stale = old.register("api", "p1", "10.0.0.9", 80, label="a")
    if expired:
        before = expire_session(old)
        restored = wait_until(
            lambda: raw_zk.exists(stale.path).ephemeralOwner not in (None, before),
            timeout=10,
            ignore=(AttributeError,),
        )
        assert restored is not None, "the old process did not restore its node"
    _known(old, stale, owned=True)  # the one-request delete is armed
    _, old_stat = raw_zk.get(stale.path)
    # The take-over's event stays in flight to the old process (its watch deliveries are held
    # behind this): it deregisters right after the take-over returns, without hearing it.
    release = threading.Event()
    old.session.zk.handler.dispatch_callback(Callback("watch", release.wait, (30,)))
    try:
        successor = make_client("successor")
        current = successor.register("api", "p1", "10.0.0.9", 80, label="a")
        _, stat = raw_zk.get(current.path)
        assert stat.ephemeralOwner == successor.session_id
        # Same path, one version above the old node (the take-over's doing): the old process's
        # delete conditional on the version it knows is refused.
        assert (current.path, stat.version) == (stale.path, old_stat.version + 1)
        assert old.session.nodes.owns(stale.path) is True  # the take-over is not heard

        sent = _requests_sent(old, lambda: old.deregister(stale))
    finally:
        release.set()

    assert raw_zk.exists(current.path).ephemeralOwner == successor.session_id
    assert raw_zk.get(current.path)[1].czxid == stat.czxid
    assert sent == ["Delete", "Exists"]  # refused, then the read showed another owner
    assert old.registrations == ()
    assert successor.registrations == (current,)


def test_a_take_over_heard_but_not_read_yet_makes_the_deregistration_read(
    make_client, raw_zk, monkeypatch
):
    # The watch reported the take-over, and the worker has not read the node again yet
    # (held here): "ours at version 0" is no longer trusted, and the read shows the successor.
    old = make_client("old")
    stale = old.register("api", "p1", "10.0.0.9", 80, label="a")
    _known(old, stale, owned=True)
    heard = old.session.nodes._events.get(stale.path, 0)
    monkeypatch.setattr(old.session.nodes, "_adopt_changes", lambda: None)
    successor = make_client("successor")
    current = successor.register("api", "p1", "10.0.0.9", 80, label="a")
    assert raw_zk.get(current.path)[1].version == 1  # one above old's node (the take-over)
    assert wait_until(lambda: old.session.nodes._events.get(stale.path, 0) > heard, timeout=10)

    sent = _requests_sent(old, lambda: old.deregister(stale))

    assert sent == ["Exists"]
    assert raw_zk.exists(current.path).ephemeralOwner == successor.session_id


def test_an_old_process_cannot_delete_a_node_created_after_its_successor_left(make_client, raw_zk):
    # A is taken over by B, B deregisters, C registers afresh at version 0: the same path and
    # version as A's node, and no take-over of A's in between. A read or the watch tells.
    a = make_client("a")
    stale = a.register("api", "p1", "10.0.0.9", 80, label="a")
    _, a_stat = raw_zk.get(stale.path)
    b = make_client("b")
    b.deregister(b.register("api", "p1", "10.0.0.9", 80, label="a"))
    c = make_client("c")
    current = c.register("api", "p1", "10.0.0.9", 80, label="a")
    _, c_stat = raw_zk.get(current.path)
    assert (c_stat.version, c_stat.ephemeralOwner) == (a_stat.version, c.session_id)
    assert c_stat.czxid != a_stat.czxid
    _known(a, stale, owned=False)

    sent = _requests_sent(a, lambda: a.deregister(stale))

    assert sent == []
    assert raw_zk.get(current.path)[1].czxid == c_stat.czxid
    assert c.registrations == (current,)


def test_close_removes_every_registration_at_once(make_client, raw_zk):
    client = make_client()
    for partition in ("p1", "p2", "p3"):
        client.register("api", partition, "h", 80)
    client.close()
    assert raw_zk.get_children("/services/api") == []


def test_deregister_with_a_wait_removes_then_waits(make_client, raw_zk):
    client = make_client()
    registration = client.register("api", "p1", "h", 80)
    gone_at = []
    raw_zk.exists(registration.path, watch=lambda event: gone_at.append(time.monotonic()))
    started = time.monotonic()
    assert client.deregister(registration, wait=0.3) is True
    finished = time.monotonic()
    assert raw_zk.exists(registration.path) is None
    assert gone_at and gone_at[0] - started < 0.3 <= finished - started
    assert client.deregister(registration, wait=0) is False  # no longer held


@pytest.mark.parametrize("wait", [-1, math.nan, "1"])
def test_a_deregister_wait_that_is_no_duration_is_refused_before_removing(
    make_client, raw_zk, wait
):
    client = make_client()
    registration = client.register("api", "p1", "h", 80)
    with pytest.raises(ValidationError, match="wait"):
        client.deregister(registration, wait=wait)
    assert raw_zk.exists(registration.path) is not None


def test_registration_is_restored_after_session_expiry(make_client, raw_zk):
    client = make_client(session_timeout=4.0)
    bystander = make_client("bystander")
    mine = [client.register("api", p, "h", 80) for p in ("p1", "p2")]
    theirs = bystander.register("api", "p3", "h", 80)
    old_session = expire_session(client)

    def restored():
        owners = {
            raw_zk.exists(r.path).ephemeralOwner if raw_zk.exists(r.path) else None for r in mine
        }
        return owners == {client.session_id} and client.session_id != old_session

    elapsed = wait_until(restored, timeout=10, ignore=(ConnectionInterrupted,))
    assert elapsed is not None, "registrations did not come back after session expiry"
    assert raw_zk.exists(theirs.path).ephemeralOwner == bystander.session_id
    assert client.registrations == tuple(mine)


def test_a_stale_node_of_another_session_is_taken_over_and_watchers_fire(
    make_client, raw_zk, zookeeper, namespace
):
    # The node a crashed predecessor left behind: its session is still alive on the server.
    predecessor = KazooClient(hosts=f"{zookeeper.connect_string}{namespace}")
    predecessor.start(timeout=10)
    try:
        make_client("setup").ensure_service("api")
        predecessor.create("/services/api/p1:a", b'{"v":1}', ephemeral=True)
        stale_owner = predecessor.client_id[0]
        changed = threading.Event()
        raw_zk.get_children("/services/api", watch=lambda event: changed.set())

        client = make_client()
        registration = client.register("api", "p1", "10.0.0.9", 80, label="a")

        data, stat = raw_zk.get(registration.path)
        assert stat.ephemeralOwner == client.session_id != stale_owner
        assert json.loads(data)["host"] == "10.0.0.9"
        assert changed.wait(5), "children watchers did not see the delete-and-recreate"
    finally:
        predecessor.stop()
        predecessor.close()
    # The predecessor's session ending must not take the new node with it.
    assert raw_zk.exists(registration.path).ephemeralOwner == client.session_id


def test_ensure_service_is_idempotent_and_refuses_conflicts(make_client, raw_zk):
    client = make_client()
    for policy in ("tenants", "regions"):
        client.shard_maps.create(policy, "hash", partitions=["p1"])
    spec = client.ensure_service(
        "orders", scheme="postgresql", shard_policy="tenants", defaults={"pool": 5}
    )
    assert (
        client.ensure_service(
            "orders", scheme="postgresql", shard_policy="tenants", defaults={"pool": 5}
        )
        == spec
    )
    _, stat = raw_zk.get("/services/orders")
    with pytest.raises(ServiceConflict, match="shard_policy='tenants'"):
        client.ensure_service("orders", scheme="postgresql", shard_policy="regions")
    # Marks cannot be turned on in place: publishers and readers would disagree.
    with pytest.raises(ServiceConflict, match=r"mark_departures=False; asked .*=True"):
        client.ensure_service(
            "orders",
            scheme="postgresql",
            shard_policy="tenants",
            defaults={"pool": 5},
            mark_departures=True,
        )
    assert raw_zk.get("/services/orders")[1].version == stat.version
    # An instance registered later keeps the spec as it was, and must agree with it.
    with pytest.raises(ValidationError, match="scheme 'postgresql'"):
        client.register("orders", "p1", "h", 5432, scheme="http")
    assert json.loads(raw_zk.get("/services/orders")[0])["scheme"] == "postgresql"
    assert raw_zk.get_children("/services/orders") == []


def test_an_instance_inherits_its_services_scheme(make_client, raw_zk):
    """Issue 24: without scheme=, an instance of a postgresql service is a postgresql://
    endpoint (it was advertised as http://), for this client and for one that did not
    create the service."""
    owner = make_client("owner")
    owner.ensure_service("orders-db", scheme="postgresql")
    for client in (owner, make_client("other")):
        registration = client.register(
            "orders-db", "p1", "127.0.0.1", 25999, label=client.client_id
        )
        assert registration.instance.scheme == "postgresql"
        assert json.loads(raw_zk.get(registration.path)[0])["scheme"] == "postgresql"
    endpoint = owner.get_service("orders-db", balancer=None)
    assert endpoint.uri.startswith("postgresql://127.0.0.1:25999")
    # A new service takes the scheme of its first instance; later ones inherit it.
    owner.register("cache", "p1", "10.0.0.1", 6379, scheme="redis", label="a")
    assert make_client("third").register("cache", "p1", "10.0.0.2", 6379).instance.scheme == "redis"


def test_a_scheme_other_than_the_services_is_refused_and_writes_nothing(make_client, raw_zk):
    client = make_client()
    client.ensure_service("orders-db", scheme="postgresql")
    with pytest.raises(ValidationError, match=r"scheme 'postgresql'.*scheme 'http'") as raised:
        client.register("orders-db", "p1", "10.0.0.5", 5432, scheme="http")
    assert "scheme='postgresql'" in str(raised.value)  # the fix, in the message
    assert raw_zk.get_children("/services/orders-db") == []
    assert client.registrations == ()
    # The same scheme given explicitly is accepted.
    client.register("orders-db", "p1", "10.0.0.5", 5432, scheme="postgresql")


def test_registration_reads_the_spec_once_per_service(make_client, raw_zk):
    """Inheriting the scheme costs the service's first registration one read; later
    registrations send exactly what they did before (the instance's create)."""
    client = make_client()
    client.ensure_service("orders-db", scheme="postgresql")
    first = _requests_sent(client, lambda: client.register("orders-db", "p1", "10.0.0.5", 5432))
    later = _requests_sent(client, lambda: client.register("orders-db", "p1", "10.0.0.6", 5432))
    assert first == ["GetData", "Create"]
    assert later == ["Create"]  # what every registration sent before the scheme was inherited


def test_read_service_returns_decodable_instances_and_counts_the_rest(make_client, raw_zk, caplog):
    client = make_client()
    client.register("api", "p1", "h", 80, label="good")
    raw_zk.create("/services/api/p1:garbage", b"\xff\x00not json")
    raw_zk.create("/services/api/p1:future", b'{"v": 99}')
    raw_zk.create("/services/api/no-separator", b"{}")
    with caplog.at_level(logging.WARNING, logger="sentinel.registry.reads"):
        listing = client.read_service("api")
    assert [i.label for i in listing.instances] == ["good"]
    assert listing.skipped == 3
    assert "p1:garbage" in caplog.text and "schema version 99" in caplog.text
    with pytest.raises(ServiceNotFound, match="'nothing'"):
        client.read_service("nothing")


BAD_REGISTRATIONS = [
    (dict(service="a/b"), InvalidName),
    (dict(service=""), InvalidName),
    (dict(service="s" * 129), InvalidName),
    (dict(partition="p/1"), InvalidName),
    (dict(partition=""), InvalidName),
    (dict(label="x" * 200), InvalidName),
    (dict(label="../x"), InvalidName),
    (dict(port=0), ValidationError),
    (dict(port=70000), ValidationError),
    (dict(port="5432"), ValidationError),
    (dict(host="bad host"), ValidationError),
    (dict(scheme="Not A Scheme"), ValidationError),
    (dict(status="maybe"), ValidationError),
    (dict(weight=-3), ValidationError),
    (dict(properties={"conn": object()}), ValidationError),
    (dict(properties={"lag": float("nan")}), ValidationError),
    (dict(properties={"blob": "x" * MAX_VALUE_BYTES}), ValueTooLarge),
]


@pytest.mark.parametrize(("overrides", "error"), BAD_REGISTRATIONS)
def test_bad_input_raises_a_typed_error_and_writes_nothing(make_client, raw_zk, overrides, error):
    client = make_client()
    arguments = dict(service="api", partition="p1", host="10.0.0.1", port=80)
    arguments.update(overrides)
    with pytest.raises(error):
        client.register(**arguments)
    assert raw_zk.get_children("/services") == []
    assert client.registrations == ()


def _deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def test_out_of_bounds_writes_are_validation_errors_and_write_nothing(make_client, raw_zk):
    """Issue 16: numbers past float range and deep nesting are refused before any write."""
    client = make_client("writer", announce=False)
    client.ensure_service("db")
    with pytest.raises(ValidationError):
        client.register("db", "p1", "10.0.0.1", 80, label="a", weight=10**400)
    with pytest.raises(ValidationError):
        client.register("db", "p1", "10.0.0.1", 80, label="a", properties={"x": _deep(5_000)})
    assert raw_zk.get_children("/services/db") == []
    with pytest.raises(ValidationError):
        client.update_metrics("db", "p1", "a", {"lag": 10**400})
    with pytest.raises(ValidationError):
        client.update_metrics("db", "p1", "a", {"lag": 1}, measured_at=10**400)
    assert not raw_zk.exists("/metrics/db/p1:a")


@pytest.mark.parametrize(
    ("kind", "settings", "declared"),
    [
        ("hash", dict(partitions=["p1", "p2"]), "p2"),
        ("directory", dict(partitions=["p1", "p2"]), "p1"),
        ("range", dict(boundaries=[("a", "p1"), ("m", "p2")]), "p2"),
    ],
)
def test_a_partition_the_shard_policy_does_not_declare_is_refused(
    make_client, raw_zk, kind, settings, declared
):
    """Issue 24: shard_maps.assign refuses an undeclared partition; so does a registration
    (no key could ever reach the instance)."""
    client = make_client()
    client.shard_maps.create("tenants", kind, **settings)
    client.ensure_service("orders-db", scheme="postgresql", shard_policy="tenants")
    with pytest.raises(ValidationError, match=r"'p9' is not one of policy 'tenants'"):
        client.register("orders-db", "p9", "10.0.0.5", 5432)
    assert raw_zk.get_children("/services/orders-db") == []
    client.register("orders-db", declared, "10.0.0.5", 5432)
    assert raw_zk.get_children("/services/orders-db") == [f"{declared}:10.0.0.5_5432"]


def test_metrics_are_refused_for_an_instance_nobody_registered(make_client, raw_zk):
    """Issue 24: update_metrics for an unregistered label created an orphan node; it is now
    refused, and the check rides in the write's own transaction (one request, as before)."""
    client = make_client()
    registration = client.register("db", "p1", "10.0.0.1", 5432, label="a")
    client.update_metrics(registration, {"lag": 1})  # the first one creates the node
    sent = _requests_sent(client, lambda: client.update_metrics(registration, {"lag": 2}))
    assert sent == ["Transaction"]
    assert json.loads(raw_zk.get("/metrics/db/p1:a")[0])["metrics"] == {"lag": 2}
    for partition, label in (("p1", "typo"), ("p2", "a")):
        with pytest.raises(InstanceNotRegistered, match=f"'{partition}:{label}' of service 'db'"):
            client.update_metrics("db", partition, label, {"lag": 1})
        assert raw_zk.exists(f"/metrics/db/{partition}:{label}") is None
