"""The cache on ZooKeeper 3.6 persistent recursive watches, judged by the server's accounts.

``wchs`` counts the watches the server holds; ``mntr``'s ``read_per_namespace`` counts the reads
it served under the test's namespace (the changes below are written with a raw kazoo client,
which reads nothing). The clients ask for persistent watches whatever ``SENTINEL_TEST_WATCHES``
says: these are that mode's properties.
"""

from __future__ import annotations

import threading

import pytest

import sentinel.cache.reads
from benchmarks.zkcost import mntr, watches
from sentinel.cache.config import CacheConfig
from sentinel.cache.followers import PersistentFollower
from sentinel.cache.registry_cache import RegistryCache
from sentinel.testing.helpers import TcpProxy, expire_session, wait_until
from tests.integration.nodes import instance, metrics

pytestmark = pytest.mark.integration


def watches_total(zookeeper) -> int:
    """``wchs``: every watch the server holds."""
    host, port = zookeeper.connect_string.split(":")
    return watches(host, int(port))


def reads_served(zookeeper, namespace: str) -> int:
    """Reads the server has served under ``namespace`` (``mntr``)."""
    host, port = zookeeper.connect_string.split(":")
    return int(mntr(host, int(port)).get(f"zk_cnt_{namespace.strip('/')}_read_per_namespace", 0))


def populate(make_client, raw_zk, count: int) -> None:
    """Service ``api`` with ``count`` instances and their metrics, created pipelined."""
    make_client("writer", announce=False).ensure_service("api")
    raw_zk.ensure_path("/metrics/api")
    nodes = [instance(f"i{i}") for i in range(count)] + [metrics(f"i{i}", i) for i in range(count)]
    for result in [raw_zk.create_async(path, data) for path, data in nodes]:
        result.get(timeout=30)


def test_a_client_of_a_1000_instance_service_costs_the_server_a_handful_of_watches(
    make_client, raw_zk, zookeeper
):
    populate(make_client, raw_zk, 1000)
    before = watches_total(zookeeper)
    client = make_client("reader", announce=False, persistent_watches=True)
    assert client.persistent_watches
    assert len(client.eligible_instances("api")) == 1000
    # one recursive watch on /services/api and one on /metrics/api (one-shot: 1,002)
    assert watches_total(zookeeper) - before == 2
    # ... and they follow every instance: a change below is applied
    path, data = instance("i7", weight=9)
    raw_zk.set(path, data)
    assert wait_until(lambda: _labels_weights(client).get("i7") == 9)


def test_a_cut_connection_reads_only_what_changed_and_an_expiry_reads_everything(
    make_client, raw_zk, zookeeper, namespace
):
    populate(make_client, raw_zk, 20)
    proxy = TcpProxy("127.0.0.1", zookeeper.members[0].client_port)
    try:
        client = make_client(
            "reader",
            hosts=proxy.address,
            announce=False,
            cache=CacheConfig(resync_jitter=0),
            persistent_watches=True,
        )
        assert client.persistent_watches
        assert len(client.eligible_instances("api")) == 20

        def cut_and_restore(while_away) -> None:
            resyncs = client.cache_stats.resyncs
            proxy.cut()
            assert wait_until(lambda: client.connection_state == "suspended", timeout=15)
            while_away()
            proxy.restore()
            assert wait_until(lambda: client.cache_stats.resyncs > resyncs, timeout=15)
            assert client.cache_stats.session_events.get("lost", 0) == 0  # same session

        before = reads_served(zookeeper, namespace)
        cut_and_restore(lambda: None)
        assert reads_served(zookeeper, namespace) == before  # nothing changed: nothing read

        def while_away() -> None:
            raw_zk.set(*instance("i1", weight=5))
            raw_zk.delete(instance("i2")[0])
            raw_zk.create(*instance("new"))
            raw_zk.set(*metrics("i3", 99))

        cut_and_restore(while_away)

        def applied() -> bool:
            endpoints = {e.label: e for e in client.eligible_instances("api")}
            return (
                "i2" not in endpoints
                and "new" in endpoints
                and endpoints["i1"].weight == 5
                and endpoints["i3"].metrics == {"load": 99}
            )

        assert wait_until(applied, timeout=15), "a change made while away was not applied"
        # i1's data, i3's metrics, the one listing of /services/api (a deletion and a
        # creation: children changed once), the new instance; the deletion itself: no read
        assert reads_served(zookeeper, namespace) - before == 4

        # A session expiry takes the watches with it: everything is read again.
        before = reads_served(zookeeper, namespace)
        expire_session(client)
        raw_zk.set(*instance("i4", weight=7))
        assert wait_until(
            lambda: (
                client.cache_stats.session_events.get("lost", 0) >= 1
                and _labels_weights(client).get("i4") == 7
            ),
            timeout=20,
        ), "the cache did not re-read after the expiry"
        # spec, two listings, 20 instances, 20 metrics at least (the reads are multi-reads,
        # which ZooKeeper counts per operation)
        assert reads_served(zookeeper, namespace) - before >= 43
        raw_zk.set(*instance("i5", weight=3))  # followed again in the new session
        assert wait_until(lambda: _labels_weights(client).get("i5") == 3, timeout=10)
    finally:
        proxy.close()


