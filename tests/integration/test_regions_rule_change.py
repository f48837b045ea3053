"""Changing a service's failover rule: the write (``Sentinel.set_failover``, ``sentinel
failover``) and what running clients do (docs/regions.md, "Changing a rule").

Three single-server ensembles: east (this client's region, the session's shared server),
west and north (one each for the module); every test has namespaces of its own. The evidence
is what lookups return, what each region's client holds, and the watches each region's server
holds for it (``wchc``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kazoo.client import KazooClient

from sentinel import Sentinel
from sentinel.errors import (
    NoInstanceAvailable,
    RegionConfigError,
    RegistryConflict,
    ServiceNotFound,
    ValidationError,
)
from sentinel.publisher import FAILOVER_ATTEMPTS, write_failover
from sentinel.regions import Failover, Region, Regions
from sentinel.registry.layout import service_path
from sentinel.registry.records import ServiceSpec
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from tests.conftest import sentinel_in_process
from tests.integration.test_zk_watches import watches_held

pytestmark = pytest.mark.integration

HOSTS = {"east": "10.0.1.1", "west": "10.0.2.1", "north": "10.0.3.1"}
RETURN_AFTER = 0.5


@pytest.fixture(scope="module")
def west() -> Iterator[LocalZooKeeper]:
    with LocalZooKeeper() as zk:
        yield zk


@pytest.fixture(scope="module")
def north() -> Iterator[LocalZooKeeper]:
    with LocalZooKeeper() as zk:
        yield zk


@dataclass
class World:
    ensembles: dict[str, LocalZooKeeper]
    namespace: str
    publishers: dict[str, Sentinel]
    regions: Regions

    def client(self) -> Sentinel:
        return Sentinel(
            namespace=self.namespace,
            client_id="east-app",
            regions=self.regions,
            session_timeout=4.0,
            connect_timeout=5.0,
            prometheus_registry=None,
        ).start()

    def register(self, region: str, service: str, port: int = 8080) -> object:
        return self.publishers[region].register(service, "p", HOSTS[region], port)

    def regions_document(self) -> str:
        return json.dumps(
            {
                "local": "east",
                "regions": {
                    name: {"hosts": zk.connect_string, "namespace": self.namespace}
                    for name, zk in self.ensembles.items()
                },
            }
        )


@pytest.fixture
def world(zookeeper, west, north, namespace) -> Iterator[World]:
    ensembles = {"east": zookeeper, "west": west, "north": north}
    regions = Regions(
        "east",
        [Region(name, zk.connect_string, namespace=namespace) for name, zk in ensembles.items()],
    )
    publishers = {
        name: Sentinel(
            zk.connect_string,
            f"publisher-{name}",
            namespace,
            prometheus_registry=None,
            regions=False,
        ).start()
        for name, zk in ensembles.items()
    }
    try:
        yield World(ensembles, namespace, publishers, regions)
    finally:
        for publisher in publishers.values():
            publisher.close()


def region_of(endpoint: object) -> str:
    return {host: region for region, host in HOSTS.items()}[endpoint.host]  # type: ignore[attr-defined]


def answer(client: Sentinel, service: str) -> str | None:
    """The region whose instance ``service``'s lookup returns; None for none."""
    try:
        return region_of(client.get_service(service))
    except NoInstanceAvailable:
        return None


def remote(client: Sentinel, region: str) -> Sentinel:
    found = client.regions_router.remotes.by_name[region].client  # type: ignore[union-attr]
    assert found is not None, f"region {region} was never opened"
    return found  # type: ignore[return-value]


def service_watches(world: World, client: Sentinel, region: str, service: str) -> list[str]:
    """The watches ``region``'s server holds for ``client``'s session there on ``service``'s
    nodes."""
    zk = remote(client, region).session.zk
    return [w for w in watches_held(world.ensembles[region], zk) if f"/services/{service}" in w]


# --- the write ---------------------------------------------------------------------------------


