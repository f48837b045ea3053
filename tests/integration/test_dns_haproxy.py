"""A real HAProxy (Debian's 2.6) in front of Sentinel services, configured only with
``sentinel agent --dns`` (issue 55's must-show tests): SRV weights, drains, new instances,
failover to another region and back, a service emptied, and the agent restarted; and Debian's
nginx (1.22), which reads A records only, following a drain.

One agent (a real ``sentinel agent --dns`` process, with two regions, ``home`` and ``b``: two
namespaces of the session's ZooKeeper) and one HAProxy serve the module: each
test has a service of its own, and HAProxy a frontend and a backend for each (the
configuration docs/dns.md shows, rendered for the module's ports:
``tests/peers/haproxy.py``). The instances are HTTP backends in one process of their own,
``a`` and ``b`` on 127.0.0.1 (different ports), ``c`` on 127.0.0.2, ``d`` on 127.0.0.3
(region b's), and nginx's ``e`` and ``f`` on one port of 127.0.0.1 and 127.0.0.2; each answers
with its name, so a test tallies which one each request reached.
HAProxy's own state is read on its runtime API (``show servers state``): bounded polls on it,
no sleeps.
"""

from __future__ import annotations

import json
import random
import re
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sentinel import Sentinel
from sentinel.regions import Failover
from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from tests.integration.daemons import Daemon
from tests.peers.haproxy import (
    ADDITION_BOUND,
    EMPTIED_BOUND,
    REMOVAL_BOUND,
    HAProxy,
    documented_config,
    haproxy_binary,
)
from tests.peers.http_backends import Client, HttpBackends
from tests.peers.nginx import (
    DOCUMENTED_LISTEN,
    VALID,
    Nginx,
    config,
    documented_upstream_config,
    nginx_binary,
)
from tests.peers.nginx import documented_config as documented_nginx_config

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[2] / "docs"
HOSTS = {"a": "127.0.0.1", "b": "127.0.0.1", "c": "127.0.0.2", "d": "127.0.0.3"}
# nginx's: one port on two IPs (A records carry no port: nginx's URL names it).
NGINX_HOSTS = {"e": "127.0.0.1", "f": "127.0.0.2"}
SERVICES = ("weights", "drained", "joins", "churn", "failover", "emptied", "restarted")
NGINX_SERVICE = "plain"
# The failover service's rule: region b's instances when home has none; home's again half a
# second after they return (the hold-down a lookup applies too).
RULE = Failover(regions=("b",), return_after=0.5)
# The agent's own share of a bound (ZooKeeper's watch, its cache) and the machine's: a
# second, as issue 55 states the drain's bound (`timeout resolve` + `hold obsolete` + 1 s).
SLACK = 1.0
# Seconds each chunk between the restarted agent and ZooKeeper is held: the loads of the
# services HAProxy asks for take some fifty chunks one after another (2.5 s at 0.05 s, the
# least of six runs), so seconds, past HAProxy's `resolve_retries` x `timeout retry`; its
# session (2 s) lives through them.
SLOW_LINK = 0.06


def unclaimed_ports(count: int) -> list[int]:
    """``count`` free loopback ports below the kernel's range for outgoing connections.

    The agent, nginx and HAProxy bind theirs seconds after they are chosen (and the agent its
    own again after its restart): a port of that range (what ``free_ports`` gets) may be
    taken meanwhile by any connection another test opens (the likeliest cause of the one time
    HAProxy exited as it started here). Below it, only a program that names the port binds it.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    chosen: list[int] = []
    for port in random.sample(range(10000, low), low - 10000):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
        if len(chosen) == count:
            return chosen
    raise RuntimeError(f"not {count} free ports between 10000 and {low}")


@dataclass(frozen=True)
class Ensemble:
    """Where the agent's ZooKeeper is, as :class:`Daemon` reads it: here, through a link."""

    connect_string: str


