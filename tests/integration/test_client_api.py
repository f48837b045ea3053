"""The client's idempotent set-up calls, metrics by registration and the /clients record
(issue 17), against a real ZooKeeper."""

import asyncio
import json

import pytest

from sentinel.aio import AsyncSentinel
from sentinel.errors import (
    ShardPolicyConflict,
    ShardPolicyExists,
    ShardPolicyNotFound,
    ValidationError,
)
from sentinel.registry.layout import client_path
from sentinel.registry.reads import read_clients
from sentinel.registry.records import ClientRecord
from sentinel.shards.store import read_key
from sentinel.testing.helpers import wait_until

pytestmark = pytest.mark.integration


def test_shard_maps_ensure_creates_once_then_returns_the_stored_spec(make_client, raw_zk):
    client = make_client()
    created = client.shard_maps.ensure("tenants", "directory", partitions=["p1", "p2"], buckets=4)
    client.shard_maps.assign("tenants", "acme", "p2")
    _, stat = raw_zk.get("/shard_info/tenants")
    buckets = raw_zk.get_children("/shard_info/tenants")
    again = client.shard_maps.ensure("tenants", "directory", partitions=["p1", "p2"], buckets=4)
    assert again == created
    # Nothing rewritten: the spec's version, its buckets and the keys in them are as they were.
    assert raw_zk.get("/shard_info/tenants")[1].version == stat.version
    assert raw_zk.get_children("/shard_info/tenants") == buckets
    client.ensure_service("orders", shard_policy="tenants")
    client.register("orders", "p2", "10.0.0.2", 5432)
    assert client.get_service("orders", "acme").partition == "p2"


@pytest.mark.parametrize(
    ("asked", "conflict"),
    [
        ({"kind": "hash", "partitions": ["p1", "p2"]}, "kind='directory', asked 'hash'"),
        ({"kind": "directory", "partitions": ["p1"], "buckets": 4}, "partitions=['p1', 'p2']"),
        ({"kind": "directory", "partitions": ["p1", "p2"], "buckets": 8}, "buckets=4, asked 8"),
    ],
)
def test_shard_maps_ensure_refuses_another_spec_and_writes_nothing(
    make_client, raw_zk, asked, conflict
):
    client = make_client()
    client.shard_maps.create("tenants", "directory", partitions=["p1", "p2"], buckets=4)
    before = raw_zk.get("/shard_info/tenants")
    children = sorted(raw_zk.get_children("/shard_info/tenants"))
    assert len(children) == 4 + 1  # the buckets and their digest
    with pytest.raises(ShardPolicyConflict, match=conflict.replace("[", r"\[")) as caught:
        client.shard_maps.ensure("tenants", **asked)
    assert isinstance(caught.value, ShardPolicyExists)  # callers of create catch it too
    assert raw_zk.get("/shard_info/tenants") == before
    assert sorted(raw_zk.get_children("/shard_info/tenants")) == children


def test_shard_maps_ensure_compares_what_the_node_keeps(make_client):
    client = make_client()
    spec = client.shard_maps.ensure("spread", "hash", partitions=["h0", "h1"])
    # A hash policy keeps no bucket count, so asking with another one is the same policy ...
    assert client.shard_maps.ensure("spread", "hash", partitions=["h0", "h1"], buckets=8) == spec
    # ... but the partitions' order is the hash's, so another order is another policy.
    with pytest.raises(ShardPolicyConflict):
        client.shard_maps.ensure("spread", "hash", partitions=["h1", "h0"])
    bounds = [(0, "low"), (100, "high")]
    ranged = client.shard_maps.ensure("ids", "range", boundaries=bounds, key_type="int")
    assert client.shard_maps.ensure("ids", "range", boundaries=bounds, key_type="int") == ranged
    with pytest.raises(ShardPolicyConflict, match="key_type='int', asked 'str'"):
        client.shard_maps.ensure("ids", "range", boundaries=bounds)
    with pytest.raises(ValidationError):  # invalid input is refused before anything is read
        client.shard_maps.ensure("bad/name", "directory")


def test_ensure_service_refuses_a_shard_policy_that_does_not_exist(make_client, raw_zk):
    client = make_client()
    with pytest.raises(ShardPolicyNotFound, match="'nonexistent'"):
        client.ensure_service("orders", shard_policy="nonexistent")
    assert raw_zk.exists("/services/orders") is None
    assert raw_zk.exists("/clients/orders") is None
    client.shard_maps.ensure("nonexistent", "hash", partitions=["p1"])
    assert client.ensure_service("orders", shard_policy="nonexistent").shard_policy == "nonexistent"


def test_update_metrics_takes_the_registration_or_its_names(make_client, raw_zk):
    client = make_client()
    registration = client.register("db", "p1", "10.0.0.1", 5432, label="a")
    record = client.update_metrics(registration, {"lag": 2}, measured_at=1000.0)
    assert (record.service, record.partition, record.label) == ("db", "p1", "a")
    stored = json.loads(raw_zk.get("/metrics/db/p1:a")[0])
    assert stored == {"v": 1, "measured_at": 1000.0, "metrics": {"lag": 2}}
    client.update_metrics("db", "p1", "a", {"lag": 3})
    assert json.loads(raw_zk.get("/metrics/db/p1:a")[0])["metrics"] == {"lag": 3}
    for wrong in ((registration, "p1", "a", {"lag": 1}), ("db", {"lag": 1}), (registration,)):
        with pytest.raises(TypeError, match=r"\(registration, metrics\)"):
            client.update_metrics(*wrong)
    assert json.loads(raw_zk.get("/metrics/db/p1:a")[0])["metrics"] == {"lag": 3}


def test_a_client_announces_itself_with_a_client_record(make_client, raw_zk):
    publisher = make_client("publisher")
    publisher.register("api", "p1", "10.0.0.1", 80)
    app = make_client("api-7", app="api")
    app.get_service("api")
    path = client_path("api", "api-7")
    assert wait_until(lambda: raw_zk.exists(path)) is not None
    record = ClientRecord.from_bytes("api", "api-7", path, raw_zk.get(path)[0])
    assert (record.client_id, record.app, record.confirms_for) == ("api-7", "api", "api-7")
    assert record.pid is not None and record.auth_version is None
    assert read_clients(raw_zk)["api"] == {"api-7": record}


def test_the_async_clients_roles_are_awaited(zookeeper, namespace, raw_zk):
    async def main():
        async with AsyncSentinel(zookeeper.connect_string, "aio-roles", namespace) as client:
            spec = await client.shard_maps.create("async-tenants", "directory", buckets=4)
            await client.shard_maps.assign("async-tenants", "k", "p2")
            await client.register("api", "p2", "10.0.0.2", 80, label="a")
            # A lookup on a cold cache, awaited: the load runs off the loop.
            assert (await client.aget_service("api")).label == "a"
            assert [e.label for e in await client.aget_eligible_instances("api")] == ["a"]
            assert client.get_service("api").label == "a"  # warm: the plain call
            return spec

    spec = asyncio.run(main())
    assert read_key(raw_zk, spec, "k") == "p2"
