"""The cache's views on values alone: what a snapshot attaches and indexes, what the events
between two snapshots say, and the key changes of a directory map."""

import time

from sentinel.balancers import RoundRobin

from sentinel.auth.envelope import Credential
from sentinel.cache.views import (
    ServiceSnapshot,
    directory_keys,
    endpoint_events,
    key_changes,
)
from sentinel.events import InstancesChanged, MetricsChanged
from sentinel.registry.records import MetricsRecord, ServiceSpec
from sentinel.shards.maps import DirectoryMap, new_map
from sentinel.shards.spec import ShardPolicySpec
from sentinel.telemetry import LookupCounts
from tests.unit.endpoints import endpoint

SPEC = ServiceSpec("db")
AUTH = Credential(3, {"user": "u", "password": "p"})


def _record(name, lag, at=5.0):
    partition, label = name.split(":")
    return MetricsRecord("db", partition, label, {"lag": lag}, at)


def _snapshot(names=("p1:a", "p1:b", "p2:c"), metrics=(), auth=None, down=()):
    endpoints = {n: endpoint(n[3:], n[:2], status="down" if n in down else "up") for n in names}
    return ServiceSnapshot.first(
        SPEC, endpoints, {f"{r.partition}:{r.label}": r for r in metrics}, frozenset(), auth
    )


def test_build_attaches_each_instances_metrics_and_the_credential_and_indexes_by_partition():
    snapshot = _snapshot(metrics=[_record("p1:a", 7, at=4.5)], auth=AUTH, down={"p1:b"})
    a, b, c = (snapshot.endpoints[n] for n in ("p1:a", "p1:b", "p2:c"))
    assert (dict(a.metrics), a.metrics_at) == ({"lag": 7}, 4.5)
    assert (dict(b.metrics), b.metrics_at) == ({}, None)
    assert a.auth is AUTH and b.auth is AUTH and c.auth is AUTH
    assert snapshot.spec is SPEC and snapshot.auth is AUTH and snapshot.invalid == frozenset()
    assert snapshot.partitions == {None: (a, b, c), "p1": (a, b), "p2": (c,)}
    assert snapshot.up == {None: (a, c), "p1": (a,), "p2": (c,)}
    assert dict(snapshot.metrics) == {"p1:a": _record("p1:a", 7, at=4.5)}


def test_a_first_snapshot_starts_its_balancer_and_counter_and_rebuilt_carries_them():
    before = time.time()
    first = _snapshot()
    assert isinstance(first.balancer, RoundRobin) and isinstance(first.lookups, LookupCounts)
    assert before <= first.built_at <= time.time()
    assert _snapshot().balancer is not first.balancer  # one per service
    spec = ServiceSpec("db", scheme="https")
    again = first.rebuilt(spec=spec, auth=AUTH)
    assert again.spec is spec and again.auth is AUTH
    assert again.balancer is first.balancer and again.lookups is first.lookups
    assert again.endpoints["p1:a"].auth is AUTH and first.endpoints["p1:a"].auth is None
    assert again.endpoints.keys() == first.endpoints.keys()


def test_an_update_carries_the_credential_and_stamps_the_time():
    snapshot = _snapshot(auth=AUTH)
    later = snapshot.updated(frozenset({"/bad"}), endpoints={"p1:d": endpoint("d", "p1")})
    assert later.endpoints["p1:d"].auth is AUTH
    assert later.invalid == frozenset({"/bad"}) and later.built_at >= snapshot.built_at
    assert [e.label for e in later.partitions["p1"]] == ["a", "b", "d"]


def test_a_metrics_record_of_no_instance_is_kept_with_the_new_invalid_set_and_time():
    snapshot = _snapshot()
    orphan = _record("p9:z", 1)
    later = snapshot.updated(frozenset({"/x"}), metrics={"p9:z": orphan})
    assert later is not snapshot and later.endpoints is snapshot.endpoints
    assert later.metrics["p9:z"] == orphan and later.invalid == frozenset({"/x"})
    assert later.built_at is not None and later.built_at >= snapshot.built_at
    assert snapshot.updated(snapshot.invalid) is snapshot  # nothing changed: itself


def test_a_metrics_change_attaches_its_time_and_values():
    snapshot = _snapshot(metrics=[_record("p1:a", 1, at=1.0)])
    later = snapshot.updated(snapshot.invalid, metrics={"p1:a": _record("p1:a", 2, at=2.0)})
    a = later.endpoints["p1:a"]
    assert (dict(a.metrics), a.metrics_at) == ({"lag": 2}, 2.0)
    assert later.partitions["p2"] is snapshot.partitions["p2"]  # untouched: the same tuple


