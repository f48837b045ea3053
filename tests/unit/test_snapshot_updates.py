"""ServiceSnapshot.updated: an incremental rebuild equals a full one and reuses what it can."""

from hypothesis import given, settings
from hypothesis import strategies as st
from sentinel.balancers import RoundRobin

from sentinel.cache import ServiceSnapshot
from sentinel.registry.records import MetricsRecord, ServiceSpec
from sentinel.telemetry import LookupCounts
from tests.unit.endpoints import endpoint

PARTITIONS = ["p1", "p2", "p3"]
LABELS = ["a", "b", "c", "d"]
NAMES = [f"{p}:{label}" for p in PARTITIONS for label in LABELS]


def bare(name, status, weight):
    partition, label = name.split(":")
    return endpoint(label, partition, status=status, weight=weight)


def metrics(name, lag):
    partition, label = name.split(":")
    return MetricsRecord("db", partition, label, {"lag": lag}, 1.0 + lag)


instance_change = st.tuples(
    st.just("endpoints"),
    st.sampled_from(NAMES),
    st.one_of(st.none(), st.tuples(st.sampled_from(["up", "down"]), st.integers(1, 2))),
)
metrics_change = st.tuples(
    st.just("metrics"), st.sampled_from(NAMES), st.one_of(st.none(), st.tuples(st.integers(0, 2)))
)
batches = st.lists(
    st.lists(st.one_of(instance_change, metrics_change), min_size=1, max_size=4),
    min_size=1,
    max_size=8,
)


def full_build(instances, records, invalid=frozenset()):
    return ServiceSnapshot.build(
        ServiceSpec("db"), instances, records, invalid, RoundRobin(), LookupCounts()
    )


@settings(max_examples=300)
@given(
    start=st.dictionaries(
        st.sampled_from(NAMES), st.tuples(st.sampled_from(["up", "down"]), st.integers(1, 2))
    ),
    batches=batches,
)
def test_updates_equal_a_full_build_and_keep_untouched_partitions(start, batches):
    instances = {name: bare(name, *state) for name, state in start.items()}
    records = {}
    snapshot = full_build(instances, records)
    for batch in batches:
        changes = {"endpoints": {}, "metrics": {}}
        for field, name, value in batch:
            current, make = (instances, bare) if field == "endpoints" else (records, metrics)
            if value is None:
                current.pop(name, None)
            else:
                value = current[name] = make(name, *value)
            changes[field][name] = value
        before = snapshot
        snapshot = before.updated(frozenset(), **changes)
        expected = full_build(instances, records)

        assert snapshot.endpoints == expected.endpoints
        assert snapshot.metrics == expected.metrics
        assert snapshot.partitions == expected.partitions
        assert snapshot.up == expected.up
        assert list(snapshot.partitions) == list(expected.partitions)
        touched = {name.split(":")[0] for field, name, _ in batch}
        for partition in set(before.partitions) - touched - {None}:
            # Not a copy: the very objects a memo keyed by identity already knows.
            assert snapshot.partitions.get(partition) is before.partitions[partition]
            assert snapshot.up.get(partition) is before.up[partition]
        for name in before.endpoints.keys() & snapshot.endpoints.keys():
            if name.split(":")[0] not in touched:
                assert snapshot.endpoints[name] is before.endpoints[name]


def test_an_update_that_changes_nothing_returns_the_same_snapshot():
    instances = {name: bare(name, "up", 1) for name in NAMES[:3]}
    snapshot = full_build(instances, {"p1:a": metrics("p1:a", 1)})
    same = snapshot.updated(
        frozenset(),
        endpoints={"p1:b": bare("p1:b", "up", 1), "p9:x": None},
        metrics={"p1:a": metrics("p1:a", 1), "p1:c": None},
    )
    assert same is snapshot


def test_one_partition_shares_its_tuple_with_the_key_none():
    snapshot = full_build({name: bare(name, "up", 1) for name in NAMES[:4]}, {})
    assert snapshot.partitions[None] is snapshot.partitions["p1"]
    assert snapshot.up[None] is snapshot.up["p1"]
    updated = snapshot.updated(frozenset(), metrics={"p1:b": metrics("p1:b", 2)})
    assert updated.partitions[None] is updated.partitions["p1"]
    assert [e.label for e in updated.up[None]] == ["a", "b", "c", "d"]
    assert updated.endpoints["p1:b"].metrics == {"lag": 2}


def test_invalid_paths_alone_make_a_new_snapshot_with_the_same_tuples():
    snapshot = full_build({name: bare(name, "up", 1) for name in NAMES[:4]}, {})
    marked = snapshot.updated(frozenset({"/metrics/db/p1:z"}), metrics={"p1:z": None})
    assert marked is not snapshot and marked.invalid == {"/metrics/db/p1:z"}
    assert marked.partitions is snapshot.partitions and marked.up is snapshot.up
