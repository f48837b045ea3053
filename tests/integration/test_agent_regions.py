"""The host agent's sessions to other regions, on three real ensembles (issue 42, item 6).

``home`` is the agent's region and its processes'; ``b`` (reached through a relay, to cut it)
and ``c`` are the agent's other regions. ``orders`` has no instance at home and one in b and
in c; its spec fails over to b. Processes in agent mode open no session anywhere: the agent
holds one per region, opened when the first process needs it. Sessions are counted with the
servers' own ``cons`` (each client connection a server holds, with its session id).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from sentinel import HealthCheck, Sentinel
from sentinel.agent.regions import RegionServers
from sentinel.agent.server import AgentServer
from sentinel.agent.xds import XdsServer
from sentinel.agent.xds_bootstrap import bootstrap_json
from sentinel.agentlink import protocol
from sentinel.agentlink.link import AgentLink
from sentinel.auth.config import AuthConfig
from sentinel.auth.keys import ClientKeyring
from sentinel.cache.config import CacheConfig
from sentinel.cli import main as cli_main
from sentinel.errors import (
    AgentUnavailable,
    ClientKeyNotFound,
    NoInstanceAvailable,
    RegionNotServed,
    ValidationError,
    ZooKeeperUnavailable,
)
from sentinel.regions import Failover, Region, Regions
from sentinel.telemetry import AGENT_DROPPED, AGENT_REGION_PROCESSES
from sentinel.testing.grpcserver import LoopbackGRPCServer
from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper, four_letter_word
from tests.integration.daemons import Daemon
from tests.integration.peers import run_as_nobody
from tests.integration.test_agent_xds import BOOTSTRAP_ENV, calls
from tests.integration.test_health import readiness_server

pytestmark = pytest.mark.integration

NAMESPACE = "/agent-regions"
HOSTS = {"home": "10.0.0.1", "b": "10.0.2.1", "c": "10.0.3.1"}
RULE = Failover(regions=("b",), return_after=0.5)


@dataclass
class World:
    home: LocalZooKeeper
    b: LocalZooKeeper
    c: LocalZooKeeper
    link_b: TcpProxy
    publishers: dict[str, Sentinel]

    def agent_regions(self, **extra: str) -> Regions:
        """The agent's configuration: its region and the two others (and ``extra``)."""
        return Regions(
            "home",
            [
                Region("home", self.home.connect_string, namespace=NAMESPACE),
                Region("b", self.link_b.address, namespace=NAMESPACE),
                Region("c", self.c.connect_string, namespace=NAMESPACE),
                *(Region(name, hosts, namespace=NAMESPACE) for name, hosts in extra.items()),
            ],
        )

    def process_regions(self) -> Regions:
        """A process's configuration: the same regions, where they are (in agent mode the
        process never connects there: the agent does), and d, which the agent does not
        serve (nothing listens at its address)."""
        return Regions(
            "home",
            [
                Region("home", self.home.connect_string, namespace=NAMESPACE),
                Region("b", self.link_b.address, namespace=NAMESPACE),
                Region("c", self.c.connect_string, namespace=NAMESPACE),
                Region("d", "127.0.0.1:9", namespace=NAMESPACE),
            ],
        )


def sessions(zk: LocalZooKeeper) -> set[str]:
    """The session ids of every client connection the server holds now (``cons``), the
    four-letter word's own connection (no session) left out."""
    found = set()
    for member in zk:
        host, port = member.connect_string.split(":")
        for line in four_letter_word(host, int(port), "cons").splitlines():
            match = re.search(r"sid=(0x[0-9a-f]+)", line)
            if match:
                found.add(match.group(1))
    return found


def sid(client: Sentinel) -> str:
    return hex(client.session_id)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with LocalZooKeeper() as home, LocalZooKeeper() as b, LocalZooKeeper() as c:
        link_b = TcpProxy("127.0.0.1", int(b.connect_string.split(":")[1]))
        publishers = {}
        for name, zk in (("home", home), ("b", b), ("c", c)):
            publisher = Sentinel(
                zk.connect_string,
                f"publisher-{name}",
                NAMESPACE,
                prometheus_registry=None,
                regions=False,
                agent=False,
                session_timeout=30.0,
            ).start()
            publisher.ensure_service("orders", failover=RULE)
            if name != "home":
                publisher.register("orders", "p1", HOSTS[name], 8080, label=name)
            publishers[name] = publisher
        yield World(home, b, c, link_b, publishers)
        for publisher in publishers.values():
            publisher.close()
        link_b.close()


