"""One scenario across every surface (issue 51, item 4): two regions of one namespace, and
what each surface shows of the others as the world changes.

East (this process's region: the session's ZooKeeper) and west (a ZooKeeper of the module's
own) each hold the namespace. ``api`` has readiness-checked instances in both (a real HTTP
endpoint per region, which the test turns to 503) and a rule failing over to west; ``orders``
is sharded by ``tenants`` (a directory kept in both regions); ``ledger`` (from step 7) is a
Curator-format service. Every instance is a real grpcio server. One agent serves the
region's processes, over its socket, as an xDS server and as a DNS server; a grpcio client
calls ``xds:///<service>`` through it, and ``dig`` asks it for ``_<service>._tcp.sentinel``.

=====  ============================  =====================================================
step   what happens                  what every surface must show
=====  ============================  =====================================================
1      all healthy                   the same east instances serve ``api``
2      east's ``api`` fails its      west serves; the failing check and its last result
       readiness check (503)         are named; east's instances say why they are out
3      west's ``api`` empties        NoInstanceAvailable naming both regions
4      east recovers; a credential   lookups go home and never fail during the rotation
       rotates
5      ``tenants`` moved in west     east still routes by its own map; doctor says they
       only (east lags)              differ
6      ``sentinel shard sync``       keyed lookups follow the synced map
7      a Curator-format service      ``ls``, ``resolve``, ``doctor`` and lookups show it
=====  ============================  =====================================================

Each step is one test per surface, ``test_scenario_<step>_<what>_<surface>`` (library, cli,
agent, grpc, dns), run in order on one worker (the module-scoped world groups them:
tests/conftest.py's ``_worker_group``). A step's change is made once, by the first of its tests
to run (:meth:`Scenario.reach`, which also makes the earlier steps' changes), so that one step
can be run alone (``-k scenario_3``). A later surface adds its own test per step, with
``scenario`` in its name (docs/testing.md, "One scenario across every surface").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from sentinel import HealthCheck, Sentinel
from sentinel.agent.dns.server import DnsServer
from sentinel.agent.regions import RegionServers
from sentinel.agent.server import AgentServer
from sentinel.agent.xds import XdsServer
from sentinel.agent.xds_bootstrap import bootstrap_json
from sentinel.agent.xds_resources import PARTITION_HEADER
from sentinel.auth import ClientKeyring
from sentinel.auth.backends import FileBackend
from sentinel.auth.config import AuthConfig
from sentinel.curator import CuratorPublisher
from sentinel.errors import NoInstanceAvailable
from sentinel.regions import LOCAL_ONLY, Failover, Region, Regions
from sentinel.registry.layout import service_path
from sentinel.registry.records import CuratorSource, InstanceRecord
from sentinel.testing.grpcserver import LoopbackGRPCServer
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from tests.conftest import sentinel_in_process
from tests.integration.test_agent_dns import DIG, dig
from tests.integration.test_agent_xds import BOOTSTRAP_ENV, calls
from tests.integration.test_health import readiness_server

pytestmark = pytest.mark.integration

RULE = Failover(regions=("west",), return_after=0.5)
# Checks a loaded two-core machine keeps up with: a run answers in milliseconds, but the
# check's thread and the endpoint's share this process with everything else, and a run
# without a result within its timeout is a failure (two in a row: the instance goes down, and
# every surface says so). So the default timeout (2 s; a check's timeout is at most its
# interval): a change is in the registry within two runs, 4 s, well within SEEN_WITHIN, and
# every step waits for it there (Scenario.reach) rather than for a time.
CHECK = {"interval": 2.0, "timeout": 2.0, "failures_before_down": 2, "successes_before_up": 1}
# Where each service's instances are (each a grpcio server named by its label).
API = {"east": ("east-a", "east-b"), "west": ("west-a",)}
ORDERS = {"p1": "east-p1", "p2": "east-p2"}  # by partition: east's only
APP = "app"  # the auth client of both of the region's applications (library and agent-fed)
# Bound of every wait for a change to reach a surface: scheduling, a write and its watch on
# a loaded two-core machine, and the agent's hop.
SEEN_WITHIN = 10.0


@dataclass
class Scenario:
    """The world of the module, and the step it has been brought to."""

    namespace: str
    east: LocalZooKeeper
    west: LocalZooKeeper
    regions_file: str
    agent_socket: str
    publishers: dict[str, Sentinel]
    readiness: dict[str, Any]  # test_health's readiness servers: /ready answers .code
    servers: dict[str, LoopbackGRPCServer]
    library: Sentinel  # the region's application, a client of its own
    agent_fed: Sentinel  # another, fed by the agent
    credentials: FileBackend
    stack: contextlib.ExitStack
    dns: str = ""  # the agent's DNS server's HOST:PORT
    step: int = 1
    notes: dict[str, object] = field(default_factory=dict)

    # -- the surfaces, as a user reaches them

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """``sentinel ARGS --regions FILE`` (east local), run in this process."""
        return sentinel_in_process(*args, "--regions", self.regions_file, "--timeout", "5")

    def agent_status(self) -> dict:
        result = sentinel_in_process(
            "agent",
            "status",
            "--socket",
            self.agent_socket,
            "--namespace",
            self.namespace,
            "--json",
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    @staticmethod
    def served_by(service: str, metadata: list[tuple[str, str]] | None = None) -> set[str] | str:
        """Which instances answer calls of a new ``xds:///service`` channel through the
        agent, once settled: the same ones answering three batches of 10 calls in a row,
        polled within :data:`SEEN_WITHIN` (the agent hears a change a moment after the
        registry holds it, so a channel opened at once may first be sent the state before).
        Not settled by then: every instance that answered; no call succeeded: the last
        call's status (``UNAVAILABLE: ...``)."""
        batches: list[set[str]] = []
        failed = ""

        def settled() -> bool:
            nonlocal failed
            try:
                batches.append(set(calls(channel, 10, metadata)))
            except grpc.RpcError as exc:
                failed = f"{exc.code().name}: {exc.details()}"
                return False
            return len(batches) >= 3 and batches[-1] == batches[-2] == batches[-3]

        with grpc.insecure_channel(f"xds:///{service}") as channel:
            if wait_until(settled, SEEN_WITHIN) is not None:
                return batches[-1]
        return set().union(*batches) or failed

    def srv(self, name: str) -> tuple[str, set[tuple[int, str]]] | str:
        """``dig`` of ``name``'s SRV records once settled (the same answer three times in a
        row, polled within :data:`SEEN_WITHIN`): its status and each record's priority and
        target's label; without dig, why not."""
        if DIG is None:
            pytest.skip("dig is not installed (Debian: apt-get install dnsutils)")
        answers: list[tuple[str, set[tuple[int, str]]]] = []

        def settled() -> bool:
            answer = dig(self.dns, name, "SRV")
            answers.append(
                (
                    answer.status,
                    {(int(d.split()[0]), d.split()[3].split(".")[0]) for d in answer.data("SRV")},
                )
            )
            return len(answers) >= 3 and answers[-1] == answers[-2] == answers[-3]

        wait_until(settled, SEEN_WITHIN)
        return answers[-1]

    @staticmethod
    def refused(service: str) -> str | None:
        """The status of a call of ``xds:///service`` once calls fail (polled within
        :data:`SEEN_WITHIN`), None when they keep succeeding."""
        status: list[str] = []

        def fails() -> bool:
            try:
                calls(channel, 1)
            except grpc.RpcError as exc:
                status.append(exc.code().name)
                return True
            return False

        with grpc.insecure_channel(f"xds:///{service}") as channel:
            wait_until(fails, SEEN_WITHIN)
        return status[-1] if status else None

    # -- the steps' changes

    def reach(self, step: int) -> None:
        """Make every change up to ``step`` that is not made yet, waiting for each to show
        in the registry (not on the surfaces: that is what the tests assert; step 4 waits for
        both applications to be home before its rotation, which is about resolving locally)."""
        changes: dict[int, Callable[[], None]] = {
            2: self._east_unready,
            3: self._west_empties,
            4: self._east_recovers_and_credential_rotates,
            5: self._map_moves_in_west_only,
            6: self._map_synced,
            7: self._curator_service,
        }
        while self.step < step:
            changes[self.step + 1]()
            self.step += 1

    def _statuses(self, service: str, region: str) -> dict[str, str]:
        """Each instance's status as its node in ``region`` says now."""
        zk = self.publishers[region].session.zk
        parent = service_path(service)
        return {
            name: InstanceRecord.from_bytes(
                service, name, f"{parent}/{name}", zk.get(f"{parent}/{name}")[0]
            ).status
            for name in zk.get_children(parent)
        }

    def _east_unready(self) -> None:
        self.readiness["east"].code = 503
        assert wait_until(
            lambda: set(self._statuses("api", "east").values()) == {"down"}, SEEN_WITHIN
        ), self._statuses("api", "east")

    def _west_empties(self) -> None:
        publisher = self.publishers["west"]
        for registration in list(publisher.registrations):
            if registration.service == "api":
                publisher.deregister(registration)
        assert wait_until(lambda: not self._statuses("api", "west"), SEEN_WITHIN)

    def _east_recovers_and_credential_rotates(self) -> None:
        """East's endpoint answers 200 again; once every east instance is up and both
        applications are back home, the credential of ``app`` rotates while both resolve
        ``api`` without a pause, and every failure of theirs is kept (``notes``)."""
        self.readiness["east"].code = 200
        assert wait_until(
            lambda: set(self._statuses("api", "east").values()) == {"up"}, SEEN_WITHIN
        ), self._statuses("api", "east")
        for app in (self.library, self.agent_fed):
            assert wait_until(
                lambda app=app: app.get_service("api").label.startswith("east-"),
                SEEN_WITHIN,
                ignore=(NoInstanceAvailable,),
            )
        failures: list[BaseException] = []
        lookups = Counter()
        stop = threading.Event()

        def resolve(app: Sentinel) -> None:
            while not stop.is_set():
                try:
                    app.get_service("api")
                    lookups[app.client_id] += 1
                except Exception as exc:  # every failure is the finding
                    failures.append(exc)
                stop.wait(0.002)

        threads = [
            threading.Thread(target=resolve, args=(a,)) for a in (self.library, self.agent_fed)
        ]
        for thread in threads:
            thread.start()
        try:
            result = self.publishers["east"].credentials.rotate(
                "api", APP, self.credentials, timeout=SEEN_WITHIN
            )
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        self.notes.update(rotation=result, failures=failures, lookups=lookups)

    def _map_moves_in_west_only(self) -> None:
        """``acme`` moved to p2 in west alone (the shard manager reached west, not east)."""
        moved = self.cli("shard", "assign", "acme", "p2", "--policy", "tenants", "--region", "west")
        assert moved.returncode == 0, moved.stderr

    def _map_synced(self) -> None:
        synced = self.cli("shard", "sync", "--policy", "tenants", "--from", "west")
        assert synced.returncode == 0, synced.stderr
        self.notes["synced"] = synced.stdout

    def _curator_service(self) -> None:
        """``ledger``: its spec in the namespace names a Curator base path, where a
        publisher writing Curator's format (as a Java service would) registers it."""
        base = f"{self.namespace}-curator"
        self.publishers["east"].ensure_service("ledger", curator=CuratorSource(base))
        publisher = self.stack.enter_context(CuratorPublisher(self.east.connect_string, base))
        publisher.register(
            "ledger", "127.0.0.1", self.servers["ledger-1"].port, instance_id="ledger-1"
        )
        self.notes["curator_base"] = base


