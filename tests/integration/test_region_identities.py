"""No password of one region in the bytes another region's ensemble receives (issue 50, items
3 and 4), from the three kinds of session that reach another region: a client's, the CLI's
and the agent's (docs/regions.md, "Identities").

Two real ensembles: east, this process's region, whose password is ``$SENTINEL_ZK_IDENTITY``,
and west, reached only through a recording relay (:class:`TcpProxy` with ``record=True``):
every byte any session sent toward west's server is what west's operator, or whoever listens
on the way, would see. A digest identity crosses the wire as ``user:password`` in the clear
(ZooKeeper's ``addauth``), so the password's bytes in the recording are the leak itself.
Each test runs with west naming no identity (it must then be reached anonymously) and with
west naming its own (which must be the one west sees).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kazoo.client import KazooClient

from sentinel import Sentinel
from sentinel.agent.regions import RegionServers
from sentinel.agent.server import AgentServer
from sentinel.cli import main as cli_main
from sentinel.regions import Failover, Region, Regions
from sentinel.registry.layout import client_path
from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from tests.integration.test_agent_regions import socket_path  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration

NAMESPACE = "/region-identities"
EAST_SECRET = "east-secret-6d1f0b"
WEST_SECRET = "west-secret-93ac27"
EAST_IDENTITY = f"east-app:{EAST_SECRET}"
WEST_IDENTITY = f"west-app:{WEST_SECRET}"
WEST_ENV = "SENTINEL_ZK_IDENTITY_WEST"


@dataclass
class World:
    east: LocalZooKeeper
    west: LocalZooKeeper


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with LocalZooKeeper() as east, LocalZooKeeper() as west:
        publishers = []
        for name, zk in (("east", east), ("west", west)):
            publisher = Sentinel(
                zk.connect_string,
                f"publisher-{name}",
                NAMESPACE,
                prometheus_registry=None,
                regions=False,
                agent=False,
                identity="",  # anonymous: nothing of the tests' passwords anywhere
            ).start()
            publishers.append(publisher)
            # east has no instance: its lookups fail over to west
            publisher.ensure_service("orders", failover=Failover(regions=("west",)))
            if name == "west":
                publisher.register("orders", "p1", "10.0.2.1", 8080, label="w")
        yield World(east, west)
        for publisher in publishers:
            publisher.close()


@pytest.fixture
def west_link(world) -> Iterator[TcpProxy]:
    """The only way to west: a relay that records what is sent to west's server."""
    link = TcpProxy("127.0.0.1", int(world.west.connect_string.split(":")[1]), record=True)
    yield link
    link.close()


@pytest.fixture(params=[False, True], ids=["west-anonymous", "west-has-its-identity"])
def west_identity(request, monkeypatch) -> str | None:
    """Whether west names an identity of its own (through ``identity_env``, for the
    document); east's password is the process's default either way."""
    monkeypatch.setenv("SENTINEL_ZK_IDENTITY", EAST_IDENTITY)
    monkeypatch.delenv("SENTINEL_REGION", raising=False)
    monkeypatch.delenv("SENTINEL_REGIONS", raising=False)
    monkeypatch.delenv("SENTINEL_AGENT", raising=False)
    if request.param:
        monkeypatch.setenv(WEST_ENV, WEST_IDENTITY)
        return WEST_IDENTITY
    monkeypatch.delenv(WEST_ENV, raising=False)
    return None


def regions(world: World, link: TcpProxy, west_identity: str | None) -> Regions:
    return Regions(
        "east",
        [
            Region("east", world.east.connect_string, namespace=NAMESPACE),
            Region("west", link.address, namespace=NAMESPACE, identity=west_identity),
        ],
    )


def document(world: World, link: TcpProxy, west_identity: str | None) -> str:
    west = {"hosts": link.address, "namespace": NAMESPACE}
    if west_identity is not None:
        west["identity_env"] = WEST_ENV
    east = {"hosts": world.east.connect_string, "namespace": NAMESPACE}
    return json.dumps({"local": "east", "regions": {"east": east, "west": west}})