def _labels_weights(client) -> dict[str, float]:
    return {e.label: e.weight for e in client.eligible_instances("api")}


def test_a_flood_of_a_followed_section_past_its_bound_costs_the_server_no_reads(
    make_client, raw_zk, zookeeper, namespace, monkeypatch
):
    # The read of a changed node is sent as its event arrives; a newcomer past the section's
    # bound must not be: a writer flooding a service would make every follower read each node.
    populate(make_client, raw_zk, 5)
    monkeypatch.setattr(sentinel.cache.reads, "MAX_SECTION_NODES", 5)
    client = make_client("reader", announce=False, persistent_watches=True)
    assert len(client.eligible_instances("api")) == 5
    before, over = reads_served(zookeeper, namespace), client.cache_stats.over_limit
    flood = [raw_zk.create_async(*instance(f"junk{i}")) for i in range(50)]
    for result in flood:
        result.get(timeout=30)
    assert wait_until(lambda: client.cache_stats.over_limit - over == 50)
    assert reads_served(zookeeper, namespace) == before
    path, data = instance("i3", weight=7)  # a node it holds is still read as it changes
    raw_zk.set(path, data)
    assert wait_until(lambda: _labels_weights(client).get("i3") == 7)
    assert reads_served(zookeeper, namespace) == before + 1


@pytest.mark.parametrize("on_connection_thread", [True, False], ids=["connection", "callback"])
def test_events_are_taken_on_the_thread_the_cache_config_names_and_arrive_either_way(
    make_client, monkeypatch, on_connection_thread
):
    seen: list[tuple[object, threading.Thread]] = []
    stock = PersistentFollower._on_event

    def recording(self, root, event):
        seen.append((self, threading.current_thread()))
        return stock(self, root, event)

    monkeypatch.setattr(PersistentFollower, "_on_event", recording)  # before any follower
    publisher = make_client("publisher", persistent_watches=True)
    reader = make_client(
        "reader",
        persistent_watches=True,
        cache=CacheConfig(events_on_connection_thread=on_connection_thread),
    )
    registration = publisher.register("api", "p1", "h1", 80, label="a")
    assert reader.get_service("api").label == "a"
    publisher.update_metrics(registration, {"n": 1})
    assert wait_until(lambda: reader.get_service("api").metrics.get("n") == 1) is not None
    follower = reader.session.cache._follower
    threads = [thread for who, thread in seen if who is follower]
    assert threads, "no event reached the reader's follower"
    connection_thread = reader.session.zk._connection._connection_routine
    assert all((thread is connection_thread) is on_connection_thread for thread in threads)


def test_a_registration_and_a_deregistration_are_served_where_their_event_is_read(
    make_client, monkeypatch
):
    served: list[tuple[str, threading.Thread]] = []
    stock = RegistryCache.swap

    def recording(self, service, *args, **kwargs):
        served.append((service, threading.current_thread()))
        return stock(self, service, *args, **kwargs)

    monkeypatch.setattr(RegistryCache, "swap", recording)
    publisher = make_client("publisher", persistent_watches=True)
    reader = make_client("reader", persistent_watches=True)
    publisher.register("api", "p1", "h1", 80, label="a")
    assert reader.get_service("api").label == "a"
    heard: list[tuple[list[str], list[str], str, threading.Thread]] = []

    def listener(change) -> None:  # calls back into the client: it must see the change
        labels = sorted(e.label for e in reader.eligible_instances("api"))
        added, removed = [e.label for e in change.added], [e.label for e in change.removed]
        heard.append((added, removed, ",".join(labels), threading.current_thread()))

    reader.listen("api", listener)
    served.clear()
    second = publisher.register("api", "p1", "h2", 80, label="b")
    assert wait_until(lambda: len(heard) == 1) is not None
    publisher.deregister(second)
    assert wait_until(lambda: len(heard) == 2) is not None
    # the reader's two swaps, on kazoo's connection thread (the publisher's own cache serves
    # nothing of api: it never looked it up)
    connection_thread = reader.session.zk._connection._connection_routine
    assert served == [("api", connection_thread), ("api", connection_thread)]
    assert [h[:3] for h in heard] == [(["b"], [], "a,b"), ([], ["b"], "a")]
    assert all(h[3].name == "sentinel-cache" for h in heard)
