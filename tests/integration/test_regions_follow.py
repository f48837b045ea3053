"""What follows a failover across regions: PostgreSQL pools, and listeners that look up.

Two regions of one single-server ensemble each, started once for the module: east (this
client's) and west, reached through the project's relay so that a test can stall it. Real
PostgreSQL servers stand for a replica in each region (a primary and its streaming replica,
told apart by ``inet_server_port()``); both are registered under the same instance name
(``p1:r1``), as two regions that name their replicas alike would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sentinel import AuthConfig, Sentinel
from sentinel.auth.keys import ClientKeyring
from sentinel.errors import NoInstanceAvailable, ValidationError
from sentinel.events import InstancesChanged
from sentinel.integrations.postgres import ReplicaPools
from sentinel.regions import Failover, Region, Regions
from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.testing.postgres import LocalPostgres, PostgresNotInstalled
from sentinel.testing.zookeeper import LocalZooKeeper

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAMESPACE = "/regions-follow"
RETURN_AFTER = 1.0
DB = "orders-db"
RULE = Failover(regions=("west",), return_after=RETURN_AFTER)


@dataclass
class World:
    east: LocalZooKeeper
    west: LocalZooKeeper
    link: TcpProxy
    publishers: dict[str, Sentinel]
    regions: Regions

    def client(self, client_id: str, **options: object) -> Sentinel:
        options = {"session_timeout": 4.0, "connect_timeout": 5.0} | options
        return Sentinel(
            namespace=NAMESPACE,
            client_id=client_id,
            regions=self.regions,
            prometheus_registry=None,
            **options,  # type: ignore[arg-type]
        ).start()


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with LocalZooKeeper() as east, LocalZooKeeper() as west:
        link = TcpProxy("127.0.0.1", int(west.connect_string.split(":")[1]))
        regions = Regions(
            "east",
            [
                Region("east", east.connect_string, namespace=NAMESPACE),
                Region("west", link.address, namespace=NAMESPACE),
            ],
        )
        # each region's own publisher, on its ensemble directly (never through the relay)
        publisher = dict(namespace=NAMESPACE, prometheus_registry=None, regions=False)
        publishers = {
            name: Sentinel(zk.connect_string, f"publisher-{name}", **publisher).start()  # type: ignore[arg-type]
            for name, zk in (("east", east), ("west", west))
        }
        try:
            yield World(east, west, link, publishers, regions)
        finally:
            for publisher in publishers.values():
                publisher.close()
            link.close()


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[LocalPostgres, LocalPostgres]]:
    """(east's server, west's server): a primary and its replica."""
    try:
        primary = LocalPostgres()
    except PostgresNotInstalled as exc:
        pytest.skip(f"PostgreSQL is not installed here and could not be: {exc}")
    with primary:
        yield primary, primary.add_replica()


def answers(client: Sentinel, service: str = DB) -> tuple:
    """The eligible instances of ``service``, in whichever region answers; () for none."""
    try:
        return client.eligible_instances(service)
    except NoInstanceAvailable:
        return ()


def served_by(pools: ReplicaPools) -> int:
    with pools.connection() as conn:
        return conn.execute("SELECT inet_server_port()").fetchone()[0]


def test_pools_follow_a_failover_out_and_back_home(world, servers):
    east_db, west_db = servers
    for publisher in world.publishers.values():
        publisher.ensure_service(DB, scheme="postgresql", failover=RULE)

    def register(region: str, server: LocalPostgres) -> object:
        return world.publishers[region].register(
            DB, "p1", server.host, server.port, scheme="postgresql", label="r1"
        )

    def deregister(region: str, registration: object) -> None:
        assert world.publishers[region].deregister(registration)  # type: ignore[arg-type]

    west_r1 = register("west", west_db)
    login = {"user": "postgres", "password": east_db.password, "dbname": "postgres"}
    with (
        world.client("pools-app") as client,
        ReplicaPools(client, DB, kwargs=login, min_size=1, max_size=2, timeout=10) as pools,
    ):
        # No local replica: the connection is west's replica's, from a pool of its own.
        assert served_by(pools) == west_db.port
        west_pool = pools.pool(client.get_service(DB))  # the pool that connection came from
        assert not west_pool.closed

        # West's replica leaves: its pool is closed, as a local one's would be.
        deregister("west", west_r1)
        assert wait_until(lambda: west_pool.closed, 10), "the departed remote pool stayed open"
        with pytest.raises(NoInstanceAvailable, match="west"):
            served_by(pools)

        # It comes back; then the local replica appears, under the same name (p1:r1).
        west_r1 = register("west", west_db)
        assert wait_until(lambda: answers(client), 10)
        assert served_by(pools) == west_db.port
        west_pool = pools.pool(client.get_service(DB))
        registered_at = time.monotonic()  # the hold starts when the client sees it: later
        register("east", east_db)
        # Held for return_after: checkouts stay in west meanwhile (the lower bound, exactly).
        while time.monotonic() < registered_at + RETURN_AFTER:
            assert served_by(pools) == west_db.port
        # Then home: new checkouts take the local replica, on a pool of its own (not west's,
        # whose instance has the same name).
        assert wait_until(lambda: served_by(pools) == east_db.port, RETURN_AFTER + 5)
        east_pool = pools.pool(client.get_service(DB))
        assert east_pool is not west_pool
        assert "(region west)" in repr(pools) and "(region east)" in repr(pools), repr(pools)
        # West's replica leaves now: its pool closes, the local one stays.
        deregister("west", west_r1)
        assert wait_until(lambda: west_pool.closed, 10), "the departed remote pool stayed open"
        assert not east_pool.closed
        assert served_by(pools) == east_db.port


def test_a_rotation_in_one_region_drains_that_regions_pools_only(world, servers):
    """Each pool remembers its region: west's rotation (its credential v2) closes the pool of
    west's replica, opened with west's v1, and not east's, opened with east's own v1."""
    east_db, west_db = servers
    service = "ledger-db"
    for publisher in world.publishers.values():
        publisher.ensure_service(service, scheme="postgresql", failover=RULE)
    world.publishers["west"].register(
        service, "p1", west_db.host, west_db.port, scheme="postgresql", label="r1"
    )
    login = {"user": "postgres", "password": east_db.password, "dbname": "postgres"}
    keys = AuthConfig(keys=ClientKeyring.generate())
    with (
        world.client("rotating-app", auth=keys) as client,
        ReplicaPools(client, service, kwargs=login, min_size=1, max_size=2, timeout=10) as pools,
    ):
        assert client.get_service(service).port == west_db.port  # west opened: its key there
        for publisher in world.publishers.values():
            publisher.credentials.publish(service, "rotating-app", login)
        assert wait_until(lambda: client.get_service(service).auth is not None, 15)
        with pools.connection() as conn:
            assert conn.info.port == west_db.port
        west_pool = pools.pool(client.get_service(service))
        registered_at = time.monotonic()
        world.publishers["east"].register(
            service, "p1", east_db.host, east_db.port, scheme="postgresql", label="r1"
        )
        assert wait_until(
            lambda: [e.port for e in answers(client, service)] == [east_db.port], RETURN_AFTER + 5
        )
        assert time.monotonic() >= registered_at + RETURN_AFTER
        east_endpoint = client.get_service(service)
        assert east_endpoint.auth is not None, "east's credential never reached the client"
        east_pool = pools.pool(east_endpoint)
        with pools.connection() as conn:
            assert conn.info.port == east_db.port

        class Backend:  # west's credential store: the same login under a new version
            def create(self, service: str, client: str, version: int) -> dict[str, str]:
                return login

            def revoke(self, service: str, client: str, version: int) -> None:
                pass

        result = world.publishers["west"].credentials.rotate(
            service, "rotating-app", Backend(), timeout=20
        )
        assert result.versions["rotating-app"] == 2
        # The client confirmed v2 only after its listeners returned: the pool is closed now.
        assert west_pool.closed, "west's pool of the old credential stayed open"
        assert not east_pool.closed, "west's rotation closed east's pool"
        with pools.connection() as conn:
            assert conn.info.port == east_db.port


def test_a_listener_of_another_region_has_the_local_ones_shape_and_hears_the_rules_target(world):
    """One listener shape: ``Sentinel.listen(service, callback, region=...)`` calls
    ``callback(event)`` with another region's changes as without ``region`` with the local
    one's. A rule naming another service there (a read-only twin): its changes in the other
    region reach the listener of the local name; the local region's own changes do not come
    to the other region's listener, nor the other region's to the local one."""
    for publisher in world.publishers.values():
        publisher.ensure_service("stock", failover=Failover(regions=("west",), service="stock-ro"))
    world.publishers["west"].ensure_service("stock-ro")
    twin = world.publishers["west"].register("stock-ro", "default", "10.0.2.1", 7100)
    heard: dict[str, list[object]] = {"east": [], "west": []}
    with world.client("twin-app") as client:
        for region, events in heard.items():  # east is this client's own region
            client.listen("stock", events.append, region=region)
        with pytest.raises(ValidationError, match="'north' is not another region"):
            client.listen("stock", print, region="north")
        with pytest.raises(ValidationError, match="'west': this client has no other region"):
            world.publishers["east"].listen("stock", print, region="west")
        assert client.get_service("stock").port == 7100  # west's twin answers
        east = world.publishers["east"].register("stock", "default", "10.0.1.1", 7200)
        assert wait_until(lambda: client.cached_instances("stock"), 10)
        assert world.publishers["west"].deregister(twin)

        def twin_left() -> bool:
            return any(
                isinstance(e, InstancesChanged) and [r.port for r in e.removed] == [7100]
                for e in heard["west"]
            )

        def east_heard() -> bool:
            return any(isinstance(e, InstancesChanged) and e.added for e in heard["east"])

        assert wait_until(twin_left, 10), heard
        assert wait_until(east_heard, 10), heard
        assert {e.service for e in heard["west"]} == {"stock-ro"}  # type: ignore[attr-defined]
        assert {getattr(e, "service", "stock") for e in heard["east"]} == {"stock"}
        assert all(7100 not in {r.port for r in getattr(e, "added", ())} for e in heard["east"])
        world.publishers["east"].deregister(east)


@pytest.mark.parametrize(
    ("jobs", "rule", "base"),
    [
        ("jobs", Failover(regions=("west",)), 9000),
        # nearest: ranking needs west's distance, which a listener's thread does not wait for
        ("jobs-near", Failover(nearest=1), 9200),
    ],
    ids=["listed", "nearest"],
)
def test_a_cold_failover_on_a_listener_thread_does_not_hold_the_worker(world, jobs, rule, base):
    world.publishers["east"].ensure_service("ticks")
    for publisher in world.publishers.values():
        publisher.ensure_service(jobs, failover=rule)
    world.publishers["west"].register(jobs, "default", "10.0.2.1", 7000, label="w1")
    heard: list[str] = []
    replies: list[object] = []
    delivered = threading.Condition()

    connect_timeout = 6.0
    with world.client(f"listener-{jobs}", connect_timeout=connect_timeout) as client:
        client.prefetch("ticks")

        def on_tick(event: object) -> None:
            if not isinstance(event, InstancesChanged) or not event.added:
                return
            started = time.monotonic()
            try:
                answer: object = client.get_service(jobs)
            except NoInstanceAvailable as exc:
                answer = exc
            with delivered:
                heard.extend(e.label for e in event.added)
                replies.append((answer, time.monotonic() - started))
                delivered.notify_all()

        client.listen("ticks", on_tick)
        world.link.pause()  # west answers nothing: its session cannot open meanwhile
        try:
            cut_at = time.monotonic()
            for n in range(3):
                world.publishers["east"].register("ticks", "default", "10.0.1.1", base + n)
                label = f"10.0.1.1_{base + n}"
                with delivered:
                    assert delivered.wait_for(lambda label=label: label in heard, connect_timeout)
            # Every event was delivered, and well before the session could have opened.
            assert time.monotonic() - cut_at < connect_timeout
            for answer, took in replies:
                assert isinstance(answer, NoInstanceAvailable), answer
                assert "west: being opened in the background" in str(answer)
                assert took < 1.0, took
        finally:
            world.link.resume()
        # Once west answers, the listener's retry finds it open.
        world.publishers["east"].register("ticks", "default", "10.0.1.1", base + 100)
        with delivered:
            assert delivered.wait_for(lambda: f"10.0.1.1_{base + 100}" in heard, 20)
        answer, _ = replies[-1]
        if isinstance(answer, NoInstanceAvailable):  # west's session may still be opening
            assert wait_until(
                lambda: client.regions_router.remotes.by_name["west"].ready.is_set(), 20
            )
            answer = client.get_service(jobs)
        assert answer.port == 7000  # type: ignore[attr-defined]
        # Off a listener's thread nothing changed: a lookup waits for a region (now open).
        assert client.get_service(jobs).port == 7000
