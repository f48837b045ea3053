"""The daemons under their own identities in a namespace secured by ``sentinel init --secure``.

The metric collector and the shard manager announce themselves as instances of their own
services (``metric-collector-<cluster>``, ``shard-manager-<policy>``). Init grants each daemon
role write access to its own services only, so neither needs the publisher's identity, and
neither can write a service that applications resolve or the other daemon's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from kazoo.security import Permissions

from sentinel.collector import MetricCollector, parse_config
from sentinel.errors import AccessDenied, ServiceConflict
from sentinel.registry.records import MetricsRecord
from sentinel.testing.helpers import wait_until
from tests.integration.daemons import Daemon

pytestmark = pytest.mark.integration

SERVICE = "billing-db"


@dataclass
class Secured:
    identities: dict[str, str]
    identities_file: Path


def admin(cli, command: str, identities_file: Path, *options: str) -> dict:
    """``sentinel init --secure`` or ``sentinel grant``, as JSON."""
    secure = ("--secure",) if command == "init" else ()
    done = cli(command, *secure, "--identities", str(identities_file), "--json", *options)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def secured(cli_in_process, make_client, tmp_path: Path) -> Secured:
    """A namespace secured by the CLI (granting the collector cluster ``eu`` too), a shard
    policy made by the shard manager's identity, then ``sentinel grant`` for the new policy's
    manager (keeping the earlier grants), and one published instance of ``billing-db``."""
    identities_file = tmp_path / "identities.json"
    first = admin(
        cli_in_process, "init", identities_file, "--grant", "collector=metric-collector-eu"
    )
    assert first["grants"] == {
        "metric-collector-default": "collector",
        "metric-collector-eu": "collector",
    }
    identities = json.loads(identities_file.read_text())
    maker = make_client("policy-maker", identity=identities["shard_manager"], announce=False)
    maker.shard_maps.create("tenants", "directory", partitions=["p1", "p2"], buckets=4)
    maker.shard_maps.assign("tenants", "old-1", "p1")
    again = admin(cli_in_process, "grant", identities_file)
    assert again["grants"] == {
        "metric-collector-default": "collector",
        "metric-collector-eu": "collector",
        "shard-manager-tenants": "shard_manager",
    }
    publisher = make_client("publisher", identity=identities["publisher"], announce=False)
    publisher.ensure_service(SERVICE, scheme="postgresql", shard_policy="tenants")
    publisher.register(SERVICE, "p1", "10.0.0.1", 5432, label="primary")
    return Secured(identities, identities_file)


def test_init_gives_a_daemon_service_to_its_role_alone(secured, raw_zk):
    acl, _ = raw_zk.get_acls("/services/shard-manager-tenants")
    writers = {e.id.id.split(":")[0] for e in acl if e.perms & ~Permissions.READ}
    users = {role: i.split(":")[0] for role, i in secured.identities.items()}
    # Not the publisher: a member it added would take a share of the daemons' work.
    assert writers == {users["admin"], users["shard_manager"]}
    assert any(e.id.scheme == "world" and e.perms == Permissions.READ for e in acl)
    [daemon] = [e for e in acl if e.id.id.startswith(f"{users['shard_manager']}:")]
    assert daemon.perms == Permissions.READ | Permissions.CREATE | Permissions.DELETE


def test_the_collector_runs_under_its_own_identity(secured, zookeeper, namespace, raw_zk, tmp_path):
    config = tmp_path / "collector.toml"
    command = json.dumps(["echo", json.dumps({"replication_lag": 1.5})])
    config.write_text(
        'cluster = "eu"\n'
        "[[services]]\n"
        f'service = "{SERVICE}"\n'
        'interval = "1s"\n'
        "[services.source]\n"
        'type = "command"\n'
        f"command = {command}\n"
    )
    collector = Daemon(
        zookeeper,
        namespace,
        "collector",
        "run",
        "--config",
        str(config),
        identity=secured.identities["collector"],
    )
    try:
        node = f"/metrics/{SERVICE}/p1:primary"

        def published() -> dict | None:
            if raw_zk.exists(node) is None:
                return None
            return MetricsRecord.from_bytes(SERVICE, "p1:primary", node, raw_zk.get(node)[0]).values

        assert wait_until(published, timeout=30), collector.events
        assert published()["replication_lag"] == 1.5
        assert collector.saw("assigned", members=1), collector.events
        [member] = raw_zk.get_children("/services/metric-collector-eu")
        assert member.startswith("eu:collector-eu-")
    finally:
        stderr = collector.stop()
    assert secured.identities["collector"].split(":")[1] not in stderr


def test_the_shard_manager_runs_under_its_own_identity(secured, zookeeper, namespace, make_client):
    manager = Daemon(
        zookeeper,
        namespace,
        *("shard", "serve", "--policy", "tenants"),
        identity=secured.identities["shard_manager"],
    )
    try:
        assert wait_until(lambda: manager.saw("leader"), timeout=30), manager.events
        # Clients cannot write /shard_info in a secured namespace: the request comes from the
        # shard manager's own identity (an operator's tool, say).
        requester = make_client(
            "requester", identity=secured.identities["shard_manager"], announce=False
        )
        assert requester.shard_maps.request_placement("tenants", "fresh") is True
        assert wait_until(lambda: manager.saw("placed", key="fresh"), timeout=30), manager.events
        app = make_client("app")
        assert app.get_service(SERVICE, "old-1").port == 5432
        assert manager.saw("placed", key="fresh", partition="p2")  # least keys first
        assert wait_until(lambda: app.partition_of(SERVICE, "fresh") == "p2")
    finally:
        manager.stop()


@pytest.mark.parametrize(
    ("role", "others"),
    [
        ("collector", [SERVICE, "shard-manager-tenants", "metric-collector-never-granted"]),
        ("shard_manager", [SERVICE, "metric-collector-eu", "shard-manager-other"]),
    ],
)
def test_a_daemon_identity_writes_no_other_service(secured, make_client, raw_zk, role, others):
    daemon = make_client(f"a-{role}", identity=secured.identities[role], announce=False)
    for service in others:
        with pytest.raises(AccessDenied):
            daemon.register(service, "p1", "10.6.6.6", 1, label="intruder")
        assert not raw_zk.exists(f"/services/{service}/p1:intruder")
    with pytest.raises(AccessDenied):
        daemon.ensure_service(f"{role}-new-service")
    assert raw_zk.get_children(f"/services/{SERVICE}") == ["p1:primary"]
    # Ensuring a spec that exists asks nothing of the ACLs: it is read, not written.
    assert daemon.ensure_service(SERVICE, scheme="postgresql", shard_policy="tenants")
    with pytest.raises(ServiceConflict):
        daemon.ensure_service(SERVICE, scheme="http")


def test_a_shard_manager_not_granted_stops_saying_what_to_do(
    secured, zookeeper, namespace, make_client
):
    identity = secured.identities["shard_manager"]
    maker = make_client("policy-maker", identity=identity, announce=False)
    maker.shard_maps.create("later", "directory", partitions=["p1"], buckets=2)
    manager = Daemon(zookeeper, namespace, "shard", "serve", "--policy", "later", identity=identity)
    code = manager.process.wait(60)
    stderr = manager.stop()
    assert code == 1, stderr
    assert "sentinel grant --identities FILE shard_manager=shard-manager-later" in stderr
    assert identity.split(":")[1] not in stderr


def test_a_collector_in_a_cluster_not_granted_says_what_to_do(secured, make_client):
    sentinel = make_client("collector-x", identity=secured.identities["collector"], announce=False)
    config = parse_config(
        {
            "cluster": "asia",
            "services": [{"service": SERVICE, "source": {"type": "command", "command": "true"}}],
        }
    )
    with pytest.raises(AccessDenied) as refused:
        MetricCollector(sentinel, config)
    assert "sentinel grant --identities FILE collector=metric-collector-asia" in str(refused.value)
    assert secured.identities["collector"].split(":")[1] not in str(refused.value)


def test_grant_takes_over_a_daemon_service_the_publisher_made(
    secured, cli_in_process, make_client, raw_zk
):
    # Before the daemons had roles, operators ran them as the publisher.
    as_publisher = make_client("old-way", identity=secured.identities["publisher"], announce=False)
    as_publisher.register("metric-collector-old", "old", "10.0.0.9", 1, label="old")
    collector = make_client("new-way", identity=secured.identities["collector"], announce=False)
    with pytest.raises(AccessDenied):
        collector.register("metric-collector-old", "old", "10.0.0.9", 2, label="new")
    grants = admin(cli_in_process, "grant", secured.identities_file)["grants"]
    assert grants["metric-collector-old"] == "collector"
    collector.register("metric-collector-old", "old", "10.0.0.9", 2, label="new")
    assert sorted(raw_zk.get_children("/services/metric-collector-old")) == ["old:new", "old:old"]


def test_grants_name_a_daemon_service_of_their_role(cli_in_process, tmp_path):
    identities_file = tmp_path / "identities.json"
    for grant in ("collector=billing-db", "publisher=metric-collector-x", "collector", "x=y"):
        done = cli_in_process(
            "init", "--secure", "--identities", str(identities_file), "--grant", grant
        )
        assert done.returncode == 2, (grant, done.stdout, done.stderr)
        assert not identities_file.exists()  # refused before anything was written
    done = cli_in_process("init", "--grant", "collector=metric-collector-eu")
    assert done.returncode == 2 and "--secure" in done.stderr
    assert cli_in_process("init").returncode == 0
    done = cli_in_process(
        "init", "--secure", "--identities", str(identities_file), namespace_override="/x"
    )
    assert done.returncode == 0, done.stderr
    done = cli_in_process(
        "grant", "--identities", str(identities_file)
    )  # the test's namespace: open
    assert done.returncode == 2 and "not secured" in done.stderr
