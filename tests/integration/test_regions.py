"""Failover across regions on three real ensembles (issue 42's must-show tests).

East is this client's region, an ensemble of three members; west and north are one server
each, reached through the project's relay with latency injected (west near, north far), so
"nearest" means something. Every region holds the same shard policy (k1..k4 -> p1..p4) and
the service ``orders``, whose spec fails over to the nearest region, then to north:

======  ====================  =======================================
region  instances of orders   reached
======  ====================  =======================================
east    p1                    directly (three members)
west    p1, p2                through a relay, 2 ms each way
north   p1, p2, p3            through a relay, 50 ms each way
======  ====================  =======================================

The ensembles start once for the module (a three-member ensemble is the expensive part);
tests that break a region put it back before they end. Bounds are stated beside each test.
"""

from __future__ import annotations

import json
import pickle
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client import CollectorRegistry

from sentinel import AuthConfig, Sentinel
from sentinel.auth.keys import ClientKeyring
from sentinel.cli import main as cli_main
from sentinel.errors import NoInstanceAvailable
from sentinel.integrations.httpx import SentinelTransport
from sentinel.integrations.spark import ClientConfig, get_client
from sentinel.regions import LOCAL_ONLY, Failover, Region, Regions
from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper, four_letter_word

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAMESPACE = "/regions"
RETURN_AFTER = 1.5  # the hold-down these tests use (the default is 10 s)
RULE = Failover(nearest=1, regions=("north",), return_after=RETURN_AFTER)
HOSTS = {"east": "10.0.1.1", "west": "10.0.2.1", "north": "10.0.3.1"}
PARTITIONS = {"east": ("p1",), "west": ("p1", "p2"), "north": ("p1", "p2", "p3")}
KEYS = {"k1": "p1", "k2": "p2", "k3": "p3", "k4": "p4"}


@dataclass
class World:
    east: LocalZooKeeper
    west: LocalZooKeeper
    north: LocalZooKeeper
    links: dict[str, TcpProxy]
    publishers: dict[str, Sentinel]
    regions: Regions

    def client(self, **options: object) -> Sentinel:
        options = {
            "client_id": "east-app",
            "session_timeout": 4.0,
            "connect_timeout": 5.0,
            "prometheus_registry": None,
        } | options
        return Sentinel(namespace=NAMESPACE, regions=self.regions, **options).start()

    def register(self, region: str, partition: str, port: int = 8080) -> object:
        return self.publishers[region].register(
            "orders", partition, HOSTS[region], port, label=f"{region}-{partition}-{port}"
        )


def region_of(endpoint: object) -> str:
    return {host: region for region, host in HOSTS.items()}[endpoint.host]  # type: ignore[attr-defined]


def sessions(zk: LocalZooKeeper) -> dict[str, int]:
    """Session id -> requests received, of every client connection the server holds now
    (``cons``), the four-letter word's own connection left out."""
    found = {}
    for member in zk:
        host, port = member.connect_string.split(":")
        for line in four_letter_word(host, int(port), "cons").splitlines():
            match = re.search(r"recved=(\d+).*sid=(0x[0-9a-f]+)", line)
            if match:
                found[match.group(2)] = int(match.group(1))
    return found


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with (
        LocalZooKeeper(size=3) as east,
        LocalZooKeeper() as west,
        LocalZooKeeper() as north,
    ):
        links = {
            "west": TcpProxy("127.0.0.1", int(west.connect_string.split(":")[1]), delay=0.002),
            "north": TcpProxy("127.0.0.1", int(north.connect_string.split(":")[1]), delay=0.05),
        }
        regions = Regions(
            "east",
            [
                Region("east", east.connect_string, namespace=NAMESPACE),
                Region("west", links["west"].address, namespace=NAMESPACE),
                Region("north", links["north"].address, namespace=NAMESPACE),
            ],
        )
        publishers = {}
        for name, zk in (("east", east), ("west", west), ("north", north)):
            publisher = Sentinel(
                zk.connect_string,
                f"publisher-{name}",
                NAMESPACE,
                prometheus_registry=None,
                regions=False,
                session_timeout=30.0,
            ).start()
            publisher.shard_maps.ensure(
                "tenants", "directory", partitions=sorted(set(KEYS.values()))
            )
            publisher.shard_maps.assign_many("tenants", KEYS)
            publisher.ensure_service("orders", shard_policy="tenants", failover=RULE)
            publisher.ensure_service("billing")  # no failover rule
            publisher.register("billing", "b", HOSTS[name], 9000)
            publishers[name] = publisher
        world = World(east, west, north, links, publishers, regions)
        for name, partitions in PARTITIONS.items():
            for partition in partitions:
                world.register(name, partition)
        yield world
        for publisher in publishers.values():
            publisher.close()
        for link in links.values():
            link.close()