@dataclass
class World:
    namespace: str
    publishers: dict[str, Sentinel]  # by region
    agent_arguments: tuple[str, ...]
    link: TcpProxy  # the agent's link to home's ZooKeeper (slowed in the restart's test)
    backends: HttpBackends
    dns: str  # the agent's DNS, host:port
    frontends: dict[str, int]  # service -> HAProxy's port for it
    nginx_port: int
    agent: Daemon | None = None
    haproxy: HAProxy | None = None

    def register(self, service: str, name: str, region: str = "home", weight: float = 1):
        """Register backend ``name`` as an instance of ``service`` in ``region``."""
        return self.publishers[region].register(
            service, "default", *self.address(name), label=name, weight=weight
        )

    def address(self, name: str) -> tuple[str, int]:
        return ({**HOSTS, **NGINX_HOSTS}[name], self.backends.ports[name])

    def rotation(self, service: str) -> set[tuple[str, int]]:
        return set(self.haproxy.rotation(service))

    def client(self, service: str) -> Client:
        return Client(self.frontends[service])

    def start_agent(self) -> Daemon:
        self.agent = Daemon(Ensemble(self.link.address), self.namespace, *self.agent_arguments)
        # Up to 12 s measured at a load average of 33 (a Python process, two regions' sessions).
        if wait_until(lambda: self.agent.saw("serving"), 30) is None:
            raise AssertionError(f"the agent is not serving: {self.agent.stop()}")
        return self.agent


@pytest.fixture(scope="module")
def world(zookeeper: LocalZooKeeper) -> Iterator[World]:
    if haproxy_binary() is None:
        pytest.skip("haproxy is not installed (./run.sh test installs Debian's package)")
    namespace = f"/test-{uuid.uuid4().hex[:12]}"
    started = time.monotonic()
    host, port = zookeeper.connect_string.split(":")
    link = TcpProxy(host, int(port))
    dns_port, shared_port, nginx_port, *ports = unclaimed_ports(3 + len(SERVICES))
    addresses = {**HOSTS, **{name: f"{ip}:{shared_port}" for name, ip in NGINX_HOSTS.items()}}
    # Region b is a registry of its own on the same server (a namespace of its own): what the
    # agent answers depends on which region's registry has instances, not on where it lives,
    # and a ZooKeeper server more would cost the suite seconds.
    namespaces = {"home": namespace, "b": f"{namespace}-b"}
    with HttpBackends(addresses) as backends:
        publishers = {}
        for name in ("home", "b"):
            publishers[name] = Sentinel(
                zookeeper.connect_string,
                f"publisher-{name}",
                namespaces[name],
                prometheus_registry=None,
                regions=False,
                agent=False,
            ).start()
            publishers[name].ensure_namespace()
            publishers[name].ensure_service("failover", failover=RULE)
        # The services exist before HAProxy asks for them, as a deployed service's spec does:
        # the agent answers them (empty until registered) rather than NXDOMAIN, which it
        # checks again only every few seconds (sentinel.agent.loads.RETRY_SECONDS).
        for service in (*SERVICES, NGINX_SERVICE):
            if service != "failover":
                publishers["home"].ensure_service(service)
        regions = {
            "local": "home",
            "regions": {
                "home": {"hosts": link.address, "namespace": namespaces["home"]},
                "b": {"hosts": zookeeper.connect_string, "namespace": namespaces["b"]},
            },
        }
        directory = tempfile.mkdtemp(prefix="dns-haproxy-")
        arguments = (
            "agent",
            "--socket",
            f"{directory}/agent.sock",
            "--dns",
            f"127.0.0.1:{dns_port}",
            "--regions",
            json.dumps(regions),
        )
        frontends = dict(zip(SERVICES, ports, strict=True))
        dns = f"127.0.0.1:{dns_port}"
        world = World(namespace, publishers, arguments, link, backends, dns, frontends, nginx_port)
        try:
            world.start_agent()
            with HAProxy(dns, world.frontends) as haproxy:
                world.haproxy = haproxy
                print(f"agent and HAProxy started in {time.monotonic() - started:.2f} s")
                yield world
        finally:
            if world.agent is not None:
                world.agent.stop()
            link.close()
            for publisher in publishers.values():
                publisher.close()


