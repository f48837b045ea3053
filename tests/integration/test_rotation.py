"""Taking one instance out of rotation and back: ``sentinel drain``/``undrain`` and the API."""

from __future__ import annotations

import json

import pytest
from kazoo.exceptions import NoNodeError

from sentinel.errors import NoInstanceAvailable
from sentinel.registry.records import InstanceRecord
from sentinel.testing.helpers import expire_session, wait_until

pytestmark = pytest.mark.integration


def _labels(client, service="api"):
    return {e.label for e in client.eligible_instances(service)}


def _status(raw_zk, name="main:b"):
    data, stat = raw_zk.get(f"/services/api/{name}")
    return InstanceRecord.from_bytes("api", name, f"/services/api/{name}", data).status, stat


def test_drain_and_undrain_from_the_cli_survive_the_owners_updates_and_expiry(
    make_client, raw_zk, cli_in_process
):
    publisher, reader = make_client("publisher"), make_client("reader")
    publisher.register("api", "main", "10.0.0.1", 80, label="a")
    b = publisher.register("api", "main", "10.0.0.2", 80, label="b")
    assert _labels(reader) == {"a", "b"}

    drained = cli_in_process("drain", "api", "main:b", "--json")
    assert drained.returncode == 0, drained.stderr
    assert json.loads(drained.stdout) == {
        "service": "api",
        "instance": "main:b",
        "old": "up",
        "new": "draining",
    }
    assert wait_until(lambda: _labels(reader) == {"a"})
    assert {e.label: e.status for e in reader.cached_instances("api")}["b"] == "draining"

    # The owner adopts the operator's status: the node it re-creates after its session
    # expired is still out of rotation...
    assert wait_until(lambda: publisher.session.publisher.current(b).instance.status == "draining")
    old_session = expire_session(publisher)
    assert wait_until(
        lambda: _status(raw_zk)[1].ephemeralOwner != old_session, ignore=(NoNodeError,)
    )
    assert _status(raw_zk)[0] == "draining"
    # Both nodes went with the old session: the reader has a again once a's node is re-created
    # too (until then it has no live instance).
    assert wait_until(lambda: _labels(reader) == {"a"}, ignore=(NoInstanceAvailable,))
    # ...and so is its own update, made from the Registration it holds (which says "up").
    updated = publisher.update_registration(b, weight=2)
    assert (updated.instance.status, updated.instance.weight) == ("draining", 2)
    assert _status(raw_zk)[0] == "draining"
    assert wait_until(lambda: {e.label: e.weight for e in reader.cached_instances("api")}["b"] == 2)
    assert _labels(reader) == {"a"}

    # The label alone names it when one partition holds it; undrain puts it back.
    undrained = cli_in_process("undrain", "api", "b")
    assert undrained.returncode == 0, undrained.stderr
    assert "draining -> up" in undrained.stdout and "sentinel drain api main:b" in undrained.stdout
    assert wait_until(lambda: _labels(reader) == {"a", "b"})
    again = cli_in_process("undrain", "api", "main:b")
    assert again.returncode == 0 and "is up already" in again.stdout


def test_the_api_takes_its_own_instance_out_of_rotation_and_back(make_client):
    publisher, reader = make_client("publisher"), make_client("reader")
    publisher.register("api", "main", "10.0.0.1", 80, label="a")
    b = publisher.register("api", "main", "10.0.0.2", 80, label="b")
    assert _labels(reader) == {"a", "b"}
    b = publisher.update_registration(b, status="draining")
    assert wait_until(lambda: _labels(reader) == {"a"})
    publisher.update_registration(b, status="up")
    assert wait_until(lambda: _labels(reader) == {"a", "b"})


def test_drain_of_an_instance_that_is_not_there_is_exit_1(make_client, cli_in_process):
    publisher = make_client("publisher")
    publisher.register("api", "main", "10.0.0.1", 80, label="a")
    publisher.register("api", "other", "10.0.0.2", 80, label="a")
    missing = cli_in_process("drain", "api", "main:zzz")
    assert missing.returncode == 1 and "no live instance main:zzz" in missing.stderr
    unknown = cli_in_process("drain", "nothing", "a")
    assert unknown.returncode == 1 and "'nothing' is not registered" in unknown.stderr
    ambiguous = cli_in_process("drain", "api", "a")
    assert ambiguous.returncode == 2 and "give PARTITION:LABEL" in ambiguous.stderr