def test_nothing_is_asked_of_another_region_while_the_local_one_suffices(world):
    before = {name: sessions(getattr(world, name)) for name in ("west", "north")}
    with world.client(client_id="local-only") as client:
        for _ in range(1000):
            assert region_of(client.get_service("orders", "k1")) == "east"
        assert region_of(client.get_service("billing")) == "east"
        explanation = client.explain("orders", "k1")
        assert (explanation.region, explanation.region_reason) == (
            "east",
            "the local region has eligible instances",
        )
        # The servers' own view: no session of this client there, so no request either.
        for name in ("west", "north"):
            assert sessions(getattr(world, name)).keys() == before[name].keys(), name
        assert client.regions_router.states() == {}  # no region opened


def test_a_partition_with_no_local_instance_resolves_from_the_nearest_region_with_one(world):
    with world.client() as client:
        assert region_of(client.get_service("orders", "k1")) == "east"
        # p2: none in east; west is nearest (its relay 2 ms a way against north's 50 ms).
        assert region_of(client.get_service("orders", "k2")) == "west"
        rtt = client.regions_router.states()
        assert rtt["west"][0] < rtt["north"][0], rtt
        explanation = client.explain("orders", "k2")
        assert explanation.region == "west"
        assert "nearest by round-trip time" in explanation.region_reason
        assert explanation.home is not None and explanation.home.eligible == ()
        # p3: not in west either; the rule's list names north next.
        assert region_of(client.get_service("orders", "k3")) == "north"
        assert "listed 1 of 1" in client.explain("orders", "k3").region_reason
        # p4: nowhere; the error says what each region said of itself: asked on this
        # client's behalf (one hop), not what it would say of failing over from there.
        with pytest.raises(NoInstanceAvailable, match=r"failover.*west.*north") as nowhere:
            client.get_service("orders", "k4")
        assert "no other region" not in str(nowhere.value), nowhere.value
        # the local region still answers what it has, without asking anyone
        assert region_of(client.get_service("orders", "k1")) == "east"
        assert client.regions_router.failovers == {("orders", "west"): 1, ("orders", "north"): 1}


def test_each_region_is_seen_in_the_clients_metrics(world):
    registry = CollectorRegistry()
    with world.client(client_id="metered", prometheus_registry=registry) as client:
        assert region_of(client.get_service("orders", "k2")) == "west"
        client.get_service("orders", "k2")
        value = registry.get_sample_value
        labels = {"client": "metered", "service": "orders", "region": "west"}
        assert value("sentinel_region_failovers_total", labels) == 1
        assert value("sentinel_region_lookups_total", labels) == 2
        rtt = {
            r: value("sentinel_region_rtt_seconds", {"client": "metered", "region": r})
            for r in ("west", "north")
        }
        assert 0 < rtt["west"] < rtt["north"] < 5, rtt
        for region in ("east", "west", "north"):
            staleness = {"client": "metered", "region": region}
            assert value("sentinel_region_staleness_seconds", staleness) == 0.0


def test_a_call_overrides_the_services_rule(world):
    with world.client() as client:
        with pytest.raises(NoInstanceAvailable, match="has no live instance"):
            client.get_service("orders", "k2", failover=LOCAL_ONLY)
        # a rule may only name regions this client's own configuration holds
        with pytest.raises(NoInstanceAvailable, match="elsewhere: not configured"):
            client.get_service("orders", "k2", failover=Failover(regions=("elsewhere",)))
        far = Failover(regions=("north",))
        assert region_of(client.get_service("orders", "k2", failover=far)) == "north"
        assert client.explain("orders", "k2", failover=far).region == "north"
        # a service whose spec has no rule stays local, unless the call says otherwise
        world.publishers["east"].deregister(
            next(r for r in world.publishers["east"].registrations if r.service == "billing")
        )
        try:
            assert (
                wait_until(lambda: not client.cached_instances("billing"), timeout=10) is not None
            )
            with pytest.raises(NoInstanceAvailable):
                client.get_service("billing")
            west = Failover(regions=("west",))
            assert region_of(client.get_service("billing", failover=west)) == "west"
        finally:
            world.publishers["east"].register("billing", "b", HOSTS["east"], 9000)


