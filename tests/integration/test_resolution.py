"""get_service against a real ZooKeeper: the three shard kinds, Procedure 1, errors, diffs."""

import json
import threading

import pytest
from sentinel.balancers import Balancer
from sentinel.policies import SelectionPolicy

from sentinel.cache.config import CacheConfig
from sentinel.errors import (
    ClientClosed,
    InvalidName,
    NoInstanceAvailable,
    PartitionNotFound,
    ResolutionError,
    ServiceNotFound,
    ShardPolicyExists,
    ShardPolicyNotFound,
    ValidationError,
)
from sentinel.events import InstancesChanged, ServiceSpecChanged, ShardKeysChanged
from sentinel.registry.records import ServiceSpec
from sentinel.testing.helpers import expire_session, wait_until
from tests.integration.recorder import Recorder

pytestmark = pytest.mark.integration


def make_replicas(publisher, service, partitions, per_partition=2, policy=None):
    publisher.ensure_service(service, scheme="postgresql", shard_policy=policy)
    return {
        (p, r): publisher.register(
            service, p, f"10.0.{i}.{r}", 5432, scheme="postgresql", label=f"r{r}"
        )
        for i, p in enumerate(partitions)
        for r in range(per_partition)
    }


def test_unsharded_service_round_robins_over_up_instances(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.register("api", "p1", "h1", 80, label="a")
    publisher.register("api", "p2", "h2", 80, label="b")
    publisher.register("api", "p3", "h3", 80, label="c", status="down")
    picks = [client.get_service("api").label for _ in range(6)]
    assert sorted(picks) == ["a", "a", "a", "b", "b", "b"]
    assert picks[0] != picks[1]
    assert client.get_service("api", key="ignored").label in {"a", "b"}
    endpoint = client.get_service("api")
    assert endpoint.uri == f"http://{endpoint.host}:80" and endpoint.auth is None
    assert [e.label for e in client.eligible_instances("api")] == ["a", "b"]


def test_directory_policy_resolves_keys_to_their_partition(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.shard_maps.create("tenants", "directory", partitions=["p1", "p2"], buckets=16)
    make_replicas(publisher, "orders", ["p1", "p2"], policy="tenants")
    publisher.shard_maps.assign_many("tenants", {"acme": "p1", "globex": "p2", 42: "p2"})
    assert client.get_service("orders", "acme").partition == "p1"
    assert client.get_service("orders", "globex").partition == "p2"
    assert client.get_service("orders", 42).partition == "p2"
    assert {e.label for e in client.eligible_instances("orders", "acme")} == {"r0", "r1"}


def test_range_policy_resolves_by_lower_bound(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.shard_maps.create(
        "ids", "range", boundaries=[(0, "low"), (1000, "high")], key_type="int"
    )
    make_replicas(publisher, "events", ["low", "high"], policy="ids")
    assert client.get_service("events", 7).partition == "low"
    assert client.get_service("events", "999").partition == "low"
    assert client.get_service("events", 1000).partition == "high"
    with pytest.raises(PartitionNotFound, match=r"key -1 .*below the first boundary"):
        client.get_service("events", -1)


def test_hash_policy_spreads_keys_over_its_partitions(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.shard_maps.create("spread", "hash", partitions=["h0", "h1", "h2"])
    make_replicas(publisher, "cache", ["h0", "h1", "h2"], per_partition=1, policy="spread")
    seen = {client.get_service("cache", f"user-{i}").partition for i in range(200)}
    assert seen == {"h0", "h1", "h2"}
    assert (
        client.get_service("cache", "user-7").partition
        == client.get_service("cache", "user-7").partition
    )


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("directory", {"partitions": ["p1", "p2"], "buckets": 4}),
        ("range", {"boundaries": [(0, "p1"), (1000, "p2")], "key_type": "int"}),
        ("range", {"boundaries": [("0", "p1"), ("5", "p2")]}),
        ("hash", {"partitions": ["p1", "p2"]}),
    ],
)
def test_one_key_rule_for_every_shard_kind(make_client, kind, options):
    """Issue 16 item 2: no key is PartitionNotFound and only str and int keys are accepted,
    whatever the policy's kind; the map is never consulted for a refused key."""
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.shard_maps.create("keys", kind, **options)
    make_replicas(publisher, "svc", ["p1", "p2"], per_partition=1, policy="keys")
    if kind == "directory":
        publisher.shard_maps.assign_many("keys", {"7": "p1", "12": "p2"})
    assert client.get_service("svc", 7).partition == client.get_service("svc", "7").partition
    assert client.get_service("svc", 12).partition == client.get_service("svc", "12").partition
    for call in (
        client.get_service,
        client.eligible_instances,
        client.partition_of,
        client.explain,
    ):
        with pytest.raises(PartitionNotFound, match="a key is required"):
            call("svc", None)
        for wrong in (True, False, 3.5, b"7", ("7",)):
            with pytest.raises(ValidationError, match="must be a str or an int"):
                call("svc", wrong)
    assert client.lookup_counts[("svc", "ok")] == 4


def test_key_changes_propagate_through_the_watch(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.shard_maps.create("tenants", "directory", buckets=8)
    make_replicas(publisher, "orders", ["p1", "p2"], policy="tenants")
    publisher.shard_maps.assign("tenants", "acme", "p1")
    assert client.get_service("orders", "acme").partition == "p1"
    recorder = Recorder()
    client.listen("orders", recorder)
    publisher.shard_maps.assign("tenants", "acme", "p2")
    event = recorder.wait(lambda e: isinstance(e, ShardKeysChanged))
    assert event.changes == {"acme": ("p1", "p2")} and event.policy == "tenants"
    assert client.get_service("orders", "acme").partition == "p2"
    publisher.shard_maps.unassign("tenants", "acme")
    recorder.wait(lambda e: isinstance(e, ShardKeysChanged) and e.changes == {"acme": ("p2", None)})
    with pytest.raises(PartitionNotFound, match="'acme'"):
        client.get_service("orders", "acme")


def test_procedure_1_reads_through_without_writing_the_cache(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.shard_maps.create("tenants", "directory", buckets=8)
    make_replicas(publisher, "orders", ["p1", "p2"], policy="tenants")
    publisher.shard_maps.assign("tenants", "first", "p1")
    client.get_service("orders", "first")

    # Hold the cache's worker inside a listener, so the next watch event cannot land yet.
    worker_busy, release = threading.Event(), threading.Event()

    def block(event):
        if isinstance(event, ShardKeysChanged) and "blocker" in event.changes:
            worker_busy.set()
            release.wait(10)

    client.listen("orders", block)
    publisher.shard_maps.assign("tenants", "blocker", "p1")
    assert worker_busy.wait(10)
    try:
        publisher.shard_maps.assign("tenants", "late", "p2")
        reads_before = client.cache_stats.read_throughs
        assert client.get_service("orders", "late").partition == "p2"
        assert client.cache_stats.read_throughs == reads_before + 1
        assert client._shard_maps["tenants"].lookup("late") is None, "read-through wrote cache"
    finally:
        release.set()
    assert wait_until(lambda: client._shard_maps["tenants"].lookup("late") == "p2")
    reads = client.cache_stats.read_throughs
    assert client.get_service("orders", "late").partition == "p2"
    assert client.cache_stats.read_throughs == reads


def test_negative_cache_bounds_reads_of_unknown_keys(make_client):
    publisher = make_client("publisher")
    client = make_client("reader", cache=CacheConfig(negative_ttl=0.3))
    publisher.shard_maps.create("tenants", "directory", buckets=4)
    make_replicas(publisher, "orders", ["p1"], policy="tenants")
    for _ in range(100):
        with pytest.raises(PartitionNotFound):
            client.get_service("orders", "ghost")
    stats = client.cache_stats
    assert (stats.read_throughs, stats.negative_hits) == (1, 99)
    # Once the entry expires, the next miss asks ZooKeeper again.
    assert wait_until(lambda: _misses_again(client), timeout=5)


def _misses_again(client):
    before = client.cache_stats.read_throughs
    with pytest.raises(PartitionNotFound):
        client.get_service("orders", "ghost")
    return client.cache_stats.read_throughs == before + 1


def test_typed_errors_name_service_key_and_partition(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.shard_maps.create("tenants", "directory", partitions=["p1", "p2"])
    make_replicas(publisher, "orders", ["p1"], policy="tenants")
    publisher.shard_maps.assign_many("tenants", {"acme": "p1", "empty-co": "p2"})
    with pytest.raises(ServiceNotFound, match="'nothing'") as raised:
        client.get_service("nothing")
    assert fields(raised.value) == ("nothing", None, None, None)
    with pytest.raises(InvalidName):
        client.get_service("bad/name")
    with pytest.raises(
        PartitionNotFound, match=r"service 'orders'.*key 'unknown'.*'tenants'"
    ) as raised:
        client.get_service("orders", "unknown")
    assert fields(raised.value) == ("orders", "unknown", None, None)
    assert raised.value.shard_policy == "tenants"
    # It names the command that assigns the key, filled in (issue 39).
    assert "`sentinel shard assign unknown PARTITION --policy tenants`" in str(raised.value)
    with pytest.raises(PartitionNotFound, match="a key is required"):
        client.get_service("orders")
    with pytest.raises(
        NoInstanceAvailable, match="'orders', key 'empty-co', partition 'p2'"
    ) as raised:
        client.get_service("orders", "empty-co")
    assert fields(raised.value) == ("orders", "empty-co", "p2", None)

    class NoneEligible(SelectionPolicy):
        def select(self, endpoints):
            return ()

    refusing = NoneEligible()
    with pytest.raises(
        NoInstanceAvailable, match=r"2 instance\(s\) but none is eligible"
    ) as raised:
        client.get_service("orders", "acme", policy=refusing)
    assert fields(raised.value) == ("orders", "acme", "p1", refusing)


def fields(error: ResolutionError) -> tuple[object, ...]:
    return error.service, error.key, error.partition, error.policy


def test_policies_and_balancers_plug_in(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.register("api", "p1", "h1", 80, label="a", zone="z1")
    publisher.register("api", "p1", "h2", 80, label="b", zone="z2")
    publisher.register("api", "p1", "h3", 80, label="c", zone="z2", status="down")

    class Last(Balancer):
        def pick(self, endpoints):
            return endpoints[-1]

    def in_zone_2(endpoints):
        return tuple(e for e in endpoints if e.zone == "z2")

    assert client.get_service("api", balancer=Last()).label == "b"
    # A policy filters the up instances: "c" is in zone 2 but down, so it is never offered.
    assert [e.label for e in client.eligible_instances("api", policy=in_zone_2)] == ["b"]
    from sentinel.policies import AllUp

    assert [e.label for e in client.eligible_instances("api", policy=AllUp() & in_zone_2)] == ["b"]
    assert client.get_service("api", policy=in_zone_2, balancer=Last()).label == "b"


def test_listeners_receive_exact_instance_diffs(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    first = publisher.register("api", "p1", "h1", 80, label="a")
    client.get_service("api")
    recorder = Recorder()
    client.listen("api", recorder)
    second = publisher.register("api", "p1", "h2", 80, label="b")
    added = recorder.wait(lambda e: isinstance(e, InstancesChanged) and e.added)
    assert [e.label for e in added.added] == ["b"] and not added.removed and not added.updated
    publisher.register("api", "p1", "h1", 80, label="a", status="down")
    updated = recorder.wait(lambda e: isinstance(e, InstancesChanged) and e.updated)
    ((old, new),) = updated.updated
    assert (old.status, new.status, new.label) == ("up", "down", "a")
    publisher.deregister(second)
    removed = recorder.wait(lambda e: isinstance(e, InstancesChanged) and e.removed)
    assert [e.label for e in removed.removed] == ["b"]
    # Only "a" is left, and it is down: known but not eligible.
    with pytest.raises(NoInstanceAvailable, match=r"1 instance\(s\) but none is eligible"):
        client.eligible_instances("api")
    publisher.deregister(first)
    recorder.wait(
        lambda e: isinstance(e, InstancesChanged) and e.removed and e.removed[0].label == "a"
    )
    with pytest.raises(NoInstanceAvailable, match="no live instance"):
        client.get_service("api")


def test_spec_changes_and_service_removal_reach_listeners(make_client, raw_zk):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.ensure_service("api", scheme="http")
    publisher.register("api", "p1", "h", 80)
    client.get_service("api")
    recorder = Recorder()
    client.listen(None, recorder)
    raw_zk.set(
        "/services/api",
        json.dumps(
            {"v": 1, "scheme": "https", "shard_policy": None, "defaults": {"pool": 3}}
        ).encode(),
    )
    changed = recorder.wait(lambda e: isinstance(e, ServiceSpecChanged))
    assert (changed.old.scheme, changed.new.scheme) == ("http", "https")
    publisher.close()
    raw_zk.delete("/services/api", recursive=True)
    recorder.wait(lambda e: isinstance(e, ServiceSpecChanged) and e.new is None)
    with pytest.raises(ServiceNotFound):
        client.get_service("api")


def test_clients_node_records_the_user_and_survives_expiry(make_client, raw_zk):
    publisher = make_client("publisher")
    client = make_client("billing-api", session_timeout=4.0)
    publisher.register("api", "p1", "h", 80)
    client.get_service("api")
    data, stat = raw_zk.get("/clients/api/billing-api")
    document = json.loads(data)
    assert stat.ephemeralOwner == client.session_id
    assert document["client_id"] == "billing-api" and document["auth_version"] is None
    assert {"host", "pid", "started", "sentinel_version"} <= document.keys()
    old = expire_session(client)
    assert wait_until(
        lambda: (
            (raw_zk.exists("/clients/api/billing-api") or None)
            and raw_zk.exists("/clients/api/billing-api").ephemeralOwner not in (0, old)
        ),
        timeout=10,
    )


def test_shard_writer_rejects_bad_input_and_writes_nothing(make_client, raw_zk):
    publisher = make_client("publisher")
    publisher.shard_maps.create("tenants", "directory", partitions=["p1"], buckets=4)
    publisher.shard_maps.create("spread", "hash", partitions=["a"])
    before = {
        n: raw_zk.get(f"/shard_info/tenants/{n}")[1].version
        for n in raw_zk.get_children("/shard_info/tenants")
    }
    with pytest.raises(ValidationError, match="not one of"):
        publisher.shard_maps.assign_many("tenants", {"ok": "p1", "bad": "p9"})
    with pytest.raises(ValidationError, match="shard key"):
        publisher.shard_maps.assign("tenants", "", "p1")
    with pytest.raises(ValidationError, match="hash policy"):
        publisher.shard_maps.assign("spread", "k", "a")
    with pytest.raises(ShardPolicyNotFound):
        publisher.shard_maps.assign("nope", "k", "p1")
    with pytest.raises(ShardPolicyExists):
        publisher.shard_maps.create("tenants", "directory")
    with pytest.raises(ValidationError):
        publisher.shard_maps.create("broken", "range", boundaries=[("b", "p1"), ("a", "p2")])
    assert raw_zk.exists("/shard_info/broken") is None
    after = {
        n: raw_zk.get(f"/shard_info/tenants/{n}")[1].version
        for n in raw_zk.get_children("/shard_info/tenants")
    }
    assert after == before


def test_bulk_updates_split_into_transactions_and_survive_races(make_client, raw_zk):
    publisher, other = make_client("publisher"), make_client("other-writer")
    publisher.shard_maps.create("tenants", "directory", buckets=64)
    mapping = {f"tenant-{i:06d}": f"p{i % 4}" for i in range(60_000)}
    written = publisher.shard_maps.assign_many("tenants", mapping)
    assert written == 64
    # A second writer racing on the same buckets: compare-and-set makes both changes stick.
    threads = [
        threading.Thread(
            target=writer.shard_maps.assign_many,
            args=("tenants", {f"{name}-{i}": "p9" for i in range(300)}),
        )
        for name, writer in (("a", publisher), ("b", other))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    from sentinel.shards.store import iter_assignments

    stored = dict(iter_assignments(raw_zk, "tenants"))
    assert len(stored) == 60_600
    assert all(stored[f"{n}-{i}"] == "p9" for n in "ab" for i in range(300))


def test_a_closed_client_refuses_lookups_even_of_loaded_services(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.register("api", "p1", "h", 80)
    client.get_service("api")
    client.close()
    with pytest.raises(ClientClosed):
        client.get_service("api")
    with pytest.raises(ClientClosed):
        client.eligible_instances("other")


def test_a_policy_created_after_the_service_loaded_is_picked_up(make_client, raw_zk):
    publisher, client = make_client("publisher"), make_client("reader")
    # ensure_service refuses a policy that does not exist, but a spec naming one can still be
    # met (written by another program, or its policy deleted since): written here directly,
    # once a writer has made the sections (starting a client no longer does).
    publisher.ensure_namespace()
    path = "/services/orders"
    raw_zk.create(path, ServiceSpec("orders", "postgresql", "later").to_bytes(path))
    publisher.register("orders", "p1", "10.0.0.1", 5432, scheme="postgresql")
    with pytest.raises(
        PartitionNotFound, match="'later' does not exist; `sentinel shard create-policy later"
    ):
        client.get_service("orders", "acme")
    recorder = Recorder()
    client.listen("orders", recorder)
    publisher.shard_maps.create("later", "directory", buckets=4)
    publisher.shard_maps.assign("later", "acme", "p1")
    recorder.wait(lambda e: isinstance(e, ShardKeysChanged) and "acme" in e.changes)
    reads = client.cache_stats.read_throughs
    assert client.get_service("orders", "acme").partition == "p1"
    assert client.cache_stats.read_throughs == reads, "answered from the cache, not a read"
