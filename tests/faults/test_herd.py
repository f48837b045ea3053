"""Herd control: a fleet that loses its connections at once costs ZooKeeper a bounded number
of reads, counted by ZooKeeper itself; Procedure 1's misses are rate-limited per service."""

from __future__ import annotations

import time

import pytest

from benchmarks.herd import reads_per_resync, storm, world
from sentinel.cache.config import CacheConfig
from sentinel.errors import PartitionNotFound, ReadThroughThrottled

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_a_reconnect_storm_reads_each_followed_node_once_per_reconnection(zookeeper):
    with world(zookeeper):
        result = storm(zookeeper, clients=30, jitter=0.5, drops=3)
    assert result.reconnections >= 30, "the relay's drop did not reach every client"
    assert 30 <= result.resyncs <= result.reconnections
    assert result.reads <= result.bound == result.reconnections * reads_per_resync()
    assert result.reads >= 30 * reads_per_resync(), "ZooKeeper's read counter missed reads"


def test_read_throughs_are_rate_limited_per_service(make_client):
    writer = make_client("writer")
    writer.shard_maps.create("tenants", "directory")
    writer.ensure_service("db", shard_policy="tenants")
    writer.ensure_service("other", shard_policy="tenants")
    writer.register("db", "p1", "127.0.0.1", 5432)
    reader = make_client(
        "reader",
        cache=CacheConfig(read_through_rate=5.0, negative_ttl=0.001),
    )
    reader.prefetch("db")
    throttled = 0
    started = time.monotonic()
    for i in range(50):  # 50 distinct unknown keys: each one a miss, none in the negative cache
        try:
            reader.get_service("db", f"unknown-{i}")
        except ReadThroughThrottled:
            throttled += 1
        except PartitionNotFound:
            pass  # read, and found nowhere
    elapsed = time.monotonic() - started
    stats = reader.cache_stats
    assert stats.read_throughs + stats.throttled_reads == 50 == stats.read_throughs + throttled
    # The burst (5), plus what 5 reads/s refilled while the loop ran.
    assert 5 <= stats.read_throughs <= 5 + 5 * elapsed + 1
    reads = stats.read_throughs
    with pytest.raises(PartitionNotFound) as raised:
        reader.get_service("other", "unknown-x")  # another service has its own budget
    assert not isinstance(raised.value, ReadThroughThrottled)
    assert reader.cache_stats.read_throughs == reads + 1
