"""Protection from mass loss against a real ZooKeeper: a mass expiry (the server paused past
the publishers' session timeout) is protected and visible, a deregistration of the same size
reaches every client at once, as without protection (docs/health.md)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from sentinel import CacheConfig, Sentinel
from sentinel.cache.protection import MassLossProtection
from sentinel.errors import NoInstanceAvailable
from sentinel.testing.helpers import PublisherProcess, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from tests.conftest import sentinel_in_process

pytestmark = pytest.mark.integration

SERVICE = "orders"
COUNT = 6
PUBLISHER_SESSION = 2.0  # seconds: the server expires them while it is paused twice as long
HOLD = 15.0  # the protecting readers': long enough to look at the protected state on a loaded box


@pytest.fixture(scope="module")
def own_zookeeper() -> Iterator[LocalZooKeeper]:
    """A server of this module's own: it is paused, which the shared one must never be."""
    with LocalZooKeeper() as zookeeper:
        yield zookeeper


@pytest.fixture
def world(own_zookeeper: LocalZooKeeper) -> Iterator[dict]:
    namespace = f"/test-{uuid.uuid4().hex[:12]}"
    hosts = own_zookeeper.connect_string
    publishers: list[PublisherProcess] = []
    registries = {name: CollectorRegistry() for name in ("guarded-1", "guarded-2", "plain")}
    protection = MassLossProtection(share=0.5, window=10.0, hold=HOLD)
    readers = {
        name: Sentinel(
            hosts,
            name,
            namespace,
            session_timeout=30.0,  # outlives the pause: the readers keep their sessions
            announce=name == "guarded-1",  # its /clients entry tells sentinel ls and doctor
            prometheus_registry=registries[name],
            cache=CacheConfig(mass_loss_protection=None if name == "plain" else protection),
        ).start()
        for name in registries
    }
    # Protection applies to a service whose spec marks departures, and to no other.
    readers["plain"].ensure_service(SERVICE, mark_departures=True)

    def start_publishers(prefix: str) -> list[PublisherProcess]:
        started = [
            PublisherProcess(hosts, namespace, SERVICE, "p", f"{prefix}{i}", PUBLISHER_SESSION)
            for i in range(COUNT)
        ]
        publishers.extend(started)
        for reader in readers.values():
            reader.prefetch(SERVICE)  # the first publisher made the service: follow it
        assert wait_until(lambda: all(listed(r) == COUNT for r in readers.values()), 30), (
            "not every reader lists every publisher"
        )
        return started

    try:
        yield {
            "server": own_zookeeper.members[0],
            "readers": readers,
            "registries": registries,
            "start_publishers": start_publishers,
            "namespace": namespace,
            "cli": lambda *a: sentinel_in_process(*a, "--zk", hosts, "--namespace", namespace),
        }
    finally:
        own_zookeeper.members[0].resume()  # whatever failed, never leave it paused
        for publisher in publishers:
            publisher.kill()
        for reader in readers.values():
            reader.close()


def listed(reader: Sentinel) -> int:
    """Instances the registry lists, as ``reader``'s cache holds them."""
    return sum(not e.protected for e in reader.cached_instances(SERVICE))


def protected(reader: Sentinel) -> list:
    return [e for e in reader.cached_instances(SERVICE) if e.protected]


def gauge(world: dict, name: str) -> float | None:
    return world["registries"][name].get_sample_value(
        "sentinel_cache_protected_instances", {"client": name, "service": SERVICE}
    )