@pytest.fixture
def socket_path() -> str:
    directory = tempfile.mkdtemp(prefix="agent-")
    os.chmod(directory, 0o755)  # another user's process may reach the socket (its peer check)
    return os.path.join(directory, "agent.sock")


def start_agent(
    world: World, path: str, regions: Regions | None = None, **options: object
) -> AgentServer:
    """An agent in this process, configured as ``sentinel agent --regions`` configures one."""
    regions = regions or world.agent_regions()

    home = Sentinel(
        world.home.connect_string,
        "host-agent",
        NAMESPACE,
        announce=False,
        agent=False,
        regions=False,
        prometheus_registry=None,
        cache=CacheConfig(),
    ).start()
    servers = RegionServers(
        regions, client_id="host-agent", session_timeout=4.0, connect_timeout=5.0
    )
    options = {"send_timeout": 2.0, "heartbeat": 0.5} | options
    server = AgentServer(home, path, regions=servers, **options)
    return server.start()


def stop_agent(server: AgentServer) -> None:
    server.stop()
    server.sentinel.close()


@pytest.fixture
def agent(world, socket_path) -> Iterator[AgentServer]:
    server = start_agent(world, socket_path)
    yield server
    stop_agent(server)


def process(world: World, path: str, name: str, **options: object) -> Sentinel:
    return Sentinel(
        world.home.connect_string,
        name,
        NAMESPACE,
        agent=path,
        regions=world.process_regions(),
        prometheus_registry=None,
        connect_timeout=5.0,
        **options,
    ).start()


def region_server(agent: AgentServer, name: str) -> AgentServer | None:
    return agent._regions._servers.get(name)  # the test looks inside: which sessions exist


def status(path: str) -> dict:
    link = AgentLink(path, NAMESPACE, f"status-{time.monotonic_ns()}", None, timeout=5.0)
    link.start()
    try:
        link.wait_connected(5.0)
        return link.request({"op": "status"})
    finally:
        link.close()


def test_processes_fail_over_through_one_agent_session_per_region_opened_lazily(
    world, agent, socket_path, capsys
):
    """Two processes failing over to b: the agent has exactly one session on b's server and
    none on c's until something needs c; neither process has a session on b (nor anywhere);
    a lookup failing over gets b's instance; b's instance gone and back reaches both through
    the agent."""
    before_b, before_c = sessions(world.b), sessions(world.c)
    assert {r["region"]: r["state"] for r in status(socket_path)["regions"]} == {
        "b": "unopened",
        "c": "unopened",
    }
    first = process(world, socket_path, "app-1")
    second = process(world, socket_path, "app-2")
    try:
        for app in (first, second):
            assert app.get_service("orders").host == HOSTS["b"]
            assert app.explain("orders").region == "b"
        b_server = region_server(agent, "b")
        assert b_server is not None and region_server(agent, "c") is None
        agent_on_b = sid(b_server.sentinel)
        assert wait_until(lambda: sessions(world.b) == before_b | {agent_on_b}, 10)
        assert sessions(world.c) == before_c  # nothing needed c
        for app in (first, second):  # no session of their own anywhere
            assert app.session_id is None
            remote = app.regions_router.remotes.by_name["b"].client
            assert remote.session_id is None and remote.session.agent_link is not None
        assert b_server.processes == 2
        assert AGENT_REGION_PROCESSES.labels("b")._value.get() == 2
        listed = {r["region"]: r for r in status(socket_path)["regions"]}
        assert listed["b"]["state"] == "connected" and listed["b"]["processes"] == 2
        assert listed["c"]["state"] == "unopened"
        command = ["agent", "status", "--socket", socket_path, "--namespace", NAMESPACE]
        capsys.readouterr()
        assert cli_main([*command, "--json"]) == 0
        printed = {r["region"]: r for r in json.loads(capsys.readouterr().out)["regions"]}
        assert printed["b"]["processes"] == 2 and printed["c"]["state"] == "unopened"
        assert cli_main(command) == 0
        rows = capsys.readouterr().out.splitlines()
        assert any(row.split()[:2] == ["b", "connected"] and row.split()[-1] == "2" for row in rows)
        assert any(row.split() == ["c", "unopened", "-", "0"] for row in rows)

        # b's instance gone: both processes hear it through the agent; back: both again.
        registration = world.publishers["b"].registrations[0]
        world.publishers["b"].deregister(registration)
        for app in (first, second):
            assert wait_until(lambda app=app: _fails(app), 10)
        world.publishers["b"].register("orders", "p1", HOSTS["b"], 8080, label="b")
        for app in (first, second):
            assert wait_until(lambda app=app: not _fails(app), 10)
            assert app.get_service("orders").host == HOSTS["b"]
        assert sessions(world.b) == before_b | {agent_on_b}  # still one, the agent's
    finally:
        first.close()
        second.close()


