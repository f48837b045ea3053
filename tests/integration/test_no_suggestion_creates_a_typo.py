"""A name that does not exist but is a typo of one that does (a shard policy, a client with
keys): every error points at the one that exists ("did you mean 'tenants'?") and none
suggests creating the typo (issue 51).

The namespace of the test holds ``tenants``; ``orders`` is sharded by ``tenents`` (its spec
written while such a policy existed, which was deleted since, as a spec naming a policy
written by another program can be).
"""

from __future__ import annotations

import json

import pytest

from sentinel.auth.config import AuthConfig
from sentinel.auth.keys import ClientKeyring
from sentinel.errors import ClientKeyNotFound, PartitionNotFound

pytestmark = pytest.mark.integration


@pytest.fixture
def typo(make_client, raw_zk) -> None:
    publisher = make_client("publisher")
    publisher.shard_maps.ensure("tenants", "directory", partitions=["p1"])
    publisher.shard_maps.assign("tenants", "acme", "p1")
    publisher.ensure_service("billing", shard_policy="tenants")
    publisher.register("billing", "p1", "10.0.0.1", 80)
    publisher.shard_maps.ensure("tenents", "directory", partitions=["p1"])
    publisher.ensure_service("orders", shard_policy="tenents")
    publisher.register("orders", "p1", "10.0.0.2", 80)
    raw_zk.delete("/shard_info/tenents", recursive=True)


def test_a_lookup_names_the_policy_meant_not_the_command_creating_the_typo(typo, make_client):
    reader = make_client("reader")
    assert reader.get_service("billing", "acme").host == "10.0.0.1"  # it follows tenants
    with pytest.raises(PartitionNotFound) as raised:
        reader.get_service("orders", "acme")
    assert str(raised.value).endswith(
        "(shard policy 'tenents' does not exist; did you mean 'tenants'?)"
    )
    assert "create-policy" not in str(raised.value)


def test_the_cli_and_doctor_name_the_policy_meant(typo, cli_in_process):
    shown = cli_in_process("shard", "show", "acme", "--policy", "tenents")
    assert shown.returncode == 1, shown.stderr
    assert shown.stderr.strip().endswith(
        "shard policy 'tenents' does not exist; did you mean 'tenants'?"
    )
    doctor = cli_in_process("doctor", "--json")
    (finding,) = [f for f in json.loads(doctor.stdout) if f["check"] == "shard policy"]
    assert finding["detail"] == (
        "orders is sharded by 'tenents', which does not exist; did you mean 'tenants'?"
    )
    assert finding["fix"] == ""  # not "create it": that would keep the typo


def test_a_credential_for_a_misspelt_client_names_the_client_meant(make_client):
    """Publishing a credential for ``keyed-ap`` when ``keyed-app`` has keys: "did you mean",
    not "run sentinel auth keygen --publish" (which would give the typo keys of its own); a
    client of its own name that has none still gets that advice."""
    make_client("keyed-app", auth=AuthConfig(keys=ClientKeyring.generate()))
    manager = make_client("manager")
    with pytest.raises(ClientKeyNotFound) as typo:
        manager.credentials.publish("orders", "keyed-ap", {"user": "u", "password": "p"})
    assert str(typo.value).endswith("; did you mean 'keyed-app'?")
    assert "keygen" not in str(typo.value)
    with pytest.raises(ClientKeyNotFound, match="keygen --publish"):
        manager.credentials.publish("orders", "reporting", {"user": "u", "password": "p"})