@pytest.fixture(scope="module")
def west() -> Iterator[LocalZooKeeper]:
    with LocalZooKeeper() as zk:
        yield zk


@pytest.fixture(scope="module")
def scenario(zookeeper, west, tmp_path_factory) -> Iterator[Scenario]:
    namespace = f"/scenario-{uuid.uuid4().hex[:8]}"
    east = zookeeper
    regions = Regions(
        "east",
        [
            Region("east", east.connect_string, namespace=namespace),
            Region("west", west.connect_string, namespace=namespace),
        ],
    )
    directory = tmp_path_factory.mktemp("scenario")
    regions_file = directory / "regions.json"
    regions_file.write_text(
        json.dumps(
            {
                "local": "east",
                "regions": {
                    name: {"hosts": region.hosts, "namespace": namespace}
                    for name, region in regions.regions.items()
                },
            }
        )
    )
    ring = directory / f"{APP}.keys"
    ClientKeyring.generate().save(ring)
    names = (*API["east"], *API["west"], *ORDERS.values(), "ledger-1")
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(LoopbackGRPCServer(name)) for name in names}
        readiness = {region: stack.enter_context(readiness_server()) for region in ("east", "west")}
        publishers = {}
        for region, zk in (("east", east), ("west", west)):
            publisher = Sentinel(
                zk.connect_string,
                f"publisher-{region}",
                namespace,
                regions=False,
                agent=False,
                prometheus_registry=None,
                session_timeout=30.0,
            ).start()
            stack.callback(publisher.close)
            publisher.ensure_namespace()
            publisher.shard_maps.ensure("tenants", "directory", partitions=["p1", "p2"])
            publisher.shard_maps.assign("tenants", "acme", "p1")
            publisher.ensure_service("api", failover=RULE)
            check = HealthCheck.http(
                f"http://127.0.0.1:{readiness[region].server_port}/ready", **CHECK
            )
            for name in API[region]:
                publisher.register(
                    "api", "default", "127.0.0.1", servers[name].port, label=name, health=check
                )
            publishers[region] = publisher
        publishers["east"].ensure_service("orders", shard_policy="tenants")
        for partition, name in ORDERS.items():
            publishers["east"].register(
                "orders", partition, "127.0.0.1", servers[name].port, label=name
            )

        # The agent: its own session in east, one in west when a process needs it, and xDS.
        agent_home = Sentinel(
            east.connect_string,
            "host-agent",
            namespace,
            announce=False,
            agent=False,
            regions=False,
            prometheus_registry=None,
        ).start()
        stack.callback(agent_home.close)
        sockets = tempfile.mkdtemp(prefix="scenario-")
        stack.callback(os.rmdir, sockets)
        agent_socket = f"{sockets}/agent.sock"
        # The default session timeout and heartbeats: a loaded machine's pause of a second
        # or two must not expire the agent's session to west nor drop the agent's process
        # (nothing here is about an agent noticing a dead peer).
        region_servers = RegionServers(regions, client_id="host-agent", connect_timeout=5.0)
        agent = AgentServer(agent_home, agent_socket, regions=region_servers).start()
        stack.callback(agent.stop)
        xds = XdsServer(agent_home, f"unix:{sockets}/xds.sock", send_timeout=2.0).start()
        stack.callback(xds.stop)
        dns = stack.enter_context(DnsServer(agent_home, "127.0.0.1:0"))
        # gRPC's xDS client reads its bootstrap when a process's first xds:/// channel opens.
        environment = stack.enter_context(pytest.MonkeyPatch.context())
        environment.setenv(BOOTSTRAP_ENV, bootstrap_json(xds.address, "scenario"))

        auth = AuthConfig(keys=str(ring), client=APP)
        library = Sentinel(
            east.connect_string,
            "app-library",
            namespace,
            regions=regions,
            agent=False,
            prometheus_registry=None,
            auth=auth,
        ).start()
        stack.callback(library.close)
        agent_fed = Sentinel(
            east.connect_string,
            "app-agent-fed",
            namespace,
            regions=regions,
            agent=agent_socket,
            prometheus_registry=None,
            connect_timeout=5.0,
            auth=auth,
        ).start()
        stack.callback(agent_fed.close)
        credentials = FileBackend(directory / "credentials.json")
        publishers["east"].credentials.publish("api", APP, credentials.create("api", APP, 1))
        world = Scenario(
            namespace,
            east,
            west,
            str(regions_file),
            agent_socket,
            publishers,
            readiness,
            servers,
            library,
            agent_fed,
            credentials,
            stack,
            dns.address,
        )
        # Set up when every api instance is up and both applications hold the credential.
        for region in ("east", "west"):
            assert wait_until(
                lambda r=region: set(world._statuses("api", r).values()) == {"up"}, SEEN_WITHIN
            )
        for app in (library, agent_fed):
            assert wait_until(
                lambda app=app: app.get_service("api").auth is not None,
                SEEN_WITHIN,
                ignore=(NoInstanceAvailable,),
            )
        yield world


