"""The client's idempotent set-up calls, metrics by registration and the /clients record
(issue 17), against a real ZooKeeper."""

import asyncio
import json

import pytest

from sentinel import Sentinel
from sentinel.aio import AsyncSentinel
from sentinel.auth.writer import CredentialWriter
from sentinel.errors import (
    ShardPolicyConflict,
    ShardPolicyExists,
    ShardPolicyNotFound,
    ValidationError,
)
from sentinel.registry.layout import client_path, instance_path
from sentinel.registry.reads import read_clients
from sentinel.registry.records import ClientRecord
from sentinel.shards.store import read_key
from sentinel.shards.writer import ShardMapWriter
from sentinel.testing.helpers import wait_until

pytestmark = pytest.mark.integration


def test_ensure_shard_policy_creates_once_then_returns_the_stored_spec(make_client, raw_zk):
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
def test_ensure_shard_policy_refuses_another_spec_and_writes_nothing(
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


def test_ensure_shard_policy_compares_what_the_node_keeps(make_client):
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


OLD_NAMES = {
    "create_shard_policy": "shard_maps.create",
    "ensure_shard_policy": "shard_maps.ensure",
    "update_shard_info": "shard_maps.assign",
    "update_shard_info_many": "shard_maps.assign_many",
    "remove_shard_key": "shard_maps.unassign",
    "request_placement": "shard_maps.request_placement",
    "update_auth": "credentials.publish",
    "rotate_auth": "credentials.rotate",
}


@pytest.mark.parametrize("client_class", [Sentinel, AsyncSentinel])
def test_every_old_name_of_a_role_method_is_a_warning_alias_of_an_existing_one(client_class):
    role_classes = {"shard_maps": ShardMapWriter, "credentials": CredentialWriter}
    for old, new in OLD_NAMES.items():
        alias = getattr(client_class, old)
        assert alias.__doc__ == f"Deprecated: use ``{new}``, which takes the same arguments."
        role, method = new.split(".")
        assert callable(getattr(role_classes[role], method)), new


# One word per concept (docs/decisions/one-word-per-concept.md): the sync client's renames,
# and the async client's, whose lookups on a warm cache stay plain calls.
RENAMED = {
    "register_service": "register",
    "deregister_service": "deregister",
    "get_services": "eligible_instances",
    "instances": "cached_instances",
}


@pytest.mark.parametrize("client_class", [Sentinel, AsyncSentinel])
def test_every_renamed_method_is_a_warning_alias_of_its_new_name(client_class):
    renamed = RENAMED | ({"resolve": "aget_service"} if client_class is AsyncSentinel else {})
    for old, new in renamed.items():
        assert getattr(client_class, old).__doc__ == (
            f"Deprecated: use ``{new}``, which takes the same arguments."
        )
    for new in set(renamed.values()) - {"eligible_instances", "cached_instances"}:
        assert callable(getattr(client_class, new)), new  # the async lookups are per client


def test_the_renamed_methods_warn_and_do_what_the_new_ones_do(make_client, raw_zk):
    client = make_client("renamed")
    with pytest.warns(
        DeprecationWarning, match=r"\.register_service\(\) is deprecated: use \.register\(\)"
    ):
        registration = client.register_service("api", "p1", "10.0.0.1", 80, label="old")
    assert raw_zk.exists(instance_path("api", "p1", "old"))
    with pytest.warns(DeprecationWarning, match=r"use \.eligible_instances\(\)"):
        assert client.get_services("api") == client.eligible_instances("api")
    with pytest.warns(DeprecationWarning, match=r"use \.cached_instances\(\)"):
        assert [e.label for e in client.instances("api")] == ["old"]
    with pytest.warns(DeprecationWarning, match=r"use \.deregister\(\)"):
        assert client.deregister_service(registration) is True
    assert not raw_zk.exists(instance_path("api", "p1", "old"))


def test_the_old_names_warn_and_write_what_the_new_ones_write(make_client, raw_zk):
    client = make_client("old-names")
    with pytest.warns(DeprecationWarning, match=r"\.create_shard_policy\(\) is deprecated: use "):
        spec = client.create_shard_policy("legacy", "directory", partitions=["p1"], buckets=4)
    assert spec == client.shard_maps.ensure("legacy", "directory", partitions=["p1"], buckets=4)
    with pytest.warns(DeprecationWarning, match=r"use \.shard_maps\.assign\(\)"):
        client.update_shard_info("legacy", "acme", "p1")
    assert read_key(raw_zk, spec, "acme") == "p1"
    with pytest.warns(DeprecationWarning, match=r"use \.shard_maps\.unassign\(\)"):
        client.remove_shard_key("legacy", "acme")
    assert read_key(raw_zk, spec, "acme") is None


def test_the_async_clients_old_names_warn_and_its_roles_are_awaited(zookeeper, namespace, raw_zk):
    async def main():
        async with AsyncSentinel(zookeeper.connect_string, "aio-roles", namespace) as client:
            with pytest.warns(DeprecationWarning, match=r"use \.shard_maps\.create\(\)"):
                spec = await client.create_shard_policy("async-legacy", "directory", buckets=4)
            await client.shard_maps.assign("async-legacy", "k", "p2")
            await client.register("api", "p2", "10.0.0.2", 80, label="a")
            # A lookup on a cold cache, awaited: the load runs off the loop.
            assert (await client.aget_service("api")).label == "a"
            assert [e.label for e in await client.aget_eligible_instances("api")] == ["a"]
            assert client.get_service("api").label == "a"  # warm: the plain call
            with pytest.warns(DeprecationWarning, match=r"\.resolve\(\) is deprecated"):
                assert (await client.resolve("api")).label == "a"
            return spec

    spec = asyncio.run(main())
    assert read_key(raw_zk, spec, "k") == "p2"