def test_a_mass_expiry_is_protected_and_visible_and_a_deregistration_of_its_size_is_not(world):
    readers = world["readers"]
    guarded = [readers["guarded-1"], readers["guarded-2"]]
    plain = readers["plain"]

    # --- a deregistration of the same size: six processes stop at once (each client's
    # close() deregisters, marked), and every reader drops them together.
    leaving = world["start_publishers"]("gone-")
    drops: dict[str, float] = {}
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set() and len(drops) < len(readers):
            for name, reader in readers.items():
                if name not in drops and not reader.cached_instances(SERVICE):
                    drops[name] = time.monotonic()
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.monotonic()
    stoppers = [threading.Thread(target=p.stop) for p in leaving]
    for stopper in stoppers:
        stopper.start()
    for stopper in stoppers:
        stopper.join(30)
    watcher.join(30)
    watching.set()
    assert drops.keys() == readers.keys(), f"only {sorted(drops)} dropped the stopped instances"
    for reader in guarded:
        assert reader.cache_stats.protection_episodes == 0
        assert reader.cache_stats.protected == {}
        with pytest.raises(NoInstanceAvailable):
            reader.get_service(SERVICE)
    # At once, as without protection: the protecting readers dropped them no later than the
    # plain one did plus a scheduling margin, and nowhere near the hold.
    spread = max(drops.values()) - min(drops.values())
    assert spread < HOLD / 3, f"the readers dropped a deregistration {spread:.2f}s apart"
    assert max(drops.values()) - started < HOLD, "a deregistration was held back"

    # --- a mass expiry: six live publishers freeze while the server is paused past their
    # session timeout; resumed, the server expires their sessions and deletes their nodes.
    frozen = world["start_publishers"]("blip-")
    server = world["server"]
    server.pause()
    try:
        for publisher in frozen:
            publisher.pause()
        time.sleep(PUBLISHER_SESSION * 2)  # the fault itself: a pause past the timeout
    finally:
        server.resume()
    assert wait_until(lambda: listed(plain) == 0, 30), "the server never expired the sessions"
    # The plain reader (today's client) has nothing to serve...
    with pytest.raises(NoInstanceAvailable):
        plain.get_service(SERVICE)
    # ...the protecting ones keep serving all six, and say so everywhere.
    for reader in guarded:
        assert wait_until(lambda r=reader: len(protected(r)) == COUNT, 10), (
            f"{reader.client_id} protects {len(protected(reader))} of {COUNT}"
        )
        assert listed(reader) == 0
        endpoint = reader.get_service(SERVICE)
        assert endpoint.protected and endpoint.unlisted_since is not None
        verdicts = reader.explain(SERVICE).verdicts
        assert len(verdicts) == COUNT
        assert all(v.startswith("eligible, protected: no longer listed") for v in verdicts.values())
        assert reader.cache_stats.protection_episodes == 1
        assert reader.cache_stats.protected == {SERVICE: COUNT}
        assert gauge(world, reader.client_id) == COUNT
    assert gauge(world, "plain") is None
    # Operators see it from anywhere: the announcing reader's /clients entry says so.
    ls = world["cli"]
    note = "protection from mass loss: 1 client(s) (guarded-1) serve up to"
    assert wait_until(lambda: note in ls("ls", SERVICE).stdout, 10), ls("ls", SERVICE).stdout
    shown = json.loads(ls("ls", SERVICE, "--json").stdout)["protecting_clients"]
    assert [(c["client"], c["instances"] > COUNT / 2) for c in shown] == [("guarded-1", True)]
    findings = json.loads(ls("doctor", "--json").stdout)
    assert [f["check"] for f in findings if f["check"] == "protection"] == ["protection"]

    # The publishers were alive all along: thawed, they find their sessions expired and
    # register again; the registry's instances replace the protected ones, and it ends.
    for publisher in frozen:
        publisher.resume()
    for reader in (*guarded, plain):
        assert wait_until(lambda r=reader: listed(r) == COUNT and not protected(r), 30), (
            f"{reader.client_id}: {listed(reader)} listed, {len(protected(reader))} protected"
        )
    for reader in guarded:
        assert reader.cache_stats.protected == {}
        assert gauge(world, reader.client_id) is None
    assert wait_until(lambda: "protection" not in ls("ls", SERVICE).stdout, 10)

    # --- really gone: the same six crash; their sessions expire together. They are served,
    # protected, for the hold and not a moment less, then dropped.
    for publisher in frozen:
        publisher.kill()
    reader = guarded[0]
    assert wait_until(lambda: len(protected(reader)) == COUNT, 20), "the crash was not protected"
    since = min(e.unlisted_since for e in protected(reader))
    assert wait_until(lambda: not reader.cached_instances(SERVICE), HOLD + 20), (
        "protected instances outlived the hold"
    )
    assert time.time() - since >= HOLD
    assert reader.cache_stats.protection_episodes == 2
    with pytest.raises(NoInstanceAvailable):
        reader.get_service(SERVICE)