def test_requests_split_by_weight_over_three_instances_two_on_one_ip(world):
    """Weights 1:2:5 on a and b (one IP, two ports) and c: the agent scales SRV weights so
    the heaviest is 65535 and HAProxy (which divides them by 256) keeps the ratio. HAProxy's
    weighted round robin is deterministic: over 800 requests each instance's share is within
    2 points of its weight's (12.5 %, 25 %, 62.5 %); an equal split misses by 21 points."""
    weights = {"a": 1, "b": 2, "c": 5}
    for name, weight in weights.items():
        world.register("weights", name, weight=weight)
    wanted = {world.address(name) for name in weights}
    assert wait_until(lambda: world.rotation("weights") == wanted, 10), world.rotation("weights")
    # 65535/5, 2 x 65535/5 and 65535, over 256 and rounded up (docs/dns.md)
    assert sorted(world.haproxy.rotation("weights").values()) == [52, 103, 256]
    client = world.client("weights")
    answered = client.send(800)
    print(f"800 requests by weights {weights}: {dict(answered)}")
    assert client.failed == 0
    total = sum(weights.values())
    for name, weight in weights.items():
        assert abs(answered[name] / 800 - weight / total) < 0.02, answered


def test_a_drained_instance_leaves_rotation_within_the_bound_and_no_request_fails(world):
    """``timeout resolve`` + ``hold obsolete`` + 1 s after the drain, HAProxy no longer
    holds a (b, on the same IP, stays); requests sent all along never fail, and none reaches a
    once it is out."""
    registration = world.register("drained", "a")
    world.register("drained", "b")
    both = {world.address("a"), world.address("b")}
    assert wait_until(lambda: world.rotation("drained") == both, 10), world.rotation("drained")
    client = world.client("drained")
    assert set(client.send(20)) == {"a", "b"}
    world.publishers["home"].update_registration(registration, status="draining")
    drained_at = time.monotonic()
    while world.address("a") in world.rotation("drained"):
        client.send(5)
        assert time.monotonic() - drained_at < REMOVAL_BOUND + SLACK, "a still in rotation"
    print(f"drained: out of HAProxy's rotation after {time.monotonic() - drained_at:.3f} s")
    assert client.send(100) == {"b": 100}
    assert client.failed == 0


def test_a_new_instance_enters_rotation(world):
    world.register("joins", "a")
    assert wait_until(lambda: world.rotation("joins") == {world.address("a")}, 10)
    client = world.client("joins")
    assert client.send(10) == {"a": 10}
    world.register("joins", "c")
    registered_at = time.monotonic()
    while "c" not in client.send(4):
        assert time.monotonic() - registered_at < ADDITION_BOUND + SLACK, "c not reached"
    print(f"new instance: first request after {time.monotonic() - registered_at:.3f} s")
    assert set(client.send(20)) == {"a", "c"}
    assert client.failed == 0


def test_after_churn_haproxy_holds_exactly_the_instances_left_all_up(world):
    """haproxy/haproxy#971: servers left DOWN or stale after records came and went. Instances
    registered, drained, deregistered and back in quick succession (faster than HAProxy asks):
    once the last change is a removal bound old, HAProxy's slots hold exactly the instances
    left, each in rotation, no slot with an address out of it, and requests reach them all."""
    registrations = {name: world.register("churn", name) for name in "abcd"}
    home = world.publishers["home"]
    home.deregister(registrations["b"])
    home.update_registration(registrations["c"], status="draining")
    registrations["b"] = world.register("churn", "b")
    home.deregister(registrations["d"])
    registrations["c"] = home.update_registration(registrations["c"], status="up")
    home.deregister(registrations["a"])
    left = {world.address(name) for name in "bc"}
    settled = wait_until(lambda: world.rotation("churn") == left, REMOVAL_BOUND + SLACK)
    assert settled is not None, world.haproxy.servers("churn")
    print(f"churn: HAProxy holds exactly b and c {settled:.3f} s after the last change")
    addressed = [s for s in world.haproxy.servers("churn") if s.address not in ("-", "0.0.0.0")]
    assert {(s.address, s.port) for s in addressed} == left
    assert all(s.in_rotation for s in addressed), addressed
    client = world.client("churn")
    assert set(client.send(40)) == {"b", "c"}
    assert client.failed == 0