def test_a_process_reading_another_region_through_the_agent_has_its_keys_there(
    world, agent, socket_path
):
    """A process with a key ring failing over to b: the agent's welcome says its public keys
    are not in b, so its client of b publishes them there on a session of its own, closed at
    once; b's manager can then seal a credential to it, which its failed-over lookups carry.
    Before, the keys never reached b and the credential could not be published at all."""
    with process(
        world, socket_path, "keyed-1", auth=AuthConfig(keys=ClientKeyring.generate())
    ) as app:
        assert app.get_service("orders").host == HOSTS["b"]
        remote = app.regions_router.remotes.by_name["b"].client
        assert remote.session_id is None  # the publishing session is closed
        world.publishers["b"].credentials.publish(
            "orders", "keyed-1", {"user": "b-user", "password": "not-secret"}
        )
        assert wait_until(lambda: app.get_service("orders").auth is not None, timeout=15)
        assert app.get_service("orders").auth["user"] == "b-user"


def test_a_process_that_cannot_publish_its_keys_in_the_region_is_told_why(
    world, agent, socket_path, caplog
):
    """The process's regions say b is where nothing listens (only the agent reaches b): its
    lookups still fail over to b through the agent, and one warning says that its keys are
    not in b, why (connection refused), and what follows."""
    with socket.socket() as refusing:
        refusing.bind(("127.0.0.1", 0))
        unreachable = f"127.0.0.1:{refusing.getsockname()[1]}"
        regions = Regions(
            "home",
            [
                Region("home", world.home.connect_string, namespace=NAMESPACE),
                Region("b", unreachable, namespace=NAMESPACE),
            ],
        )
        keyed = AuthConfig(keys=ClientKeyring.generate())
        with (
            caplog.at_level(logging.WARNING, logger="sentinel.session"),
            Sentinel(
                world.home.connect_string,
                "keyed-2",
                NAMESPACE,
                agent=socket_path,
                regions=regions,
                prometheus_registry=None,
                connect_timeout=5.0,
                auth=keyed,
            ) as app,
        ):
            assert app.get_service("orders").host == HOSTS["b"]
    (warning,) = [r.getMessage() for r in caplog.records if "public keys" in r.getMessage()]
    assert warning.startswith(
        "client 'keyed-2' has no public keys in region 'b' and could not publish them "
        f"(no ZooKeeper server at {unreachable} can be reached: connection refused"
    )
    assert "credentials there cannot be sealed to it until they are published" in warning
    with pytest.raises(ClientKeyNotFound):
        world.publishers["b"].credentials.publish("orders", "keyed-2", {"user": "u"})


def _fails(app: Sentinel) -> bool:
    try:
        app.get_service("orders")
    except NoInstanceAvailable:
        return True
    return False


def test_round_trip_time_is_measured_through_the_agent(world, agent, socket_path):
    """ "nearest" in agent mode: the process times a ping the agent answers once its session
    to the region has answered, so b (its relay delaying each chunk) ranks after c."""
    world.link_b.delay = 0.03
    try:
        with process(world, socket_path, "app-rtt") as app:
            router = app.regions_router
            router.remotes.open_all(["b", "c"])
            b, c = router.remotes.by_name["b"], router.remotes.by_name["c"]
            assert c.rtt < 0.03 <= b.rtt  # a round trip through the relay is two chunks
            assert router.remotes.nearest(1) == ["c"]
            assert sessions(world.c) >= {sid(region_server(agent, "c").sentinel)}
    finally:
        world.link_b.delay = 0.0


