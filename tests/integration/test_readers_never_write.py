"""Reading never creates: a missing namespace is NamespaceNotFound (CLI exit 1), left as it was.

Each test's missing namespace lies under the test's own namespace, so ``raw_zk`` (rooted at
that one) sees whether anything at all was created.
"""

from __future__ import annotations

import json

import pytest

from sentinel import Sentinel
from sentinel.errors import NamespaceNotFound, SentinelError

pytestmark = pytest.mark.integration


@pytest.fixture
def missing(namespace: str) -> str:
    return f"{namespace}/missing"


def _init_command(zookeeper, missing: str) -> str:
    return f"sentinel init --zk {zookeeper.connect_string} --namespace {missing}"


def test_reading_commands_leave_a_missing_namespace_untouched(
    zookeeper, raw_zk, missing, cli, cli_in_process
):
    runs = {
        "resolve": cli_in_process("resolve", "orders-db", "acme", namespace_override=missing),
        "ls": cli_in_process("ls", namespace_override=missing),
        "ls SERVICE": cli_in_process("ls", "orders-db", namespace_override=missing),
        # watch as a process: it installs signal handlers, and must end rather than watch on
        "watch": cli("watch", "--timeout", "5", namespace_override=missing, timeout=30),
        "watch SERVICE": cli("watch", "orders-db", namespace_override=missing, timeout=30),
    }
    for command, result in runs.items():
        # docs/cli.md: "a namespace that does not exist is exit 1 with the `sentinel init`
        # command that creates it"
        assert result.returncode == 1, (command, result.stderr)
        error = result.stderr.strip().splitlines()[-1]
        assert error.startswith("sentinel: error: namespace "), (command, error)
        assert f"namespace {missing} does not exist on ZooKeeper" in error, command
        assert zookeeper.connect_string in error, command
        assert _init_command(zookeeper, missing) in error, command
    assert raw_zk.exists("/missing") is None
    assert raw_zk.get_children("/") == []


def test_a_reading_client_leaves_a_missing_namespace_untouched(
    zookeeper, raw_zk, missing, make_client
):
    reader = make_client("reader", namespace=missing)  # starting it writes nothing either
    assert raw_zk.exists("/missing") is None
    reads = {
        "get_service": lambda: reader.get_service("orders-db"),
        "eligible_instances": lambda: reader.eligible_instances("orders-db"),
        "prefetch": lambda: reader.prefetch("orders-db"),
        "explain": lambda: reader.explain("orders-db"),
        "partition_of": lambda: reader.partition_of("orders-db", "acme"),
        "read_service": lambda: reader.read_service("orders-db"),
    }
    for name, read in reads.items():
        with pytest.raises(NamespaceNotFound) as raised:
            read()
        assert isinstance(raised.value, SentinelError)
        assert (raised.value.namespace, raised.value.hosts) == (missing, zookeeper.connect_string)
        assert _init_command(zookeeper, missing) in str(raised.value), name
    assert raw_zk.exists("/missing") is None
    assert raw_zk.get_children("/") == []

    # Only a writer creates it; the same reader then resolves without being restarted.
    writer = make_client("writer", namespace=missing)
    writer.register("orders-db", "main", "10.0.0.1", 5432, label="a")
    assert sorted(raw_zk.get_children("/missing")) == sorted(
        ["services", "auth", "shard_info", "metrics", "clients"]
    )
    assert reader.get_service("orders-db").label == "a"


def test_init_and_ensure_namespace_create_it(zookeeper, raw_zk, missing, cli_in_process):
    assert cli_in_process("init", namespace_override=missing).returncode == 0
    assert len(raw_zk.get_children("/missing")) == 5
    with Sentinel(zookeeper.connect_string, "admin", f"{missing}-2") as admin:
        with pytest.raises(NamespaceNotFound):
            admin.get_service("x")
        admin.ensure_namespace()
    assert len(raw_zk.get_children("/missing-2")) == 5


def test_a_misspelt_namespace_is_pointed_at_the_one_meant_never_at_creating_it(
    zookeeper, raw_zk, namespace, make_client, cli_in_process
):
    """``ls --namespace /sentinal`` beside ``/sentinel``: "did you mean '/sentinel'?", and no
    ``sentinel init`` (which would create the typo); doctor's fix is the namespace meant. A
    name of its own beside it (``/sentinel-staging``: not a typo) still gets the command that
    creates it."""
    make_client("writer", namespace=f"{namespace}/sentinel").ensure_namespace()
    misspelt = f"{namespace}/sentinal"
    listed = cli_in_process("ls", namespace_override=misspelt)
    assert listed.returncode == 1, listed.stderr
    assert listed.stderr.strip() == (
        f"sentinel: error: namespace {misspelt} does not exist on ZooKeeper "
        f"{zookeeper.connect_string} (reading never creates it); "
        f"did you mean '{namespace}/sentinel'?"
    )
    doctor = cli_in_process("doctor", "--json", namespace_override=misspelt)
    (finding,) = [f for f in json.loads(doctor.stdout) if f["check"] == "namespace"]
    assert finding["fix"] == f"sentinel doctor --namespace {namespace}/sentinel"
    own = f"{namespace}/sentinel-staging"
    assert _init_command(zookeeper, own) in cli_in_process("ls", namespace_override=own).stderr
    assert raw_zk.exists("/sentinal") is None and raw_zk.exists("/sentinel-staging") is None