def test_the_local_region_emptied_fails_over_to_region_b_and_comes_back(world):
    """home's only instance deregistered: the agent answers region b's d (HAProxy ignores SRV
    priority, so b's instances are in the answer only while home has none), and d takes the
    traffic; home's instance registered again takes it back (after the rule's half second).
    No request fails in either move."""
    world.register("failover", "d", region="b")
    local = world.register("failover", "a")
    assert wait_until(lambda: world.rotation("failover") == {world.address("a")}, 10)
    client = world.client("failover")
    assert client.send(10) == {"a": 10}
    world.publishers["home"].deregister(local)
    emptied_at = time.monotonic()
    while world.rotation("failover") != {world.address("d")}:
        client.send(5)
        assert time.monotonic() - emptied_at < REMOVAL_BOUND + SLACK, world.rotation("failover")
    print(f"failed over to region b after {time.monotonic() - emptied_at:.3f} s")
    assert client.send(50) == {"d": 50}
    world.register("failover", "a")
    returned_at = time.monotonic()
    while world.rotation("failover") != {world.address("a")}:
        client.send(5)
        assert time.monotonic() - returned_at < RULE.return_after + REMOVAL_BOUND + SLACK
    print(f"back in home after {time.monotonic() - returned_at:.3f} s")
    assert client.send(50) == {"a": 50}
    assert client.failed == 0


def test_a_service_emptied_takes_haproxys_last_server_too(world):
    """haproxy/haproxy#50: the last SRV record gone left its server in HAProxy. The agent
    answers a known service with no instance with an empty answer, and HAProxy drops the last
    server once it has asked ``resolve_retries`` times (it believes no empty answer sooner)."""
    registration = world.register("emptied", "a")
    assert wait_until(lambda: world.rotation("emptied") == {world.address("a")}, 10)
    world.publishers["home"].deregister(registration)
    emptied_in = wait_until(lambda: not world.rotation("emptied"), EMPTIED_BOUND + SLACK)
    assert emptied_in is not None, world.rotation("emptied")
    print(f"emptied: the last server out of HAProxy's rotation after {emptied_in:.3f} s")
    assert world.client("emptied").get() is None  # HAProxy's 503: no server


