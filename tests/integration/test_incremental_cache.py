"""A change costs what it touches: the cache rebuilds only the partition a change is in.

Correctness, not timing: untouched partitions keep the very tuples (and endpoints) they had,
listeners hear exactly what changed, a pure policy's memo is recomputed for the changed
partition only, and after additions, removals and status changes the incrementally kept
snapshot equals the one a fresh client loads.
"""

import pytest
from sentinel.policies import SelectionPolicy

from sentinel.events import InstancesChanged, MetricsChanged
from tests.integration.recorder import Recorder

pytestmark = pytest.mark.integration


def sharded_world(publisher, per_partition=3):
    """Service ``db`` over p1 and p2 (key k1 -> p1, k2 -> p2), metrics on every instance."""
    publisher.shard_maps.create("tenants", "directory", partitions=["p1", "p2"])
    publisher.ensure_service("db", scheme="postgresql", shard_policy="tenants")
    publisher.shard_maps.assign_many("tenants", {"k1": "p1", "k2": "p2"})
    registrations = {}
    for partition in ("p1", "p2"):
        for r in range(per_partition):
            label = f"r{r}"
            registrations[partition, label] = publisher.register(
                "db", partition, f"10.0.{partition[1]}.{r}", 5432, label=label
            )
            publisher.update_metrics("db", partition, label, {"lag": 0})
    return registrations


def view(snapshot):
    """What a snapshot serves, by partition key, in order (None: every instance)."""
    return {
        index: {p: [(e.name, e.status, dict(e.metrics)) for e in t] for p, t in table.items()}
        for index, table in (("partitions", snapshot.partitions), ("up", snapshot.up))
    }


def test_a_metric_change_leaves_other_partitions_identical_and_diffs_exactly(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    sharded_world(publisher)
    client.prefetch("db")
    recorder = Recorder()
    client.listen("db", recorder)
    before = client._snapshots["db"]

    publisher.update_metrics("db", "p1", "r1", {"lag": 7})
    (event,) = recorder.wait_for(1)
    after = client._snapshots["db"]

    assert isinstance(event, MetricsChanged)
    ((old, new),) = event.updated
    assert old is before.endpoints["p1:r1"] and new is after.endpoints["p1:r1"]
    assert (dict(old.metrics), dict(new.metrics)) == ({"lag": 0}, {"lag": 7})
    # The other partition: the same tuples and endpoints, not equal copies.
    assert after.partitions["p2"] is before.partitions["p2"]
    assert after.up["p2"] is before.up["p2"]
    for label in ("r0", "r1", "r2"):
        assert after.endpoints[f"p2:{label}"] is before.endpoints[f"p2:{label}"]
    # In the changed partition only the changed endpoint is new, in its place.
    assert after.partitions["p1"] is not before.partitions["p1"]
    assert [e.label for e in after.up["p1"]] == ["r0", "r1", "r2"]
    assert after.up["p1"][0] is before.up["p1"][0] and after.up["p1"][2] is before.up["p1"][2]
    assert after.partitions[None] == after.partitions["p1"] + after.partitions["p2"]

    # A second change, in p2, is the next event and the only other one: nothing spurious.
    publisher.update_metrics("db", "p2", "r0", {"lag": 3})
    first, second = recorder.wait_for(2)
    assert first is event and isinstance(second, MetricsChanged)
    assert [(o.name, n.metrics["lag"]) for o, n in second.updated] == [("p2:r0", 3)]
    assert client._snapshots["db"].partitions["p1"] is after.partitions["p1"]


class CountingPolicy(SelectionPolicy):
    """A pure policy that notes the partition of each input it is asked to filter."""

    pure = True

    def __init__(self):
        self.calls = []

    def select(self, endpoints):
        self.calls.append(endpoints[0].partition)
        return endpoints


def test_memoized_policy_results_are_recomputed_for_the_changed_partition_only(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    sharded_world(publisher)
    recorder = Recorder()
    policy = CountingPolicy()
    for key in ("k1", "k2", "k1", "k2"):
        client.get_service("db", key, policy=policy)
    assert policy.calls == ["p1", "p2"]  # computed once per partition, then reused
    client.listen("db", recorder)

    publisher.update_metrics("db", "p2", "r2", {"lag": 9})
    recorder.wait(lambda e: isinstance(e, MetricsChanged))
    for key in ("k1", "k2", "k1", "k2"):
        client.get_service("db", key, policy=policy)
    assert policy.calls == ["p1", "p2", "p2"]
    assert client.eligible_instances("db", "k2", policy=policy)[2].metrics == {"lag": 9}


def test_instance_changes_in_a_partition_match_a_fresh_load(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    registrations = sharded_world(publisher)
    client.prefetch("db")
    recorder = Recorder()
    client.listen("db", recorder)
    start = client._snapshots["db"]

    publisher.register("db", "p1", "10.0.1.9", 5432, label="new")
    added = recorder.wait(lambda e: isinstance(e, InstancesChanged) and e.added)
    assert [e.name for e in added.added] == ["p1:new"] and not added.removed
    snapshot = client._snapshots["db"]
    assert [e.label for e in snapshot.partitions["p1"]] == ["new", "r0", "r1", "r2"]
    assert snapshot.partitions["p2"] is start.partitions["p2"]
    assert "p1:new" in {e.name for e in client.eligible_instances("db", "k1")}

    publisher.register("db", "p1", "10.0.1.0", 5432, label="r0", status="down")
    updated = recorder.wait(lambda e: isinstance(e, InstancesChanged) and e.updated)
    assert [(o.status, n.status, n.name) for o, n in updated.updated] == [("up", "down", "p1:r0")]
    snapshot = client._snapshots["db"]
    assert [e.label for e in snapshot.up["p1"]] == ["new", "r1", "r2"]
    assert "p1:r0" in {e.name for e in snapshot.partitions["p1"]}

    for label in ("r1", "r2"):
        publisher.deregister(registrations["p2", label])
    recorder.wait(
        lambda e: isinstance(e, InstancesChanged) and [x.name for x in e.removed] == ["p2:r2"]
    )
    publisher.deregister(registrations["p2", "r0"])
    recorder.wait(
        lambda e: isinstance(e, InstancesChanged) and [x.name for x in e.removed] == ["p2:r0"]
    )
    snapshot = client._snapshots["db"]
    assert "p2" not in snapshot.partitions and "p2" not in snapshot.up  # the partition is empty
    assert snapshot.partitions[None] is snapshot.partitions["p1"]

    fresh = make_client("fresh")
    fresh.prefetch("db")
    assert view(client._snapshots["db"]) == view(fresh._snapshots["db"])
    assert client._snapshots["db"].metrics.keys() == fresh._snapshots["db"].metrics.keys()