def test_removing_a_partitions_last_instance_removes_the_partition():
    snapshot = _snapshot()
    later = snapshot.updated(snapshot.invalid, endpoints={"p2:c": None})
    assert set(later.partitions) == {None, "p1"} and set(later.up) == {None, "p1"}
    assert [e.label for e in later.partitions[None]] == ["a", "b"]


def test_the_events_between_two_endpoint_maps():
    old = _snapshot(metrics=[_record("p1:a", 1)])
    new = old.updated(
        old.invalid,
        endpoints={
            "p1:b": None,
            "p1:d": endpoint("d", "p1"),
            "p2:c": endpoint("c", "p2", weight=3),
        },
        metrics={"p1:a": _record("p1:a", 2)},
    )
    instances, metrics = endpoint_events("db", old.endpoints, new.endpoints)
    assert instances == InstancesChanged(
        "db",
        added=(new.endpoints["p1:d"],),
        removed=(old.endpoints["p1:b"],),
        updated=((old.endpoints["p2:c"], new.endpoints["p2:c"]),),
    )
    assert metrics == MetricsChanged("db", ((old.endpoints["p1:a"], new.endpoints["p1:a"]),))
    # Metrics alone: one event; a new credential alone: none (AuthChanged tells it).
    assert [
        type(e)
        for e in endpoint_events(
            "db", old.endpoints, {**old.endpoints, "p1:a": new.endpoints["p1:a"]}
        )
    ] == [MetricsChanged]
    assert endpoint_events("db", old.endpoints, old.rebuilt(auth=AUTH).endpoints) == []
    assert endpoint_events("db", old.endpoints, old.endpoints) == []


def test_key_changes_name_every_key_that_moved_appeared_or_went():
    old = {"a": "p1", "b": "p1", "c": "p2"}
    new = {"a": "p1", "b": "p2", "d": "p3"}
    assert key_changes(old, new) == {"b": ("p1", "p2"), "c": ("p2", None), "d": (None, "p3")}
    assert key_changes(old, old) == {}
    assert key_changes({}, new) == {"a": (None, "p1"), "b": (None, "p2"), "d": (None, "p3")}


def test_only_a_directory_map_has_keys_to_diff():
    directory = new_map(ShardPolicySpec("t", "directory", buckets=4))
    assert isinstance(directory, DirectoryMap)
    directory.apply_bucket(0, {"k": "p1"})
    assert directory_keys(directory) == {"k": "p1"}
    assert directory_keys(new_map(ShardPolicySpec("h", "hash", partitions=("p1",)))) == {}
    assert directory_keys(None) == {}


def test_each_kind_of_change_alone_is_told():
    old = _snapshot(metrics=[_record("p1:a", 1, at=1.0)])
    e = old.endpoints
    added = old.updated(old.invalid, endpoints={"p1:d": endpoint("d", "p1")}).endpoints
    removed = old.updated(old.invalid, endpoints={"p1:b": None}).endpoints
    # the last instance changes while those before it do not: every name is compared
    weighed = old.updated(old.invalid, endpoints={"p2:c": endpoint("c", "p2", weight=3)})
    # the same values measured again: a metrics change, not an instance change
    remeasured = old.updated(old.invalid, metrics={"p1:a": _record("p1:a", 1, at=9.0)})
    assert endpoint_events("db", e, added) == [InstancesChanged("db", added=(added["p1:d"],))]
    assert endpoint_events("db", e, removed) == [InstancesChanged("db", removed=(e["p1:b"],))]
    assert endpoint_events("db", e, weighed.endpoints) == [
        InstancesChanged("db", updated=((e["p2:c"], weighed.endpoints["p2:c"]),))
    ]
    assert endpoint_events("db", e, remeasured.endpoints) == [
        MetricsChanged("db", ((e["p1:a"], remeasured.endpoints["p1:a"]),))
    ]


def test_a_rebuild_keeps_the_endpoints_it_does_not_change(monkeypatch):
    first = _snapshot(metrics=[_record("p1:a", 1)])
    again = first.rebuilt(spec=ServiceSpec("db", scheme="https"))
    assert all(again.endpoints[n] is first.endpoints[n] for n in first.endpoints)
    # and every new snapshot is stamped with the time it was built
    monkeypatch.setattr("sentinel.cache.views.time.time", lambda: 123.0)
    assert first.updated(frozenset({"/x"}), metrics={"p9:z": _record("p9:z", 1)}).built_at == 123.0
    assert first.updated(first.invalid, endpoints={"p1:b": None}).built_at == 123.0
