"""Faults on a real 3-member ensemble: what a client sees during each, and how long it takes
to be exact again. Each test adds a row to the fault table printed after the run.

Recovery is measured end to end: from the repair (or the fault, when nothing is repaired)
until a change written then has reached the reader's cache and the cache equals a fresh read.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from sentinel import Sentinel
from sentinel.cache import worker as cache_worker
from sentinel.cache.config import CacheConfig
from sentinel.registry.layout import CLIENTS, instance_path
from sentinel.testing.helpers import PublisherProcess, TcpProxy, flap, wait_until
from tests.faults.conftest import FaultRow, Prober, time_to_recover, when_possible

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.faults]

SERVICE = "api"


@pytest.fixture
def world(ensemble, namespace):
    """A writer holding one instance, and a reader that follows the service."""
    hosts = ensemble.connect_string
    with (
        Sentinel(hosts, "writer", namespace, session_timeout=30.0) as writer,
        Sentinel(hosts, "reader", namespace, session_timeout=4.0) as reader,
    ):
        writer.register(SERVICE, "p1", "127.0.0.1", 8000, label="steady")
        reader.prefetch(SERVICE)
        holds(reader, {"steady"})
        yield writer, reader


@pytest.fixture
def relays(ensemble):
    """A TCP relay in front of each member, so one client can be cut off from the ensemble."""
    proxies = [TcpProxy("127.0.0.1", m.client_port) for m in ensemble]
    yield proxies
    for proxy in proxies:
        proxy.close()


def holds(reader: Sentinel, labels: set[str]) -> None:
    """Wait until ``reader``'s cache holds ``labels``, before a prober asks it: its member may
    not have applied the writer's registration yet when it first read the service (ZooKeeper
    orders each client's view, not two clients' against each other), and a lookup then finds
    no instance, rightly."""
    assert wait_until(
        lambda: {e.label for e in reader.cached_instances(SERVICE)} == labels, timeout=10
    ), reader.cached_instances(SERVICE)


def _launch_and_wait(members) -> None:
    """Start members together (a lone member of a lost quorum cannot serve) and wait."""
    for member in members:
        member.launch()
    for member in members:
        member.wait_serving(60)


def _row(name: str, recovery: float, prober: Prober, note: str = "") -> FaultRow:
    return FaultRow(name, recovery, prober.lookups, prober.failed, prober.stale, note)


def test_killing_the_leader_fails_no_lookup(ensemble, world, fault_table):
    writer, reader = world
    leader = ensemble.leader()
    with Prober(reader, SERVICE) as prober:
        leader.kill()
        recovery = time_to_recover(writer, reader, SERVICE, "after-leader")
    leader.restart()
    fault_table.append(_row("ensemble leader killed", recovery, prober, "quorum kept"))
    prober.check()


def test_losing_quorum_serves_stale_then_recovers(ensemble, world, fault_table):
    writer, reader = world
    leader = ensemble.leader()
    lost = [leader, next(m for m in ensemble if m is not leader)]
    with Prober(reader, SERVICE) as prober:
        for member in lost:
            member.kill()
        assert wait_until(lambda: reader.connection_state != "connected", timeout=30)
        assert wait_until(lambda: prober.stale >= 200, timeout=30), "nothing served meanwhile"
        staleness = reader.staleness
        _launch_and_wait(lost)
        recovery = time_to_recover(writer, reader, SERVICE, "after-quorum")
    fault_table.append(
        _row("two of three killed (no quorum)", recovery, prober, f"stale {staleness:.1f}s")
    )
    prober.check()
    assert prober.stale > 0 and staleness > 0


def test_a_frozen_publisher_leaves_and_comes_back(ensemble, world, namespace, fault_table):
    _, reader = world
    publisher = PublisherProcess(
        ensemble.connect_string, namespace, SERVICE, "p1", "frozen", session_timeout=2.0
    )
    node = instance_path(SERVICE, "p1", "frozen")
    try:
        assert wait_until(lambda: "frozen" in {e.label for e in reader.cached_instances(SERVICE)})
        frozen_session = reader.session.zk.exists(node).ephemeralOwner
        with Prober(reader, SERVICE) as prober:
            publisher.pause()
            gone = wait_until(
                lambda: "frozen" not in {e.label for e in reader.cached_instances(SERVICE)},
                timeout=30,
            )
            assert gone is not None, "a frozen publisher's instance was never dropped"
            publisher.resume()
            resumed = time.monotonic()
            back = wait_until(
                lambda: "frozen" in {e.label for e in reader.cached_instances(SERVICE)}, timeout=30
            )
            assert back is not None, "the resumed publisher never registered again"
            recovery = time.monotonic() - resumed
        # It was frozen past its session: the server expired that session, and the node is
        # back on a new one (read from the reader's member, which has applied the re-creation
        # the reader's cache holds). Not the time from SIGSTOP to the drop: the server counts
        # the timeout from the last packet it heard, before the SIGSTOP, so the drop can come
        # a little under the timeout after it (docs/testing-history.md, "Flaky tests found and
        # fixed").
        assert reader.session.zk.exists(node).ephemeralOwner not in (0, frozen_session)
    finally:
        publisher.stop()
    note = f"dropped {gone:.1f}s after SIGSTOP (session 2s)"
    fault_table.append(_row("publisher SIGSTOP past its session", recovery, prober, note))
    prober.check()


def test_a_client_cut_off_past_its_session_timeout(ensemble, namespace, relays, fault_table):
    """The server expires the session of a client it cannot hear (a long pause or a partition
    look the same to it); the client serves its cache meanwhile, then re-syncs on a new session
    and announces itself again."""
    hosts = ",".join(p.address for p in relays)
    with (
        Sentinel(ensemble.connect_string, "writer", namespace) as writer,
        Sentinel(hosts, "paused", namespace, session_timeout=2.0) as reader,
    ):
        old = writer.register(SERVICE, "p1", "127.0.0.1", 8000, label="old")
        reader.prefetch(SERVICE)
        holds(reader, {"old"})
        session = reader.session_id
        announced = f"{CLIENTS}/{SERVICE}/paused"
        # The writer may read from another member than the reader wrote to: wait until it
        # sees the node, or its absence would prove nothing about the session's expiry.
        assert wait_until(lambda: writer.session.zk.exists(announced) is not None, timeout=10)
        with Prober(reader, SERVICE) as prober:
            for proxy in relays:
                proxy.cut()
            assert wait_until(lambda: writer.session.zk.exists(announced) is None, timeout=30), (
                "the server never expired the cut-off client's session"
            )
            writer.register(SERVICE, "p1", "127.0.0.1", 8001, label="new")
            writer.deregister(old)
            for proxy in relays:
                proxy.restore()
            recovery = time_to_recover(writer, reader, SERVICE, "after-expiry")
        assert reader.session_id != session
        assert {e.label for e in reader.cached_instances(SERVICE)} == {"new", "after-expiry"}
        assert wait_until(lambda: writer.session.zk.exists(announced) is not None, timeout=10)
    fault_table.append(_row("client session expired (cut off > 2s)", recovery, prober))
    prober.check()


# The re-sync window of the flapping test: longer than its burst of flaps.
RESYNC_WINDOW = 4.0


def test_a_flapping_connection_keeps_serving_and_resyncs_once_per_burst(
    ensemble, namespace, relays, fault_table, monkeypatch
):
    # A reconnection schedules a re-sync after a random delay of up to resync_jitter, and
    # reconnections meanwhile share it: one re-sync per window. The window is random; drawn
    # at its maximum (longer than the burst), the whole burst shares one re-sync. With
    # resync_jitter's 0.5 s a 3 s burst makes several (measured 4 for 30 flaps).
    monkeypatch.setattr(cache_worker, "random", SimpleNamespace(uniform=lambda low, high: high))
    hosts = ",".join(p.address for p in relays)
    with (
        Sentinel(ensemble.connect_string, "writer", namespace) as writer,
        Sentinel(
            hosts,
            "flappy",
            namespace,
            session_timeout=6.0,
            cache=CacheConfig(resync_jitter=RESYNC_WINDOW),
        ) as reader,
    ):
        writer.register(SERVICE, "p1", "127.0.0.1", 8000, label="steady")
        reader.prefetch(SERVICE)
        holds(reader, {"steady"})
        session, resyncs = reader.session_id, reader.cache_stats.resyncs
        with Prober(reader, SERVICE) as prober:
            flaps = flap(relays, 3.0)  # ten flaps a second
            recovery = time_to_recover(writer, reader, SERVICE, "after-flapping")
        # The re-sync runs once the window that began with the first reconnection is over.
        assert wait_until(lambda: reader.cache_stats.resyncs > resyncs, RESYNC_WINDOW + 5)
        resynced = reader.cache_stats.resyncs - resyncs
        assert reader.session_id == session, "flapping within the session timeout cost it"
    fault_table.append(
        _row(
            "connection flapped 10/s for 3s",
            recovery,
            prober,
            f"{flaps} flaps, {resynced} re-syncs",
        )
    )
    prober.check()
    assert resynced == 1, f"{resynced} re-syncs for one burst of {flaps} flaps"


def test_restarting_the_whole_ensemble(ensemble, world, fault_table):
    writer, reader = world
    with Prober(reader, SERVICE) as prober:
        for member in ensemble:
            member.stop()
        assert wait_until(lambda: reader.connection_state != "connected", timeout=30)
        assert wait_until(lambda: prober.stale >= 200, timeout=30), "nothing served meanwhile"
        _launch_and_wait(list(ensemble))
        recovery = time_to_recover(writer, reader, SERVICE, "after-restart")
    fault_table.append(_row("whole ensemble restarted", recovery, prober))
    prober.check()
    when_possible(lambda: writer.read_service(SERVICE))