def test_set_failover_rewrites_only_the_rule_and_refuses_what_it_cannot_write(world):
    east = world.publishers["east"]
    created = east.ensure_service(
        "orders", scheme="https", defaults={"timeout": 2}, failover=Failover(regions=("west",))
    )
    new = Failover(nearest=1, service="orders-ro", warm=True, return_after=30)
    stored = east.set_failover("orders", new)
    assert stored == ServiceSpec("orders", scheme="https", defaults={"timeout": 2}, failover=new), (
        "every other field is kept"
    )
    assert east.read_service("orders").spec == stored
    # None removes it (the region only), and again is no change
    assert east.set_failover("orders", None) == dataclasses.replace(created, failover=None)
    assert east.set_failover("orders", None) == dataclasses.replace(created, failover=None)
    # a service that does not exist is refused, and not created
    with pytest.raises(ServiceNotFound):
        east.set_failover("nowhere", new)
    assert east.session.zk.exists(service_path("nowhere")) is None
    # a rule that is not one writes nothing
    before = east.session.zk.get(service_path("orders"))
    for bad in ("west", {"regions": ["west"]}, 3):
        with pytest.raises(ValidationError, match="must be a Failover"):
            east.set_failover("orders", bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Failover(regions=("west", "west"))  # the rule's own checks come first
    assert east.session.zk.get(service_path("orders")) == before


class Interposed:
    """A kazoo client whose reads of the spec are each followed by another writer's change
    of the spec (its ``defaults``), on the real server, before the caller writes: the race a
    compare-and-set exists for. ``times``: how many reads are raced (then none is)."""

    def __init__(self, zk: KazooClient, other: KazooClient, times: int) -> None:
        self._zk, self._other, self.times, self.raced = zk, other, times, 0

    def get(self, path: str) -> tuple:
        found = self._zk.get(path)
        if self.raced < self.times:
            self.raced += 1
            spec = ServiceSpec.from_bytes("orders", path, found[0])
            changed = ServiceSpec(
                "orders", spec.scheme, defaults={"raced": self.raced}, failover=spec.failover
            )
            self._other.set(path, changed.to_bytes(path))
        return found

    def set(self, path: str, data: bytes, version: int) -> object:
        return self._zk.set(path, data, version=version)


def test_a_concurrent_change_of_the_spec_is_never_lost(world, raw_zk):
    east = world.publishers["east"]
    east.ensure_service("orders", failover=Failover(regions=("west",)))
    path = service_path("orders")
    rule = Failover(regions=("north",))
    # raced twice, then the third read is current: the write keeps the other writer's change
    racing = Interposed(east.session.zk, raw_zk, times=2)
    before, after = write_failover(racing, "orders", rule)  # type: ignore[arg-type]
    assert racing.raced == 2
    stored = ServiceSpec.from_bytes("orders", path, raw_zk.get(path)[0])
    assert stored.failover == rule and dict(stored.defaults) == {"raced": 2}
    assert before.failover == Failover(regions=("west",)) and after == stored
    # raced every time: a typed error after the bounded attempts, and the rule not written
    racing = Interposed(east.session.zk, raw_zk, times=FAILOVER_ATTEMPTS)
    with pytest.raises(RegistryConflict, match="kept changing"):
        write_failover(racing, "orders", Failover(regions=("west",)))  # type: ignore[arg-type]
    stored = ServiceSpec.from_bytes("orders", path, raw_zk.get(path)[0])
    assert stored.failover == rule and dict(stored.defaults) == {"raced": FAILOVER_ATTEMPTS}


def test_sentinel_failover_sets_the_rule_in_the_region_it_acts_in(world):
    for publisher in world.publishers.values():
        publisher.ensure_service("orders", failover=Failover(regions=("west",)))
    regions = ("--regions", world.regions_document())

    def run(*args: str):
        return sentinel_in_process("failover", *args, *regions, "--timeout", "5")

    done = run("orders", "nearest:1,north;warm;return_after=5", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "service": "orders",
        "region": "east",
        "old": {"regions": ["west"]},
        "new": {"regions": ["north"], "nearest": 1, "warm": True, "return_after": 5.0},
        "changed": True,
    }
    expected = Failover(regions=("north",), nearest=1, warm=True, return_after=5)
    assert world.publishers["east"].read_service("orders").spec.failover == expected
    # the other regions' specs are theirs: untouched unless --region names them
    assert world.publishers["west"].read_service("orders").spec.failover.regions == ("west",)
    done = run("orders", "local", "--region", "west")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "orders in region west: failover west -> local only"
    assert world.publishers["west"].read_service("orders").spec.failover is None
    done = run("orders", "local", "--region", "west")
    assert done.stdout.strip() == "orders in region west: failover is local only already"
    # a bad rule: a usage error, nothing written; a service that does not exist: exit 1
    for bad in ("nearest:x", "west;sideways", "west,west", ""):
        done = run("orders", bad)
        assert done.returncode == 2, (bad, done.stdout, done.stderr)
        assert done.stderr.startswith("sentinel: error: ") and "Traceback" not in done.stderr
    assert world.publishers["east"].read_service("orders").spec.failover == expected
    done = run("nowhere", "west")
    assert done.returncode == 1 and "'nowhere' is not registered" in done.stderr


def test_a_rule_naming_a_region_not_configured_is_refused_and_nothing_is_written(world):
    """``sentinel failover orders wset`` with regions that hold no ``wset``: its clients would
    skip the region (``not configured``), so the rule is a typo. Exit 2 naming the regions
    configured and the one meant; the API's ``set_failover`` refuses it the same way."""
    for publisher in world.publishers.values():
        publisher.ensure_service("orders", failover=Failover(regions=("west",)))
    done = sentinel_in_process(
        "failover", "orders", "wset", "--regions", world.regions_document(), "--timeout", "5"
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip() == (
        "sentinel: error: failover: no region 'wset'; configured: ['east', 'north', 'west']; "
        "did you mean 'west'?"
    )
    with world.client() as client, pytest.raises(RegionConfigError, match="did you mean 'west'"):
        client.set_failover("orders", Failover(regions=("north", "wset")))
    assert world.publishers["east"].read_service("orders").spec.failover == Failover(
        regions=("west",)
    )


# --- what running clients do -----------------------------------------------------------------


def test_a_running_client_follows_a_new_rule_and_lets_go_of_a_region_no_rule_names(world):
    for publisher in world.publishers.values():
        publisher.ensure_service("orders", failover=Failover(regions=("west",)))
    world.register("west", "orders")
    world.register("north", "orders")
    with world.client() as client:
        assert answer(client, "orders") == "west"  # east has none
        assert service_watches(world, client, "west", "orders"), "west follows orders"
        world.publishers["east"].set_failover("orders", Failover(regions=("north",)))
        # no restart: the next lookups go where the new rule says
        assert wait_until(lambda: answer(client, "orders") == "north") is not None
        # west is named by no rule of a followed service any more: it stops following orders
        west = remote(client, "west")
        assert wait_until(lambda: not west.cached_instances("orders")) is not None
        assert wait_until(lambda: not service_watches(world, client, "west", "orders"))
        # the rule back to west: west follows it again, on the lookup that needs it
        world.publishers["east"].set_failover("orders", Failover(regions=("west",)))
        assert wait_until(lambda: answer(client, "orders") == "west") is not None
        assert service_watches(world, client, "west", "orders")


def test_a_region_another_services_rule_still_names_keeps_following_it(world):
    for publisher in world.publishers.values():
        publisher.ensure_service("orders", failover=Failover(regions=("west",)))
        publisher.ensure_service("billing", failover=Failover(regions=("west",), service="orders"))
    world.register("west", "orders")
    world.register("north", "orders")
    with world.client() as client:
        assert answer(client, "orders") == "west" and answer(client, "billing") == "west"
        world.publishers["east"].set_failover("orders", Failover(regions=("north",)))
        assert wait_until(lambda: answer(client, "orders") == "north") is not None
        # billing's rule still asks west for orders: west keeps it
        assert region_of(client.get_service("billing")) == "west"
        assert remote(client, "west").cached_instances("orders")
        assert service_watches(world, client, "west", "orders")


def test_a_rule_made_warm_is_followed_before_any_failover(world):
    for publisher in world.publishers.values():
        publisher.ensure_service("billing")  # no rule: a client never leaves east for it
    world.register("east", "billing")
    world.register("north", "billing")
    with world.client() as client:
        assert answer(client, "billing") == "east"
        assert client.regions_router.remotes.by_name["north"].deadline is None  # never opened
        world.publishers["east"].set_failover("billing", Failover(regions=("north",), warm=True))
        # warm: north opens and follows billing while east still answers every lookup
        assert wait_until(
            lambda: (
                client.regions_router.remotes.by_name["north"].client is not None
                and remote(client, "north").cached_instances("billing")
            ),
            timeout=15,
        )
        assert answer(client, "billing") == "east"
        assert client.regions_router.answered == {}


def test_a_rule_removed_while_away_sends_lookups_home_without_waiting_for_the_hold(world):
    for publisher in world.publishers.values():
        publisher.ensure_service("orders", failover=Failover(regions=("west",), return_after=60))
    world.register("west", "orders")
    with world.client() as client:
        assert answer(client, "orders") == "west"  # away from east: a hold of 60 s on return
        world.register("east", "orders")
        assert wait_until(lambda: client.cached_instances("orders"))
        assert answer(client, "orders") == "west", "held: east has not been up for 60 s"
        # local only now: lookups could go nowhere else, so the hold ends with the rule
        world.publishers["east"].set_failover("orders", None)
        assert wait_until(lambda: answer(client, "orders") == "east") is not None