def test_a_region_the_agent_does_not_serve_is_a_typed_answer_and_down(
    world, agent, socket_path, caplog
):
    """A process naming d (not in the agent's configuration): start() of a client of d
    raises RegionNotServed at once (not after its connect timeout); a process whose rule
    lists d then b skips d (down, one warning saying why) and gets b's instance; nothing is
    opened for d."""
    started = time.monotonic()
    with pytest.raises(RegionNotServed, match="serves no region 'd'"):
        Sentinel(
            world.home.connect_string,
            "app-d",
            NAMESPACE,
            agent=socket_path,
            agent_region="d",
            prometheus_registry=None,
            connect_timeout=5.0,
        ).start()
    assert time.monotonic() - started < 2.0
    caplog.set_level(logging.INFO)
    with process(world, socket_path, "app-d-b") as app:
        rule = Failover(regions=("d", "b"))
        assert app.get_service("orders", failover=rule).host == HOSTS["b"]
        assert wait_until(lambda: app.regions_router.remotes.by_name["d"].down, 10)
        for _ in range(3):
            assert app.get_service("orders", failover=rule).host == HOSTS["b"]
    warnings = [  # the process's, not the agent's own (it runs in this test's process)
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING
        and "'d'" in r.getMessage()
        and not r.name.startswith("sentinel.agent.server")
    ]
    assert len(warnings) == 1 and "serves no region 'd'" in warnings[0].getMessage()
    assert region_server(agent, "d") is None


def test_a_client_of_another_region_through_the_agent_writes_nothing(world, agent, socket_path):
    """Registrations are regional: a client reading b through the agent refuses a write
    (ValidationError), and opens no session of its own to b to make it."""
    before = sessions(world.b)
    with Sentinel(
        world.home.connect_string,
        "app-write",
        NAMESPACE,
        agent=socket_path,
        agent_region="b",
        prometheus_registry=None,
        connect_timeout=5.0,
    ) as b:
        assert b.get_service("orders").host == HOSTS["b"]
        with pytest.raises(ValidationError, match="writes nothing there"):
            b.register("orders", "p1", "10.9.9.9", 8080)
        assert b.session_id is None
        assert sessions(world.b) == before | {sid(region_server(agent, "b").sentinel)}


def _raw_hello(path: str, region: object) -> dict | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(path)
    try:
        protocol.send(
            sock,
            {
                "op": "hello",
                "version": 2,
                "namespace": NAMESPACE,
                "client": f"raw-{time.monotonic_ns()}",
                "auth_client": None,
                "region": region,
            },
        )
        return protocol.receive(sock, protocol.MAX_REPLY_BYTES, protocol.REPLIES)
    except OSError:
        return None
    finally:
        sock.close()


def test_five_thousand_region_names_and_garbage_open_nothing(world, agent, socket_path):
    """A process naming 5,000 regions the agent does not have, and garbage (a name that is
    not one, a number, 60 KB): each is refused (a typed answer, or the connection dropped
    for garbage), nothing is opened anywhere, and a real process is served meanwhile."""
    before = {name: sessions(zk) for name, zk in (("b", world.b), ("c", world.c))}
    refused = AGENT_DROPPED.labels("region")._value.get()
    for index in range(5000):
        answer = _raw_hello(socket_path, f"r{index}")
        assert answer is not None and answer["op"] == "error"
        assert answer["type"] == "RegionNotServed"
    assert AGENT_DROPPED.labels("region")._value.get() - refused == 5000
    for garbage in ("../etc", 42, "x" * 60_000, None):
        answer = _raw_hello(socket_path, garbage)
        assert answer is None or answer["op"] != "welcome" or garbage is None
    assert agent._regions._servers == {}
    assert {name: sessions(zk) for name, zk in (("b", world.b), ("c", world.c))} == before
    with process(world, socket_path, "app-after") as app:
        assert app.get_service("orders").host == HOSTS["b"]