def _four_listed(make_client, hold: float, mark_departures: bool) -> tuple:
    """A publisher of four instances of a service (its spec marking departures or not) and a
    protecting reader listing them all."""
    publisher = make_client("publisher")
    publisher.ensure_service(SERVICE, mark_departures=mark_departures)
    reader = make_client(
        "reader",
        cache=CacheConfig(mass_loss_protection=MassLossProtection(share=0.5, hold=hold)),
    )
    registrations = [
        publisher.register(SERVICE, "p", "10.0.0.1", 9000 + i, label=f"i{i}") for i in range(4)
    ]
    reader.prefetch(SERVICE)
    assert wait_until(lambda: listed(reader) == 4, 10)
    return publisher, reader, registrations


def test_deregistrations_are_never_held_back_and_unmarked_deletes_only_for_the_hold(
    make_client, raw_zk
):
    # Explicit deregister() calls, one after the other from one process: marked, so a
    # protecting reader drops each at once. A writer who deletes nodes without the mark (an
    # operator's zkCli, or an attacker who may write the service) is taken for a mass expiry:
    # what it buys is a dead instance served for the hold, marked, and no longer.
    hold = 3.0
    publisher, reader, registrations = _four_listed(make_client, hold, mark_departures=True)
    for registration in registrations[:3]:
        publisher.deregister(registration)
    assert wait_until(lambda: listed(reader) == 1, 10)
    assert not protected(reader) and reader.cache_stats.protection_episodes == 0
    # The departure marks never show in a listing (created and deleted in one transaction).
    assert raw_zk.get_children(f"/services/{SERVICE}") == ["p:i3"]

    more = [publisher.register(SERVICE, "p", "10.0.0.1", 9100 + i, label=f"j{i}") for i in range(3)]
    assert wait_until(lambda: listed(reader) == 4, 10)
    for registration in more:
        raw_zk.delete(registration.path)  # unmarked: 3 of 4 gone
    assert wait_until(lambda: len(protected(reader)) == 3, 10), "unmarked deletes not protected"
    assert listed(reader) == 1 and reader.cache_stats.protection_episodes == 1
    since = min(e.unlisted_since for e in protected(reader))
    assert wait_until(lambda: not protected(reader), hold + 10), "held past the bound"
    assert time.time() - since >= hold
    assert [e.label for e in reader.cached_instances(SERVICE)] == ["i3"]


def test_a_node_squatting_on_the_mark_only_costs_the_mark(make_client, raw_zk, caplog):
    # Someone who may write the service puts a node where the departure mark goes: the marked
    # delete fails on it, and the instance is deleted unmarked (as a session's end would),
    # never left behind.
    publisher = make_client("publisher")
    publisher.ensure_service(SERVICE, mark_departures=True)
    registration = publisher.register(SERVICE, "p", "10.0.0.1", 9000, label="a")
    raw_zk.create(f"{registration.path}:left", b"squat")
    assert publisher.deregister(registration) is True
    assert raw_zk.exists(registration.path) is None
    assert raw_zk.get_children(f"/services/{SERVICE}") == ["p:a:left"]
    assert "is no departure mark" in caplog.text


def test_a_service_whose_spec_does_not_mark_departures_is_never_protected(make_client, raw_zk):
    # Its publishers delete plainly (one Delete: test_publisher's
    # test_deregistration_costs_one_conditional_delete[plain]), so a reader cannot tell a
    # deregistration from an expiry: an unmarked mass deletion reaches a protecting reader at
    # once, as it reaches one without protection, and explain() says why nothing is held.
    publisher, reader, registrations = _four_listed(make_client, HOLD, mark_departures=False)
    assert reader.read_service(SERVICE).spec.mark_departures is False
    for registration in registrations[:3]:
        raw_zk.delete(registration.path)  # unmarked: 3 of 4 gone, as in a mass expiry
    assert wait_until(lambda: listed(reader) == 1, 10)
    # The loss and the (absent) protection are applied in the same snapshot: nothing later.
    assert not protected(reader) and reader.cache_stats.protection_episodes == 0
    assert [e.label for e in reader.cached_instances(SERVICE)] == ["i3"]
    note = reader.explain(SERVICE).unprotected
    assert note is not None and "does not mark departures" in note
    assert f"ensure_service({SERVICE!r}, mark_departures=True)" in note
    # A reader without protection has nothing to say, nor does one for a marking service.
    assert publisher.explain(SERVICE).unprotected is None
    publisher.ensure_service("marked", mark_departures=True)
    publisher.register("marked", "p", "10.0.0.1", 9000)
    assert reader.explain("marked").unprotected is None
