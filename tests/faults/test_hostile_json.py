"""Hostile JSON against a running client (issue 16, item 1): nesting up to 100,000 levels,
integers up to 10**1000, NaN and Infinity, floats past range, unicode and lone surrogates as raw
bytes, written as whole values and as single fields of otherwise valid documents into every
section. No exception escapes a public call, the valid part is served, and a legitimate change
made afterwards is applied."""

from __future__ import annotations

import contextlib
import json
import logging
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.exceptions import KazooException

from sentinel import Sentinel
from sentinel.auth import ClientKeyring
from sentinel.auth.config import AuthConfig
from sentinel.auth.entries import live_processes
from sentinel.errors import DecodeError
from sentinel.registry.reads import read_clients, read_metrics, read_service
from sentinel.shards.spec import bucket_of, bucket_path
from sentinel.testing.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults]

BUCKETS = 4
GOOD_KEY = "k-good"

# Hostile JSON values as raw bytes: json.dumps cannot write most of them.
hostile_values = st.one_of(
    st.integers(1, 100_000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 100_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.integers(0, 1000).map(lambda n: str(10**n).encode()),
    st.integers(0, 1000).map(lambda n: str(-(10**n)).encode()),
    st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e999", b"1" * 5000]),
    st.text(max_size=20).map(lambda t: json.dumps(t, ensure_ascii=False).encode("utf-8")),
    st.sampled_from([b'"\xed\xa0\x80"', b'"\\ud800"', b'"\\udfff x"', b'"\xff\xfe"']),
)
# The fields of every record kind, so a hostile value reaches the code that builds the record.
FIELDS = [
    "host",
    "port",
    "weight",
    "registered_at",
    "properties",
    "measured_at",
    "metrics",
    "partitions",
    "kind",
    "buckets",
    "boundaries",
    "defaults",
    "shard_policy",
    "scheme",
    "auth_client",
    "auth_version",
    "envelopes",
]


def _instance(label: str, field: str, value: bytes) -> bytes:
    # Its own partition: some generated fields are valid after all (a port of 10**0), and a
    # valid instance may be served; never for GOOD_KEY, whose partition is "pg".
    document = {"v": 1, "partition": "hostile", "label": label, "host": "10.0.0.9", "port": 80}
    document.update(scheme="http", measured_at=1.0, metrics={"lag": 1})
    text = json.dumps({k: v for k, v in document.items() if k != field}).encode()
    return text[:-1] + b', "' + field.encode() + b'": ' + value + b"}"


payloads = st.one_of(
    hostile_values,
    st.builds(_instance, st.just("bad"), st.sampled_from(FIELDS), hostile_values),
)
# (parent, node name) for every section; "" is the parent node itself (a spec).
TARGETS = (
    ("/services/svc", "hostile:bad"),
    ("/services/svc", ""),
    ("/metrics/svc", "hostile:bad"),
    ("/metrics/svc", "pg:good"),
    ("/shard_info/tenants", ""),
    ("/auth/svc", "reader"),
    ("/auth/svc", "other"),
    ("/clients/svc", "hostile"),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("node"), st.sampled_from(TARGETS), payloads),
        st.tuples(st.just("bucket"), st.integers(0, BUCKETS - 1), payloads),
    ),
    min_size=1,
    max_size=6,
)


def _put(zk, path: str, data: bytes) -> None:
    if zk.exists(path):
        zk.set(path, data)
    else:
        zk.create(path, data, makepath=True)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(operations=operations)