# -- what the surfaces are asked


def labels(app: Sentinel, service: str, key: object = None, lookups: int = 20) -> set[str]:
    """The instances ``lookups`` lookups of ``service`` return."""
    return {app.get_service(service, key).label for _ in range(lookups)}


def settles(probe: Callable[[], object], expected: object) -> object:
    """``probe()`` once it returns ``expected`` (polled within :data:`SEEN_WITHIN`: a
    cache hears of a change a moment after the registry holds it), else its last answer."""
    last: list[object] = [None]

    def matches() -> bool:
        try:
            last[0] = probe()
        except NoInstanceAvailable as exc:
            last[0] = exc
        return last[0] == expected

    wait_until(matches, SEEN_WITHIN)
    return last[0]


def unavailable(app: Sentinel, service: str, **options: object) -> str:
    """The text of the NoInstanceAvailable a lookup raises (once it does, polled)."""
    raised: list[str] = []

    def fails() -> bool:
        try:
            app.get_service(service, **options)
        except NoInstanceAvailable as exc:
            raised.append(str(exc))
            return True
        return False

    assert wait_until(fails, SEEN_WITHIN) is not None, f"{service} still resolves"
    return raised[-1]


# How a surface names east's failing readiness check and its last result: the check (its
# source, or its URL's path) and the endpoint's answer, 503.
CHECK_NAMES = ("check:http", "/ready")
# 503 as a number of its own: not a port's or a timestamp's digits.
LAST_RESULT = re.compile(r"(?<![\d.])503(?![\d.])")