def test_another_users_hello_naming_a_region_is_refused_at_the_socket(world, socket_path):
    """The peer check comes before the hello: a process of a user the agent does not allow
    naming region b is refused and opens nothing; allowed, the same hello is handed to b."""
    probe = (
        "import json, socket, struct, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(10)\n"
        "s.connect(sys.argv[1])\n"
        "body = json.dumps({'op': 'hello', 'version': 2, 'namespace': sys.argv[2],\n"
        "                   'client': 'nobody', 'auth_client': None, 'region': 'b'}).encode()\n"
        "try:\n"
        "    s.sendall(struct.pack('>I', len(body)) + body)\n"
        "    print('answered' if s.recv(4) else 'closed')\n"
        "except OSError:  # reset, or a broken pipe: closed either way\n"
        "    print('closed')\n"
    )

    def as_nobody() -> str:
        return run_as_nobody(probe, socket_path, NAMESPACE)

    server = start_agent(world, socket_path, allowed_uids=[65533])
    try:
        refused = AGENT_DROPPED.labels("refused")._value.get()
        assert as_nobody() == "closed"
        assert AGENT_DROPPED.labels("refused")._value.get() == refused + 1
        assert region_server(server, "b") is None
    finally:
        stop_agent(server)
    server = start_agent(world, socket_path, allowed_uids=[65534])
    try:
        assert as_nobody() == "answered"
        assert region_server(server, "b") is not None
    finally:
        stop_agent(server)


def test_a_region_that_does_not_answer_holds_up_nothing(world, socket_path):
    """Region x's ensemble does not answer (nothing listens): a process needing it is served
    a welcome at once and sees x down; the agent's loop and its other regions go on (a
    process failing over to b is answered meanwhile, a new process served within a second)."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    port = dead.getsockname()[1]
    server = start_agent(world, socket_path, world.agent_regions(x=f"127.0.0.1:{port}"))
    try:
        started = time.monotonic()
        x = Sentinel(
            world.home.connect_string,
            "app-x",
            NAMESPACE,
            agent=socket_path,
            agent_region="x",
            prometheus_registry=None,
            connect_timeout=5.0,
        ).start()
        try:
            assert time.monotonic() - started < 2.0
            assert x.connection_state == "suspended"
            with pytest.raises(ZooKeeperUnavailable):
                x.get_service("orders")
            started = time.monotonic()
            with process(world, socket_path, "app-b") as app:
                assert app.get_service("orders").host == HOSTS["b"]
            assert time.monotonic() - started < 3.0
            assert x.connection_state == "suspended"
        finally:
            x.close()
        listed = {r["region"]: r["state"] for r in status(socket_path)["regions"]}
        assert listed["x"] != "connected" and listed["b"] == "connected"
    finally:
        stop_agent(server)
        dead.close()


def test_a_region_cut_and_healed_reaches_processes_through_the_agent(world, agent, socket_path):
    """b's relay cut: the agent's session there is not connected, and processes see b down
    (serving what they had, marked stale); healed, they see it up and hear what changed."""
    with process(world, socket_path, "app-cut") as app:
        assert app.get_service("orders").host == HOSTS["b"]
        remote = app.regions_router.remotes.by_name["b"]
        world.link_b.cut()
        try:
            assert wait_until(lambda: remote.down, 15)
            assert app.get_service("orders").host == HOSTS["b"]  # what it had
            added = world.publishers["b"].register("orders", "p1", "10.0.2.2", 8080, label="b2")
        finally:
            world.link_b.restore()
        try:
            assert wait_until(lambda: not remote.down, 30)
            assert wait_until(lambda: len(app.eligible_instances("orders")) == 2, 15)
        finally:
            world.publishers["b"].deregister(added)


def test_an_agent_restarted_with_regions_serves_its_processes_again(world, socket_path):
    """``sentinel agent --regions`` killed and started again: a process's lookups through b
    resume, and b holds exactly one session of an agent (the new one's: the killed agent's
    expired) and none of the process."""
    document = json.dumps(
        {
            "local": "home",
            "regions": {
                "home": {"hosts": world.home.connect_string, "namespace": NAMESPACE},
                "b": {"hosts": world.link_b.address, "namespace": NAMESPACE},
                "c": {"hosts": world.c.connect_string, "namespace": NAMESPACE},
            },
        }
    )
    arguments = ("agent", "--socket", socket_path, "--regions", document, "--heartbeat", "0.5")
    before = sessions(world.b)
    daemon = Daemon(world.home, NAMESPACE, *arguments)
    try:
        assert wait_until(lambda: daemon.saw("serving"), 20)
        with process(world, socket_path, "app-restart") as app:
            assert app.get_service("orders").host == HOSTS["b"]
            assert wait_until(lambda: len(sessions(world.b) - before) == 1, 10)
            daemon.stop()
            remote = app.regions_router.remotes.by_name["b"]
            assert wait_until(lambda: remote.down, 10)
            daemon = Daemon(world.home, NAMESPACE, *arguments)
            assert wait_until(lambda: daemon.saw("serving"), 20)
            assert wait_until(lambda: not remote.down, 20)
            assert app.get_service("orders").host == HOSTS["b"]
            # The killed agent's session expires (--session-timeout 2): one left, the new one's.
            assert wait_until(lambda: len(sessions(world.b) - before) == 1, 20)
            assert app.session_id is None
    finally:
        daemon.stop()


def test_an_agent_before_regions_is_refused_not_taken_for_the_region(socket_path):
    """An agent that ignores the hello's region (one from before regions) would serve its
    own region's registry under the other's name: the link refuses its welcome, which does
    not name the region, and sends it nothing more."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(8)
    listener.settimeout(0.2)
    hellos: list[dict] = []
    stopped = threading.Event()

    def old_agent() -> None:
        while not stopped.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            with sock:
                sock.settimeout(5)
                hellos.append(protocol.receive(sock, protocol.MAX_REQUEST_BYTES, protocol.REQUESTS))
                welcome = {"op": "welcome", "version": 2, "state": "connected", "since": None}
                protocol.send(sock, {**welcome, "heartbeat": 5.0, "id": None})
                assert protocol.receive(sock, protocol.MAX_REQUEST_BYTES, protocol.REQUESTS) is None

    serving = threading.Thread(target=old_agent, daemon=True)
    serving.start()
    link = AgentLink(socket_path, NAMESPACE, "app-old", None, region="b", timeout=2.0)
    try:
        link.start()
        with pytest.raises(AgentUnavailable, match="does not serve other regions"):
            link.wait_connected(2.0)
        assert hellos and hellos[0]["region"] == "b"
        assert not link.connected
    finally:
        link.close()
        stopped.set()
        serving.join(5)
        listener.close()