def assert_west_saw_only_its_own(link: TcpProxy, west_identity: str | None) -> None:
    seen = link.recorded()
    assert NAMESPACE.encode() in seen  # something did reach west: the check is not vacuous
    assert EAST_SECRET.encode() not in seen, "east's password reached west's ensemble"
    if west_identity is not None:
        assert WEST_SECRET.encode() in seen, "west's own identity was not presented there"


def test_a_client_failing_over_presents_west_only_wests_identity(world, west_link, west_identity):
    """(a) A client of east, its password the default, reads west by failing over."""
    with Sentinel(
        client_id="east-app",
        regions=regions(world, west_link, west_identity),
        agent=False,
        prometheus_registry=None,
        connect_timeout=5.0,
    ) as client:
        assert client.get_service("orders").host == "10.0.2.1"
    assert_west_saw_only_its_own(west_link, west_identity)


@pytest.mark.parametrize(
    "command",
    [
        ["ls", "--region", "west"],
        ["ls", "orders", "--region", "west"],
        ["doctor", "--region", "all"],  # every region, each with its own identity: as before
    ],
    ids=["ls", "ls-service", "doctor-all"],
)
def test_the_cli_acting_in_west_presents_west_only_wests_identity(
    world, west_link, west_identity, command, capsys
):
    """(b) ``sentinel ... --region west`` run in east ($SENTINEL_ZK_IDENTITY is east's):
    ``--region`` names where the command acts, not whose password the variable is."""
    code = cli_main([*command, "--regions", document(world, west_link, west_identity)])
    assert code in (0, 1), capsys.readouterr().err  # doctor: 1 for its findings
    assert_west_saw_only_its_own(west_link, west_identity)


def test_the_cli_s_home_region_is_sentinel_region_s_not_the_one_it_acts_in(
    world, west_link, west_identity, monkeypatch, capsys
):
    """(b) The same with one document for every region (no ``local``): ``$SENTINEL_REGION``
    says where the command runs, and so whose password ``$SENTINEL_ZK_IDENTITY`` is."""
    monkeypatch.setenv("SENTINEL_REGION", "east")
    shared = json.loads(document(world, west_link, west_identity))
    del shared["local"]
    code = cli_main(["ls", "--region", "west", "--regions", json.dumps(shared)])
    assert code == 0, capsys.readouterr().err
    assert_west_saw_only_its_own(west_link, west_identity)


def test_an_agent_fed_client_of_west_presents_west_only_wests_identity(
    world,
    west_link,
    west_identity,
    socket_path,  # noqa: F811
):
    """(c) A process of east reads west through the host agent (``agent_region="west"``):
    its hello carries the identity the agent then opens a session to west with (for its
    ``/clients`` entry there), and the agent's own session to west is the agent's. Neither
    may be east's."""
    home = Sentinel(
        world.east.connect_string,
        "host-agent",
        NAMESPACE,
        announce=False,
        agent=False,
        regions=False,
        prometheus_registry=None,
    ).start()
    servers = RegionServers(
        regions(world, west_link, west_identity), client_id="host-agent", connect_timeout=5.0
    )
    agent = AgentServer(home, socket_path, regions=servers, heartbeat=0.5).start()
    try:
        # The process's configuration names west's identity where west has one (it reads
        # the same document as the agent); east's password is its default.
        process_regions = regions(world, west_link, west_identity) if west_identity else False
        with Sentinel(
            world.east.connect_string,
            "east-app-1",
            NAMESPACE,
            agent=socket_path,
            agent_region="west",
            regions=process_regions,
            prometheus_registry=None,
            connect_timeout=5.0,
        ) as process:
            assert process.get_service("orders").host == "10.0.2.1"
            # Its /clients entry in west is kept by the agent, on a session of the identity
            # its hello gave: once written, that session has said who it is to west.
            west = KazooClient(hosts=f"{world.west.connect_string}{NAMESPACE}")
            west.start(timeout=10)
            try:
                entry = client_path("orders", "east-app-1")
                assert wait_until(lambda: west.exists(entry) is not None, 10)
            finally:
                west.stop()
                west.close()
    finally:
        agent.stop()
        home.close()
    assert_west_saw_only_its_own(west_link, west_identity)