def names_the_failing_check(text: str) -> bool:
    return any(name in text for name in CHECK_NAMES) and LAST_RESULT.search(text) is not None


def about(findings: list[dict], service: str) -> list[dict]:
    """The doctor's findings that speak of ``service``."""
    word = re.compile(rf"\b{re.escape(service)}\b")
    return [f for f in findings if word.search(f["detail"])]


def doctor(scenario: Scenario, *args: str) -> tuple[int, list[dict], str]:
    """``sentinel doctor ARGS`` twice: exit code and findings of --json, and the table."""
    as_json = scenario.cli("doctor", *args, "--json")
    table = scenario.cli("doctor", *args)
    assert as_json.returncode == table.returncode, (as_json.stderr, table.stderr)
    return as_json.returncode, json.loads(as_json.stdout), table.stdout


def resolve(scenario: Scenario, *args: str) -> tuple[int, dict, str]:
    """``sentinel resolve ARGS`` twice: exit code and document of --json, and the text."""
    as_json = scenario.cli("resolve", *args, "--json")
    text = scenario.cli("resolve", *args)
    assert as_json.returncode == text.returncode, (as_json.stderr, text.stderr)
    return as_json.returncode, json.loads(as_json.stdout), text.stdout


def listed(scenario: Scenario, *args: str) -> object:
    result = scenario.cli("ls", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def regions_of(status: dict) -> dict[str, dict]:
    return {r["region"]: r for r in status["regions"]}


def followed_by(status: dict, client: str) -> list[str]:
    return next(p["services"] for p in status["processes"] if p["client"] == client)


EAST_API = set(API["east"])


# -- step 1: all healthy. Every surface agrees that east's two instances serve api.


def test_scenario_1_all_healthy_library(scenario):
    scenario.reach(1)
    app = scenario.library
    assert settles(lambda: labels(app, "api"), EAST_API) == EAST_API
    assert {e.label for e in app.eligible_instances("api")} == EAST_API
    explanation = app.explain("api")
    assert explanation.region == "east"
    assert explanation.region_reason == "the local region has eligible instances"
    assert set(explanation.verdicts.values()) == {"eligible"}
    assert app.get_service("api").auth.version == 1
    assert app.get_service("orders", "acme").label == "east-p1"


def test_scenario_1_all_healthy_agent(scenario):
    scenario.reach(1)
    app = scenario.agent_fed
    assert settles(lambda: labels(app, "api"), EAST_API) == EAST_API
    assert app.explain("api").region == "east"
    assert app.get_service("api").auth.version == 1
    assert app.get_service("orders", "acme").label == "east-p1"
    assert app.session_id is None  # no session of its own: the agent's
    status = scenario.agent_status()
    assert status["state"] == "connected"
    assert "api" in followed_by(status, "app-agent-fed")
    assert regions_of(status)["west"]["state"] == "unopened"  # nothing needed west yet


def test_scenario_1_all_healthy_cli(scenario):
    scenario.reach(1)
    services = {d["service"]: d for d in listed(scenario)}
    assert set(services) == {"api", "orders"}
    instances = listed(scenario, "api")["instances"]
    assert {i["label"]: i["health"] for i in instances} == {
        label: {"source": "check:http", "state": "up"} for label in EAST_API
    }
    code, document, text = resolve(scenario, "api", "-n", "10")
    assert code == 0 and document["region"] == "east"
    assert {p["label"] for p in document["picks"]} <= EAST_API
    assert {i["label"]: i["verdict"] for i in document["instances"]} == dict.fromkeys(
        EAST_API, "eligible"
    )
    assert "region east" in text
    code, findings, table = doctor(scenario)
    assert code == 0, table
    assert [f for f in findings if f["severity"] == "error"] == []
    assert "0 problem(s)" in table


def test_scenario_1_all_healthy_grpc(scenario):
    scenario.reach(1)
    assert scenario.served_by("api") == EAST_API
    assert scenario.served_by("orders", [(PARTITION_HEADER, "p1")]) == {"east-p1"}


def test_scenario_1_all_healthy_dns(scenario):
    scenario.reach(1)
    assert scenario.srv("_api._tcp.sentinel") == ("NOERROR", {(0, n) for n in EAST_API})
    assert scenario.srv("_p1._orders._tcp.sentinel") == ("NOERROR", {(0, "east-p1")})
    assert scenario.srv("acme.key.orders.sentinel") == ("NOERROR", {(0, "east-p1")})


# -- step 2: every api instance in east fails its readiness check (its endpoint answers
# 503). West serves; every surface says so, and names the check and its last result.


def test_scenario_2_east_unready_library(scenario):
    scenario.reach(2)
    app = scenario.library
    assert settles(lambda: labels(app, "api"), {"west-a"}) == {"west-a"}
    explanation = app.explain("api")
    assert explanation.region == "west" and "west" in explanation.region_reason
    assert explanation.home is not None and explanation.home.eligible == ()
    east = explanation.home.verdicts
    assert set(east) == {"default:east-a", "default:east-b"}
    local = unavailable(app, "api", failover=LOCAL_ONLY)
    assert names_the_failing_check(local), local
    # Why each of east's is not eligible: its check, and what it last answered.
    for name, verdict in east.items():
        assert names_the_failing_check(verdict), (name, verdict)


def test_scenario_2_east_unready_agent(scenario):
    scenario.reach(2)
    app = scenario.agent_fed
    assert settles(lambda: labels(app, "api"), {"west-a"}) == {"west-a"}
    assert app.explain("api").region == "west"
    west = regions_of(scenario.agent_status())["west"]
    assert (west["state"], west["processes"]) == ("connected", 1)  # opened for the process
    local = unavailable(app, "api", failover=LOCAL_ONLY)
    assert names_the_failing_check(local), local


def test_scenario_2_east_unready_cli(scenario):
    scenario.reach(2)
    instances = listed(scenario, "api")["instances"]
    assert {i["label"]: i["health"] for i in instances} == {
        label: {"source": "check:http", "state": "down"} for label in EAST_API
    }
    code, document, text = resolve(scenario, "api")
    assert code == 0 and document["region"] == "west"
    assert [p["label"] for p in document["picks"]] == ["west-a"]
    assert "region west" in text
    assert names_the_failing_check(json.dumps(document)), document
    assert names_the_failing_check(text), text
    # Why east does not serve: its own instances, each with its verdict ("home").
    home = document["home"]
    assert home["region"] == "east" and {i["label"] for i in home["instances"]} == EAST_API
    assert all(names_the_failing_check(i["verdict"]) for i in home["instances"]), home
    assert "excluded by status up" not in json.dumps(document), document
    # doctor: api is served (by west), so no ERROR for it; it says west serves, and why
    # east does not.
    code, findings, table = doctor(scenario)
    api = about(findings, "api")
    assert [f for f in api if f["severity"] == "error"] == [], api
    assert any("west" in f["detail"] for f in api), api
    assert any(names_the_failing_check(f["detail"] + " " + f["fix"]) for f in api), api
    lines = [line for line in table.splitlines() if re.search(r"\bapi\b", line)]
    assert not [line for line in lines if line.startswith("ERROR")], table
    assert any("west" in line for line in lines), table
    assert code == 0, table


def test_scenario_2_east_unready_grpc(scenario):
    scenario.reach(2)
    assert scenario.served_by("api") == {"west-a"}


def test_scenario_2_east_unready_dns(scenario):
    """West's instance answers, priority 1 (HAProxy ignores priorities: never beside east's);
    TXT names east's failing check and its last result."""
    scenario.reach(2)
    assert scenario.srv("_api._tcp.sentinel") == ("NOERROR", {(1, "west-a")})
    txt = " ".join(dig(scenario.dns, "api.sentinel", "TXT").data("TXT"))
    assert "region=west" in txt and names_the_failing_check(txt), txt


# -- step 3: west's api instance leaves too. Nothing serves api; every surface says why,
# naming both regions.


def test_scenario_3_west_empty_library(scenario):
    scenario.reach(3)
    app = scenario.library
    error = unavailable(app, "api")
    assert "east" in error and "west" in error, error
    explanation = app.explain("api")
    assert explanation.region == "east" and "west" in explanation.region_reason
    assert explanation.eligible == ()
    assert names_the_failing_check(error), error
    # what west's client said of its own (absent) regions is not this client's case
    assert "no other region" not in error, error


def test_scenario_3_west_empty_agent(scenario):
    scenario.reach(3)
    error = unavailable(scenario.agent_fed, "api")
    assert "east" in error and "west" in error, error
    assert regions_of(scenario.agent_status())["west"]["state"] == "connected"
    assert names_the_failing_check(error), error
    assert "no other region" not in error, error


def test_scenario_3_west_empty_cli(scenario):
    scenario.reach(3)
    code, document, text = resolve(scenario, "api")
    assert code == 1 and document["picks"] == []
    assert "east" in document["error"] and "west" in document["error"], document
    assert "nothing eligible" in text and "west" in text
    code, findings, table = doctor(scenario)
    assert code == 1
    assert [f for f in about(findings, "api") if f["severity"] == "error"], table
    assert names_the_failing_check(document["error"]), document["error"]
    assert names_the_failing_check(text), text


def test_scenario_3_west_empty_grpc(scenario):
    scenario.reach(3)
    assert scenario.refused("api") == "UNAVAILABLE"


def test_scenario_3_west_empty_dns(scenario):
    """Nothing eligible anywhere: an empty NOERROR (the service exists), never NXDOMAIN."""
    scenario.reach(3)
    assert scenario.srv("_api._tcp.sentinel") == ("NOERROR", set())


# -- step 4: east's endpoint answers 200 again; then app's credential rotates while both
# applications resolve api without a pause.


def test_scenario_4_identity_rotates_library(scenario):
    scenario.reach(4)
    app = scenario.library
    assert scenario.notes["failures"] == []
    assert scenario.notes["lookups"]["app-library"] > 0
    rotation = scenario.notes["rotation"]
    assert dict(rotation.versions) == {APP: 2} and dict(rotation.revoked) == {APP: (1,)}
    endpoint = app.get_service("api")
    assert endpoint.label in EAST_API and endpoint.auth.version == 2
    assert scenario.credentials.accepts("api", APP, endpoint.auth)
    assert app.explain("api").region == "east"  # home again


def test_scenario_4_identity_rotates_agent(scenario):
    scenario.reach(4)
    app = scenario.agent_fed
    assert scenario.notes["lookups"]["app-agent-fed"] > 0
    endpoint = app.get_service("api")
    assert endpoint.label in EAST_API and endpoint.auth.version == 2
    assert app.explain("api").region == "east"
    assert "api" in followed_by(scenario.agent_status(), "app-agent-fed")


def test_scenario_4_identity_rotates_cli(scenario):
    scenario.reach(4)
    status = scenario.cli("auth", "status", "--service", "api", "--json")
    assert status.returncode == 0, status.stderr
    [row] = json.loads(status.stdout)
    assert row["client"] == APP and row["published"] == [2] and row["live"] is True
    assert row["processes"] == {"app-library": 2, "app-agent-fed": 2}
    code, document, _ = resolve(scenario, "api")
    assert code == 0 and document["region"] == "east"
    # doctor agrees with `auth status`: the credential's client is connected (through two
    # processes sharing its key ring), not orphaned.
    _, findings, table = doctor(scenario)
    orphaned = [f for f in findings if f["check"] == "orphaned auth"]
    assert orphaned == [], table


def test_scenario_4_identity_rotates_grpc(scenario):
    scenario.reach(4)
    assert scenario.served_by("api") == EAST_API


# -- step 5: acme moved to p2 in west alone (east missed the change). East's surfaces route
# by east's own map, and doctor says the maps differ.


def test_scenario_5_shard_map_lags_library(scenario):
    scenario.reach(5)
    app = scenario.library
    assert app.partition_of("orders", "acme") == "p1"
    assert labels(app, "orders", "acme") == {"east-p1"}
    assert app.explain("orders", "acme").partition == "p1"


def test_scenario_5_shard_map_lags_agent(scenario):
    scenario.reach(5)
    app = scenario.agent_fed
    assert app.partition_of("orders", "acme") == "p1"
    assert labels(app, "orders", "acme") == {"east-p1"}


def test_scenario_5_shard_map_lags_cli(scenario):
    scenario.reach(5)
    shown = {}
    for region in ("east", "west"):
        result = scenario.cli(
            "shard", "show", "acme", "--policy", "tenants", "--region", region, "--json"
        )
        assert result.returncode == 0, result.stderr
        shown[region] = json.loads(result.stdout)["partition"]
    assert shown == {"east": "p1", "west": "p2"}
    code, document, _ = resolve(scenario, "orders", "acme")
    assert code == 0 and document["partition"] == "p1"
    assert [p["label"] for p in document["picks"]] == ["east-p1"]
    _, findings, table = doctor(scenario, "--region", "all")
    (differs,) = [f for f in findings if f["check"] == "shard maps agree"]
    assert differs["severity"] == "error" and "tenants" in differs["detail"], table
    assert "sentinel shard sync" in differs["fix"]


def test_scenario_5_shard_map_lags_grpc(scenario):
    scenario.reach(5)
    partition = scenario.library.partition_of("orders", "acme")
    assert scenario.served_by("orders", [(PARTITION_HEADER, partition)]) == {"east-p1"}


# -- step 6: `sentinel shard sync --from west` copies west's map over east's; the keyed
# lookups follow.


def test_scenario_6_shard_map_synced_library(scenario):
    scenario.reach(6)
    app = scenario.library
    assert settles(lambda: labels(app, "orders", "acme"), {"east-p2"}) == {"east-p2"}
    assert app.partition_of("orders", "acme") == "p2"
    assert app.explain("orders", "acme").partition == "p2"


def test_scenario_6_shard_map_synced_agent(scenario):
    scenario.reach(6)
    app = scenario.agent_fed
    assert settles(lambda: labels(app, "orders", "acme"), {"east-p2"}) == {"east-p2"}
    assert app.partition_of("orders", "acme") == "p2"


def test_scenario_6_shard_map_synced_cli(scenario):
    scenario.reach(6)
    assert "east: copied" in scenario.notes["synced"]
    code, document, _ = resolve(scenario, "orders", "acme")
    assert code == 0 and document["partition"] == "p2"
    assert [p["label"] for p in document["picks"]] == ["east-p2"]
    _, findings, table = doctor(scenario, "--region", "all")
    maps = [f for f in findings if f["check"] in ("shard map", "shard maps agree")]
    assert maps and {f["severity"] for f in maps} == {"ok"}, table


def test_scenario_6_shard_map_synced_grpc(scenario):
    scenario.reach(6)
    partition = settles(lambda: scenario.library.partition_of("orders", "acme"), "p2")
    assert scenario.served_by("orders", [(PARTITION_HEADER, partition)]) == {"east-p2"}


def test_scenario_6_shard_map_synced_dns(scenario):
    scenario.reach(6)
    assert scenario.srv("acme.key.orders.sentinel") == ("NOERROR", {(0, "east-p2")})


# -- step 7: ledger, a Curator-format service (its instances written as Java Curator
# writes them; its spec in the namespace names the base path), shows on every surface.


def test_scenario_7_curator_service_library(scenario):
    scenario.reach(7)
    app = scenario.library
    assert labels(app, "ledger") == {"ledger-1"}
    explanation = app.explain("ledger")
    assert explanation.region == "east" and explanation.partition is None
    assert [e.label for e in explanation.eligible] == ["ledger-1"]


def test_scenario_7_curator_service_agent(scenario):
    scenario.reach(7)
    app = scenario.agent_fed
    assert settles(lambda: labels(app, "ledger"), {"ledger-1"}) == {"ledger-1"}
    assert "ledger" in followed_by(scenario.agent_status(), "app-agent-fed")


def test_scenario_7_curator_service_cli(scenario):
    scenario.reach(7)
    source = f"curator:{scenario.notes['curator_base']}"
    services = {d["service"]: d for d in listed(scenario)}
    assert {"api", "orders", "ledger"} <= set(services)
    one = listed(scenario, "ledger")
    assert one["source"] == source
    assert [(i["label"], i["port"]) for i in one["instances"]] == [
        ("ledger-1", scenario.servers["ledger-1"].port)
    ]
    code, document, _ = resolve(scenario, "ledger")
    assert code == 0 and [p["label"] for p in document["picks"]] == ["ledger-1"]
    code, findings, table = doctor(scenario)
    assert [f for f in about(findings, "ledger") if f["severity"] == "error"] == [], table
    assert code == 0, table


def test_scenario_7_curator_service_grpc(scenario):
    scenario.reach(7)
    assert scenario.served_by("ledger") == {"ledger-1"}