# -- the agent's xDS server fails over as the library does: a grpcio client of
# xds:///<service> is served the region a lookup of the library is.


@pytest.fixture
def xds(agent, monkeypatch) -> Iterator[XdsServer]:
    """The agent's xDS server, given the agent's session only (as ``sentinel agent --xds``),
    and this process's gRPC bootstrap naming it (read when its first xds:/// channel opens)."""
    directory = tempfile.mkdtemp(prefix="xds-")
    server = XdsServer(agent.sentinel, f"unix:{directory}/xds.sock", send_timeout=2.0).start()
    monkeypatch.setenv(BOOTSTRAP_ENV, bootstrap_json(server.address, "test-regions"))
    yield server
    server.stop()
    os.rmdir(directory)


def xds_service(world: World, rule: Failover | None) -> str:
    """A new service in home and b, with ``rule`` in both specs."""
    service = f"grpc-{uuid.uuid4().hex[:8]}"
    for name in ("home", "b"):
        world.publishers[name].ensure_service(service, failover=rule)
    return service


def answered(channel: grpc.Channel, metadata=None) -> set[str] | str:
    """Which instances answer 10 calls, or the status of the first that fails."""
    try:
        return set(calls(channel, 10, metadata))
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()}"


def library_client(world: World) -> Sentinel:
    """A process of home with its own sessions (not the agent's): the library's answer."""
    return Sentinel(
        world.home.connect_string,
        "app-library",
        NAMESPACE,
        agent=False,
        regions=world.agent_regions(),
        prometheus_registry=None,
        connect_timeout=5.0,
    ).start()