def test_hostile_json_is_a_counted_skip_everywhere(zookeeper, caplog, operations):
    namespace = f"/hostile-json-{os.urandom(6).hex()}"
    hosts = zookeeper.connect_string
    caplog.clear()
    with (
        Sentinel(hosts, "writer", namespace) as writer,
        # With a key ring, so the reader also decodes its /auth node.
        Sentinel(
            hosts, "reader", namespace, auth=AuthConfig(keys=ClientKeyring.generate())
        ) as reader,
        caplog.at_level(logging.WARNING, logger="sentinel"),
    ):
        writer.shard_maps.create("tenants", "directory", buckets=BUCKETS)
        writer.ensure_service("svc", shard_policy="tenants")
        writer.shard_maps.assign("tenants", GOOD_KEY, "pg")
        writer.register("svc", "pg", "10.0.0.1", 80, label="good")
        writer.credentials.publish("svc", "reader", {"user": "u", "password": "p"})
        assert wait_until(lambda: reader.get_service("svc", GOOD_KEY).auth is not None)
        raw = writer.session.zk
        counted_before = reader.cache_stats.decode_errors
        # Writes the reader's cache must count whatever else it re-reads: a whole hostile
        # value (never a record) in an instance node it follows.
        certainly_counted = 0
        for kind, target, data in operations:
            if kind == "node":
                parent, name = target
                path = f"{parent}/{name}" if name else parent
            else:
                if target == bucket_of(GOOD_KEY, BUCKETS):
                    continue  # that bucket is the valid part this test keeps serving
                path = bucket_path("tenants", target)
            with contextlib.suppress(KazooException):  # a size ZooKeeper refuses
                _put(raw, path, data)
                if path == "/services/svc/hostile:bad" and not data.startswith(b'{"v": 1'):
                    certainly_counted += 1
            # Every public read: the cache, and the one-shot reads of each section.
            assert reader.get_service("svc", GOOD_KEY).label == "good"
            assert "good" in {e.label for e in reader.cached_instances("svc")}
            try:
                assert "good" in {i.label for i in read_service(raw, "svc").instances}
            except DecodeError as exc:  # typed: a one-shot read has no last good spec
                assert exc.path == "/services/svc"
            read_metrics(raw, "svc")
            read_clients(raw)
            live_processes(raw, "svc")
        # Not stuck: a valid change made after the garbage still arrives.
        writer.register("svc", "pg", "10.0.0.2", 80, label="good2")
        assert wait_until(
            lambda: {e.label for e in reader.cached_instances("svc")} >= {"good", "good2"},
            timeout=20,
        ), "the reader stopped following the service"
        assert reader.session.cache.worker._thread.is_alive()
        # Counted: each of those writes at least (the events before good2 were applied first).
        counted = reader.cache_stats.decode_errors - counted_before
        assert counted >= certainly_counted, (counted, certainly_counted)
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, [r.getMessage() for r in failures]


HOSTILE_NODES = (
    b"\xff not json",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    str(10**1000).encode(),
    b"NaN",
    b"1e400",
    b'"\xed\xa0\x80"',
    _instance("bad", "port", str(10**1000).encode()),
    _instance("bad", "metrics", b"[" * 100_000 + b"]" * 100_000),
    _instance("bad", "weight", b"Infinity"),
)


def test_each_hostile_node_is_counted_exactly_once(make_client, raw_zk):
    """The counter the skips promise: one decode error per hostile node the cache reads,
    instances and metrics alike, no more (nothing re-read twice) and none missed."""
    writer = make_client("writer")
    reader = make_client("reader")
    writer.register("svc", "pg", "10.0.0.1", 80, label="good")
    writer.update_metrics("svc", "pg", "good", {"lag": 1})
    assert reader.get_service("svc").label == "good"
    before = reader.cache_stats.decode_errors
    for i, data in enumerate(HOSTILE_NODES):
        raw_zk.create(f"/services/svc/pg:bad{i}", data)
        raw_zk.create(f"/metrics/svc/pg:bad{i}", data)
    # Applied in order: once this arrives, every hostile node before it was read.
    writer.register("svc", "pg", "10.0.0.2", 80, label="good2")
    assert wait_until(
        lambda: {e.label for e in reader.cached_instances("svc")} == {"good", "good2"}
    )
    assert reader.cache_stats.decode_errors - before == 2 * len(HOSTILE_NODES)
