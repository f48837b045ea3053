"""Hostile data against a running client: any bytes and shapes in every section (wrong types,
unicode names, huge children lists, deep paths, nodes that appear and vanish between the
listing and the read). The client never crashes or stops following, and the valid part (one
instance, one shard key) is served throughout."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from sentinel.policies import MinLag

import sentinel.cache.reads
from sentinel import Sentinel
from sentinel.shards.spec import bucket_of, bucket_path
from sentinel.testing.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults]

BUCKETS = 4
GOOD_KEY = "k-good"
SECTIONS = ("/services/svc", "/metrics/svc", "/shard_info/tenants", "/clients/svc", "/auth/svc")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
not_a_string = st.none() | st.integers() | st.lists(st.integers(), max_size=3)
not_an_int = st.none() | st.text(max_size=5) | st.floats(allow_nan=False)
# Version 1 with fields of the wrong types, other versions with anything, and raw bytes.
documents = st.one_of(
    st.fixed_dictionaries(
        {"v": st.just(1), "host": not_a_string, "port": not_an_int, "scheme": not_a_string}
    ),
    st.fixed_dictionaries(
        {"v": st.just(1), "partitions": json_values, "kind": not_a_string, "metrics": not_an_int}
    ),
    st.fixed_dictionaries(
        {"v": st.sampled_from([0, 2, "1", None, 1.5, [1]])},
        optional={
            "host": json_values,
            "port": json_values,
            "partitions": json_values,
        },
    ),
    json_values,
)
payloads = st.binary(max_size=300) | documents.map(lambda d: json.dumps(d).encode())
# ZooKeeper refuses some code points in names; a hostile writer cannot write those either.
names = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Co", "Cn"), blacklist_characters="/"),
    min_size=1,
    max_size=40,
).filter(lambda n: n not in (".", "..") and "good" not in n)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("node"), st.sampled_from(SECTIONS), names, payloads),
        st.tuples(st.just("spec"), st.sampled_from(SECTIONS[:1] + SECTIONS[2:3]), payloads),
        st.tuples(st.just("bucket"), st.integers(0, BUCKETS - 1), payloads),
        st.tuples(st.just("crowd"), st.sampled_from(SECTIONS), st.integers(50, 400)),
        st.tuples(st.just("deep"), st.sampled_from(SECTIONS), st.integers(2, 8), payloads),
    ),
    min_size=1,
    max_size=12,
)


def _put(zk: KazooClient, path: str, data: bytes) -> None:
    if zk.exists(path):
        zk.set(path, data)
    else:
        zk.create(path, data, makepath=True)


def _hostile(zk: KazooClient, operation: tuple) -> None:
    kind = operation[0]
    if kind == "node":
        _, section, name, data = operation
        _put(zk, f"{section}/{name}", data)
    elif kind == "spec":
        zk.set(operation[1], operation[2])
    elif kind == "bucket":
        index = operation[1]
        if index == bucket_of(GOOD_KEY, BUCKETS):
            return  # that bucket is the valid part this test keeps serving
        _put(zk, bucket_path("tenants", index), operation[2])
    elif kind == "crowd":
        _, section, count = operation
        transaction = zk.transaction()
        prefix = os.urandom(3).hex()
        for i in range(count):
            transaction.create(f"{section}/crowd-{prefix}-{i}", b"\x00crowd")
        transaction.commit()
    elif kind == "deep":
        _, section, depth, data = operation
        path = section + "".join(f"/deep{i}" for i in range(depth))
        zk.create(path, data, makepath=True)


def _flicker(zk: KazooClient, stop: threading.Event) -> None:
    """Valid-looking instances and metrics that appear and vanish without pause."""
    document = {"v": 1, "partition": "p9", "label": "flick", "host": "h", "port": 1}
    while not stop.is_set():
        for section in ("/services/svc", "/metrics/svc"):
            with contextlib.suppress(KazooException):
                zk.create(f"{section}/p9:flick", json.dumps(document).encode())
                zk.delete(f"{section}/p9:flick")


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(operations=operations)
def test_hostile_data_never_stops_the_client_nor_the_valid_part(zookeeper, caplog, operations):
    namespace = f"/hostile-{os.urandom(6).hex()}"
    hosts = zookeeper.connect_string
    caplog.clear()
    with (
        Sentinel(hosts, "writer", namespace) as writer,
        Sentinel(hosts, "reader", namespace) as reader,
        caplog.at_level(logging.WARNING, logger="sentinel"),
    ):
        writer.shard_maps.create("tenants", "directory", buckets=BUCKETS)
        writer.ensure_service("svc", shard_policy="tenants")
        writer.shard_maps.assign("tenants", GOOD_KEY, "pg")
        writer.register("svc", "pg", "10.0.0.1", 80, label="good")
        reader.prefetch("svc")
        raw = writer.session.zk
        stop = threading.Event()
        flicker = threading.Thread(target=_flicker, args=(raw, stop), daemon=True)
        flicker.start()
        try:
            for operation in operations:
                with contextlib.suppress(KazooException):  # a name or size ZooKeeper refuses
                    _hostile(raw, operation)
                assert reader.get_service("svc", GOOD_KEY).label == "good"
            # Not stuck: a valid change made after the storm still arrives.
            writer.register("svc", "pg", "10.0.0.2", 80, label="good2")
            assert wait_until(
                lambda: {e.label for e in reader.cached_instances("svc")} >= {"good", "good2"},
                timeout=20,
            ), "the reader stopped following the service"
        finally:
            stop.set()
            flicker.join()
        assert reader.session.cache.worker._thread.is_alive()
        assert reader.get_service("svc", GOOD_KEY).label in ("good", "good2")
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, [r.getMessage() for r in failures]


@pytest.mark.parametrize("bound", ["nodes", "bytes"])
def test_a_flooded_section_is_read_up_to_its_bounds_and_the_instances_metrics_first(
    make_client, raw_zk, monkeypatch, bound, cli_in_process
):
    """A writer floods /metrics/<service> with junk nodes: a new client's first lookup reads
    the instances' own metrics first, stops at the section's bounds (at most one multi-read
    past them), counts the rest, and resolves with its metrics policy as usual."""
    publisher = make_client("publisher")
    for label, lag in (("a", 5.0), ("b", 1.0)):
        publisher.register("db", "p1", f"10.0.0.{len(label)}", 5432, label=label)
        publisher.update_metrics("db", "p1", label, {"replication_lag": lag})
    junk = 120
    transaction = raw_zk.transaction()
    for i in range(junk):  # sorted before the real nodes: "0000" < "p1:a"
        transaction.create(f"/metrics/db/{i:04d}", b"x" * 1000)
    assert all(result is True or isinstance(result, str) for result in transaction.commit())
    if bound == "nodes":
        monkeypatch.setattr(sentinel.cache.reads, "MAX_SECTION_NODES", 30)
        read = 30
    else:  # each junk node is 1,000 bytes: the budget is spent after ten of them
        monkeypatch.setattr(sentinel.cache.reads, "MAX_SECTION_BYTES", 10_000)
        read = None
    client = make_client("app")
    assert client.get_service("db", policy=MinLag(cutoff=30)).label == "b"
    stats = client.cache_stats
    snapshot = client._snapshots["db"]
    assert {"p1:a", "p1:b"} <= snapshot.metrics.keys()  # the instances' own, read first
    if read is not None:
        assert len(snapshot.metrics) + len(snapshot.invalid) == read
        assert stats.over_limit == junk + 2 - read
    else:
        assert 2 + 10 <= len(snapshot.metrics) + len(snapshot.invalid) <= 2 + 10 + 1
        assert stats.over_limit >= junk - 11
    doctor = cli_in_process("doctor", "--json")
    flooded = [f for f in json.loads(doctor.stdout) if f["check"] == "flooded section"]
    if bound == "nodes":  # doctor names the section by the same bound
        assert [f["detail"].split()[0] for f in flooded] == ["/metrics/db"], doctor.stdout
        assert f"holds {junk + 2} nodes" in flooded[0]["detail"]
    else:
        assert flooded == []