def test_credentials_are_per_region_and_sentinel_resolve_says_which_region_answered(world, capsys):
    """The failed-over endpoint carries the credential the other region's manager published
    for this client (its session there published the client's public key), and a rotation
    there completes with this client's confirmation; the CLI names the region and the rule."""
    with world.client(client_id="keyed-app", auth=AuthConfig(keys=ClientKeyring.generate())) as c:
        assert region_of(c.get_service("orders", "k2")) == "west"
        world.publishers["west"].credentials.publish(
            "orders", "keyed-app", {"user": "west-user", "password": "not-secret"}
        )
        assert wait_until(lambda: c.get_service("orders", "k2").auth is not None, timeout=15)
        assert c.get_service("orders", "k2").auth["user"] == "west-user"
        assert c.get_service("orders", "k1").auth is None  # east published nothing

        class Backend:  # the credential store of west's manager
            def __init__(self) -> None:
                self.revoked: list[int] = []

            def create(self, service: str, client: str, version: int) -> dict[str, str]:
                return {"user": f"west-v{version}", "password": "not-secret"}

            def revoke(self, service: str, client: str, version: int) -> None:
                self.revoked.append(version)

        # Rotation (Procedure 2) in west waits for this client's west session to confirm.
        backend = Backend()
        result = world.publishers["west"].credentials.rotate(
            "orders", "keyed-app", backend, timeout=20
        )
        new = result.versions["keyed-app"]
        assert backend.revoked == [new - 1]
        assert c.get_service("orders", "k2").auth["user"] == f"west-v{new}"
    document = json.dumps(
        {
            "local": "east",
            "regions": {
                n: {"hosts": r.hosts, "namespace": NAMESPACE}
                for n, r in world.regions.regions.items()
            },
        }
    )
    base = ["resolve", "orders", "k2", "--regions", document, "--region", "east"]
    assert cli_main(base) == 0
    out = capsys.readouterr().out
    assert (
        "region west: failover rule nearest 1 by round-trip time then north: west is nearest" in out
    )
    assert cli_main([*base, "--failover", "north", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["region"] == "north" and answer["picks"][0]["host"] == HOSTS["north"]
    assert cli_main([*base, "--failover", "local"]) == 1
    assert "region east: nothing eligible locally; failover: local only" in capsys.readouterr().out


def test_the_httpx_transport_follows_a_failover_like_any_change(world):
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.host)
        return httpx.Response(200)

    with world.client() as client:
        transport = SentinelTransport(client, transport=httpx.MockTransport(answer))
        with httpx.Client(transport=transport) as http:
            for key in ("k1", "k2", "k3"):
                http.get("http://orders.sentinel/x", extensions={"sentinel_key": key})
    assert sent == [HOSTS["east"], HOSTS["west"], HOSTS["north"]]


def test_a_spark_executors_client_resolves_local_first_and_fails_over_with_the_same_rules(world):
    """What runs in a PySpark worker (``get_client``, the process's client built from the
    plain values of a ``ClientConfig``): local first, then the service's rule."""
    config = ClientConfig(
        hosts=world.east.connect_string, namespace=NAMESPACE, client_id="etl", regions=world.regions
    )
    config = pickle.loads(pickle.dumps(config))  # as it travels in a closure
    client = get_client(config)
    try:
        assert get_client(config) is client
        assert [region_of(client.get_service("orders", k)) for k in ("k1", "k2", "k3")] == [
            "east",
            "west",
            "north",
        ]
    finally:
        client.close()


def test_clients_return_home_after_the_hold_down_and_never_flap(world):
    """Bound: a client returns to the local region no sooner than ``return_after`` after its
    instance is registered, and within ``return_after`` + 3 s (propagation and the hold's
    timer, on a loaded machine); a local instance that lives shorter than ``return_after``
    never draws it back."""
    with world.client() as client:
        assert region_of(client.get_service("orders", "k2")) == "west"
        registered = time.monotonic()
        home = world.register("east", "p2")
        answers = []

        def returned() -> bool:
            answers.append((time.monotonic(), region_of(client.get_service("orders", "k2"))))
            return answers[-1][1] == "east"

        try:
            assert wait_until(returned, timeout=RETURN_AFTER + 3.0) is not None, answers[-3:]
            first_home = answers[-1][0]
            assert first_home - registered >= RETURN_AFTER
            # back home, it stays home: no answer from elsewhere afterwards
            assert all(region_of(client.get_service("orders", "k2")) == "east" for _ in range(2000))
            assert client.explain("orders", "k2").region == "east"
        finally:
            world.publishers["east"].deregister(home)
        assert (
            wait_until(lambda: region_of(client.get_service("orders", "k2")) == "west", timeout=10)
            is not None
        )
        # A local instance that comes and goes within the hold-down: the client never returns.
        flapping = world.register("east", "p2", port=8081)
        seen = set()
        until = time.monotonic() + RETURN_AFTER / 4
        while time.monotonic() < until:
            seen.add(region_of(client.get_service("orders", "k2")))
            time.sleep(0.005)
        held = client.explain("orders", "k2")
        world.publishers["east"].deregister(flapping)
        assert seen == {"west"}
        assert held.region == "west"
        assert "held back" in held.home.verdicts["p2:east-p2-8081"]
        until = time.monotonic() + RETURN_AFTER
        while time.monotonic() < until:
            assert region_of(client.get_service("orders", "k2")) == "west"
            time.sleep(0.01)


def test_a_whole_region_killed_sends_lookups_to_the_next(world):
    """West's only server killed: lookups of p2 go to north once the client's session to west
    is lost (a refused connection, at once); a client that never needed west notices nothing."""
    with world.client() as client, world.client(client_id="bystander") as bystander:
        assert region_of(client.get_service("orders", "k2")) == "west"
        server = world.west.members[0]
        server.kill()
        try:
            assert (
                wait_until(
                    lambda: region_of(client.get_service("orders", "k2")) == "north", timeout=15
                )
                is not None
            )
            for _ in range(1000):
                assert region_of(bystander.get_service("orders", "k1")) == "east"
            assert bystander.regions_router.states() == {}
        finally:
            server.restart()
        assert (
            wait_until(lambda: client.regions_router.remotes.by_name["west"].connected, timeout=30)
            is not None
        )


def test_a_region_cut_off_keeps_serving_what_it_had_and_heals(world):
    """North cut off (every relayed connection dropped, new ones refused): the client's
    lookups that only north answers keep the instances it had; an instance registered in
    north during the cut is seen once the link is restored."""
    with world.client() as client:
        assert region_of(client.get_service("orders", "k3")) == "north"
        north = client.regions_router.remotes.by_name["north"]
        world.links["north"].cut()
        try:
            assert wait_until(lambda: not north.connected, timeout=15) is not None
            for _ in range(100):
                assert region_of(client.get_service("orders", "k3")) == "north"
            added = world.register("north", "p3", port=8082)
        finally:
            world.links["north"].restore()
        try:
            assert wait_until(lambda: north.connected, timeout=30) is not None
            assert (
                wait_until(lambda: len(client.eligible_instances("orders", "k3")) == 2, timeout=15)
                is not None
            )
        finally:
            world.publishers["north"].deregister(added)


def test_the_local_region_cut_off_serves_what_it_had_and_fails_over_where_it_has_nothing(world):
    east_member = world.east.members[0]
    host, port = east_member.connect_string.split(":")
    link = TcpProxy(host, int(port))
    try:
        with world.client(hosts=link.address, client_id="cut-local") as client:
            assert region_of(client.get_service("orders", "k1")) == "east"
            link.cut()
            assert wait_until(lambda: client.connection_state != "connected", timeout=15)
            for _ in range(100):
                assert region_of(client.get_service("orders", "k1")) == "east"  # what it had
            assert region_of(client.get_service("orders", "k2")) == "west"  # it had nothing
            link.restore()
            assert wait_until(lambda: client.connection_state == "connected", timeout=30)
            assert region_of(client.get_service("orders", "k1")) == "east"
    finally:
        link.close()


def test_the_local_ensemble_losing_quorum_keeps_serving_and_fails_over_where_needed(world):
    """Two of east's three members killed: no quorum. A client keeps serving the local
    instances it had and fails over for partitions it has none of; quorum back, it is
    connected again."""
    with world.client(client_id="quorum") as client:
        assert region_of(client.get_service("orders", "k1")) == "east"
        killed = [m for m in world.east.members][:2]
        for member in killed:
            member.kill()
        try:
            assert wait_until(lambda: client.connection_state != "connected", timeout=20)
            for _ in range(100):
                assert region_of(client.get_service("orders", "k1")) == "east"
            assert region_of(client.get_service("orders", "k2")) == "west"
        finally:
            for member in killed:
                member.restart()
        assert wait_until(lambda: client.connection_state == "connected", timeout=40)
