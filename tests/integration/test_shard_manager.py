"""Two shard manager replicas as real processes: one leads, the other takes over."""

import signal
import threading

import pytest

from sentinel.events import ShardKeysChanged
from sentinel.shards.store import iter_assignments
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import free_ports
from tests.integration.daemons import Daemon
from tests.integration.exposition import scrape

pytestmark = pytest.mark.integration


class Replica(Daemon):
    """A ``sentinel shard serve`` process for the policy ``tenants``."""

    def __init__(self, zookeeper, namespace, *options):
        super().__init__(zookeeper, namespace, "shard", "serve", "--policy", "tenants", *options)

    def placed(self, key):
        return [e for e in self.events if e["event"] == "placed" and e["key"] == key]


@pytest.fixture
def replicas(zookeeper, namespace, make_client):
    setup = make_client("setup")
    setup.shard_maps.create("tenants", "directory", partitions=["p1", "p2"], buckets=8)
    setup.shard_maps.assign_many("tenants", {"old-1": "p1", "old-2": "p1"})
    started = []

    def start(*options):
        replica = Replica(zookeeper, namespace, *options)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        replica.stop()


def test_the_leader_places_keys_and_a_follower_takes_over_exactly_once(
    replicas, make_client, raw_zk
):
    first = replicas()
    assert wait_until(lambda: first.saw("leader"), timeout=20), first.events
    second = replicas()
    assert wait_until(lambda: second.saw("follower"), timeout=20), second.events
    assert not second.saw("leader"), "a newcomer must not lead while the leader lives"

    client = make_client("app")
    client.ensure_service("orders", shard_policy="tenants")
    client.register("orders", "p1", "10.0.0.1", 5432)
    client.get_service("orders", "old-1")
    arrived = threading.Event()
    client.listen(
        "orders",
        lambda e: isinstance(e, ShardKeysChanged) and "fresh" in e.changes and arrived.set(),
    )
    assert client.shard_maps.request_placement("tenants", "fresh") is True
    assert wait_until(lambda: first.placed("fresh"), timeout=20), first.events
    # p1 holds two keys and p2 none: the least-keys rule puts the newcomer in p2.
    assert first.placed("fresh")[0]["partition"] == "p2"
    assert arrived.wait(10) and client._shard_maps["tenants"].lookup("fresh") == "p2"
    assert client.shard_maps.request_placement("tenants", "fresh") is False  # already placed

    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    assert client.shard_maps.request_placement("tenants", "while-leaderless") is True
    assert wait_until(lambda: second.saw("leader"), timeout=20), second.events
    assert wait_until(lambda: second.placed("while-leaderless"), timeout=20), second.events
    assert len(first.placed("while-leaderless") + second.placed("while-leaderless")) == 1
    assert dict(iter_assignments(raw_zk, "tenants"))["while-leaderless"] in ("p1", "p2")
    assert wait_until(lambda: raw_zk.get_children("/shard_info/tenants/requests") == [])


def test_a_request_for_a_key_placed_meanwhile_is_dropped_not_placed_again(
    replicas, make_client, raw_zk
):
    # A request left behind (its leader died after placing, before deleting it) is only
    # cleaned up by the next leader.
    from sentinel.shards.placement import request_node

    client = make_client("app")
    client.shard_maps.assign("tenants", "done", "p1")
    raw_zk.ensure_path("/shard_info/tenants/requests")
    raw_zk.create(request_node("tenants", "done"), b'{"v": 1, "key": "done"}')
    leader = replicas()
    assert wait_until(
        lambda: raw_zk.get_children("/shard_info/tenants/requests") == [], timeout=20
    ), leader.events
    assert leader.placed("done") == []
    assert dict(iter_assignments(raw_zk, "tenants"))["done"] == "p1"


def test_the_leader_alerts_when_a_partition_loses_its_last_instance(replicas, make_client):
    publisher = make_client("publisher")
    publisher.ensure_service("orders", shard_policy="tenants")
    one = publisher.register("orders", "p1", "10.0.0.1", 5432, label="a")
    publisher.register("orders", "p2", "10.0.0.2", 5432, label="b")
    leader = replicas()
    assert wait_until(lambda: leader.saw("leader"), timeout=20)
    make_client("app").shard_maps.request_placement(
        "tenants", "wake-up"
    )  # the leader looks at users
    assert wait_until(lambda: leader.placed("wake-up"), timeout=20)
    assert not leader.saw("alert")
    publisher.deregister(one)
    assert wait_until(lambda: leader.saw("alert", service="orders", partition="p1"), timeout=20), (
        leader.events
    )


def test_serve_refuses_a_policy_it_cannot_place_into(make_client, cli_in_process):
    make_client("setup").shard_maps.create("spread", "hash", partitions=["a"])
    result = cli_in_process("shard", "serve", "--policy", "spread")
    assert result.returncode == 2 and "directory policy" in result.stderr


def test_serve_exposes_its_placements_on_a_metrics_port(replicas, make_client):
    port = free_ports(1)[0]
    replica = replicas("--metrics-port", str(port))
    assert wait_until(lambda: replica.saw("leader"), timeout=20), replica.events
    policy = (("policy", "tenants"),)
    assert scrape(port)[("sentinel_shard_manager_leader", policy)] == 1
    client = make_client("app")
    assert client.shard_maps.request_placement("tenants", "counted") is True
    assert wait_until(lambda: replica.placed("counted"), timeout=20), replica.events
    assert scrape(port)[("sentinel_shard_placements_total", policy)] == 1