def test_the_agent_restarted_leaves_haproxy_its_servers_throughout(world):
    """The agent killed and started again on a slow link to ZooKeeper (each chunk held
    SLOW_LINK s: the new agent's loads take seconds, longer than HAProxy's retries): HAProxy
    never loses a server while no agent answers (it keeps them for ``hold timeout``) nor
    while the new agent loads the service (it waits, or stays silent: never an empty or
    NXDOMAIN answer, which HAProxy would believe after its retries), no request fails, and the
    new agent's answers reach it (an instance registered after the restart enters)."""
    world.register("restarted", "a")
    world.register("restarted", "c")
    both = {world.address("a"), world.address("c")}
    assert wait_until(lambda: world.rotation("restarted") == both, 10)
    seen: list[set[tuple[str, int]]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            seen.append(world.rotation("restarted"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    client = world.client("restarted")
    try:
        stopped_at = time.monotonic()
        world.agent.stop()
        world.start_agent()
        world.link.delay = SLOW_LINK
        serving_at = time.monotonic()
        print(f"restarted: the agent serving {serving_at - stopped_at:.3f} s after the kill")
        # The new agent's loads on the slow link: HAProxy's answers from it resume after.
        valid = world.haproxy.valid_answers()
        assert wait_until(lambda: world.haproxy.valid_answers() > valid + 4, 20)
        loading = time.monotonic() - serving_at
        print(f"restarted: answering HAProxy {loading:.3f} s after that")
        # Longer than HAProxy takes to believe a negative answer, else this test could not
        # tell an agent that answers NXDOMAIN while it loads.
        assert loading > EMPTIED_BOUND
        world.link.delay = 0
        client.send(50)
        world.register("restarted", "b")
        assert wait_until(lambda: world.rotation("restarted") == {*both, world.address("b")}, 10)
    finally:
        world.link.delay = 0
        done.set()
        watcher.join()
    assert len(seen) > 10
    assert all(both <= rotation for rotation in seen), [r for r in seen if not both <= r][:3]
    assert set(client.send(50)) == {"a", "b", "c"}
    assert client.failed == 0


@pytest.fixture
def nginx_installed() -> None:
    """Skips the test, saying why, where nginx is not installed."""
    if nginx_binary() is None:
        pytest.skip("nginx is not installed (./run.sh test installs Debian's nginx-light)")


def test_debian_nginx_follows_a_records_through_a_drain(world, nginx_installed):
    """Debian's nginx (1.22) with the docs' configuration: the service's A records resolved
    at request time (a variable in ``proxy_pass``), requests spread over e and f (one port,
    two IPs); e drained, nginx stops sending it requests within its ``valid`` (counted on a
    clock of whole seconds: a second more) plus the slack, and no request fails."""
    registration = world.register(NGINX_SERVICE, "e")
    world.register(NGINX_SERVICE, "f")
    port = world.backends.ports["e"]
    with Nginx(config(world.dns, world.nginx_port, NGINX_SERVICE, port), world.nginx_port):
        client = Client(world.nginx_port)
        assert wait_until(lambda: {"e", "f"} <= set(client.send(10)), 10), client.answered
        world.publishers["home"].update_registration(registration, status="draining")
        drained_at = time.monotonic()
        while "e" in client.send(20):
            assert time.monotonic() - drained_at < VALID + 1 + SLACK, "e still reached"
        print(f"nginx: no request to the drained e after {time.monotonic() - drained_at:.3f} s")
        assert client.send(50) == {"f": 50}
        assert client.failed == 0


def test_debian_nginx_refuses_the_upstream_that_follows_srv_records(nginx_installed):
    """The docs' nginx >= 1.27.3 example (``server ... service= resolve`` in an upstream):
    Debian 12's nginx refuses it, as the page says."""
    nginx = Nginx(documented_upstream_config(), DOCUMENTED_LISTEN)
    try:
        checked = nginx.check()
    finally:
        nginx.stop()
    assert checked.returncode != 0
    assert 'invalid parameter "service=orders"' in checked.stderr


def test_the_docs_show_the_haproxy_configuration_these_tests_run():
    """The docs' HAProxy example (docs/dns.md) is the configuration this module's HAProxy
    runs (rendered with the page's addresses), so its timers are the ones measured here."""
    blocks = [
        block
        for page in sorted(DOCS.glob("*.md"))
        for block in re.findall(r"```haproxy\n(.*?)```", page.read_text(), re.S)
    ]
    assert blocks == [documented_config()]


def test_the_docs_show_the_nginx_configurations_these_tests_run():
    """The docs' nginx examples: the upstream for nginx >= 1.27.3 (which Debian's refuses,
    as a test above shows), then the configuration Debian's nginx runs here."""
    blocks = [
        block
        for page in sorted(DOCS.glob("*.md"))
        for block in re.findall(r"```nginx\n(.*?)```", page.read_text(), re.S)
    ]
    assert blocks == [documented_upstream_config(), documented_nginx_config()]