def test_an_xds_client_fails_over_when_home_is_unready_and_returns_after_the_hold(
    world, agent, xds
):
    """Home's one instance fails its readiness check: a grpcio client's calls through the
    agent reach b's instance, as the library's lookups do; its check passes again: calls stay
    on b for the rule's return_after (the library's hold-down), then come home."""
    hold = 2.0
    service = xds_service(world, Failover(regions=("b",), return_after=hold))
    home, b = world.publishers["home"], world.publishers["b"]
    check = {"interval": 0.1, "timeout": 0.1, "failures_before_down": 2, "successes_before_up": 1}
    with (
        readiness_server() as ready,
        LoopbackGRPCServer("home-1") as home_1,
        LoopbackGRPCServer("b-1") as b_1,
        library_client(world) as library,
    ):
        url = f"http://127.0.0.1:{ready.server_port}/ready"
        mine = [
            home.register(
                service,
                "p1",
                "127.0.0.1",
                home_1.port,
                label="home-1",
                health=HealthCheck.http(url, **check),
            ),
            b.register(service, "p1", "127.0.0.1", b_1.port, label="b-1"),
        ]
        home.prefetch(service)  # the registry's statuses, as the publisher's cache hears them
        try:
            with grpc.insecure_channel(f"xds:///{service}") as channel:
                assert wait_until(lambda: answered(channel) == {"home-1"}, 10), answered(channel)
                assert library.get_service(service).label == "home-1"

                ready.code = 503
                assert wait_until(lambda: answered(channel) == {"b-1"}, 10), answered(channel)
                assert library.get_service(service).label == "b-1"
                assert library.explain(service).region == "b"
                assert [e.status for e in home.cached_instances(service)] == ["down"]

                ready.code = 200
                assert wait_until(
                    lambda: [e.status for e in home.cached_instances(service)] == ["up"], 10
                )
                up_at = time.monotonic()
                # Home is eligible again, but held back: b serves until the hold ends.
                assert answered(channel) == {"b-1"}
                assert wait_until(lambda: answered(channel) == {"home-1"}, 10), answered(channel)
                returned = time.monotonic() - up_at
                print(f"home again {returned:.2f} s after its instance was up (hold {hold} s)")
                assert returned >= hold - 0.5
                assert wait_until(lambda: library.get_service(service).label == "home-1", 10)
        finally:
            home.deregister(mine[0])
            b.deregister(mine[1])


def test_an_xds_client_of_a_service_with_no_instance_home_is_served_by_b(world, agent, xds):
    """No instance of the service is registered at home, from its first load on: the first
    assignment a grpcio client is sent already holds b's instance; one registered at home
    draws the calls back after return_after, and deregistered sends them to b again."""
    service = xds_service(world, Failover(regions=("b",), return_after=0.5))
    home, b = world.publishers["home"], world.publishers["b"]
    with LoopbackGRPCServer("home-1") as home_1, LoopbackGRPCServer("b-1") as b_1:
        at_b = b.register(service, "p1", "127.0.0.1", b_1.port, label="b-1")
        try:
            with grpc.insecure_channel(f"xds:///{service}") as channel:
                assert calls(channel, 5) == {"b-1": 5}  # no UNAVAILABLE first
                at_home = home.register(service, "p1", "127.0.0.1", home_1.port, label="home-1")
                assert wait_until(lambda: answered(channel) == {"home-1"}, 10), answered(channel)
                home.deregister(at_home)
                assert wait_until(lambda: answered(channel) == {"b-1"}, 10), answered(channel)
        finally:
            b.deregister(at_b)


def test_an_xds_client_of_a_service_without_a_failover_rule_stays_home(world, agent, xds):
    """The safe default: a service whose spec names no other region is served from home
    only; its home instance gone, calls fail UNAVAILABLE, though b has an instance."""
    service = xds_service(world, None)
    home, b = world.publishers["home"], world.publishers["b"]
    with LoopbackGRPCServer("home-1") as home_1, LoopbackGRPCServer("b-1") as b_1:
        at_b = b.register(service, "p1", "127.0.0.1", b_1.port, label="b-1")
        at_home = home.register(service, "p1", "127.0.0.1", home_1.port, label="home-1")
        try:
            with grpc.insecure_channel(f"xds:///{service}") as channel:
                assert wait_until(lambda: answered(channel) == {"home-1"}, 10), answered(channel)
                home.deregister(at_home)
                assert wait_until(lambda: str(answered(channel)).startswith("UNAVAILABLE"), 10), (
                    answered(channel)
                )
            assert b_1.calls == 0
        finally:
            b.deregister(at_b)
