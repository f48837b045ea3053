"""Hosts and labels against a real ZooKeeper: a bad host writes nothing, registrations that
used to share a label now each get their own, and a label another live instance holds is
refused while the same instance restarting still replaces its stale node."""

from __future__ import annotations

import json
import logging

import pytest

from sentinel.errors import LabelTaken, RegistryConflict, ValidationError
from sentinel.registry.layout import sanitize_name
from sentinel.testing.helpers import TcpProxy, expire_session, wait_until

pytestmark = pytest.mark.integration

LONG = "x" * 63 + "." + "y" * 63  # 127 characters


@pytest.mark.parametrize("host", ["..", "::::", "%", "[", "under_score.example"])
def test_a_bad_host_is_refused_before_anything_is_written(make_client, raw_zk, host):
    client = make_client()
    client.ensure_service("api")
    with pytest.raises(ValidationError, match="must be an IPv4 or IPv6 address or a DNS name"):
        client.register("api", "p1", host, 80)
    with pytest.raises(ValidationError):
        client.register("api", "p1", host, 80, label="explicit")
    assert raw_zk.get_children("/services/api") == []


def test_registrations_that_used_to_share_a_default_label_both_exist(make_client, raw_zk):
    first_host, second_host = LONG + ".a", LONG + ".b"
    # What the label used to be: both truncated to the same 128 characters.
    assert sanitize_name(f"{first_host}_80") == sanitize_name(f"{second_host}_80")
    first = make_client("one").register("api", "p1", first_host, 80)
    second = make_client("two").register("api", "p1", second_host, 80)
    assert first.label != second.label
    hosts = {
        json.loads(raw_zk.get(f"/services/api/{name}")[0])["host"]
        for name in raw_zk.get_children("/services/api")
    }
    assert hosts == {first_host, second_host}


def test_ipv6_hosts_get_their_own_labels(make_client, raw_zk):
    client = make_client()
    for host in ("fe80::1", "fe80::1%eth0", "fe80--1.example"):
        client.register("api", "p1", host, 80)
    assert sorted(raw_zk.get_children("/services/api")) == [
        "p1:_6_fe80--1_80",
        "p1:_6_fe80--1_eth0_80",
        "p1:fe80--1.example_80",
    ]


def test_a_label_held_by_another_endpoint_is_refused_and_left_alone(make_client, raw_zk):
    holder = make_client("holder")
    held = holder.register("api", "p1", "10.0.0.1", 80, label="primary")
    intruder = make_client("intruder")
    with pytest.raises(LabelTaken, match=r"held by another instance \(10.0.0.1 port 80\)"):
        intruder.register("api", "p1", "10.0.0.2", 80, label="primary")
    with pytest.raises(LabelTaken):
        intruder.register("api", "p1", "10.0.0.1", 81, label="primary")
    assert issubclass(LabelTaken, RegistryConflict)
    data, stat = raw_zk.get(held.path)
    assert stat.ephemeralOwner == holder.session_id
    assert json.loads(data)["host"] == "10.0.0.1"
    assert intruder.registrations == ()
    # Another partition is another label space.
    intruder.register("api", "p2", "10.0.0.2", 80, label="primary")


@pytest.mark.parametrize("spelling", ["10.0.0.9", "::1", "[::1]", "0:0::1", "DB-1.example"])
def test_the_same_endpoint_restarted_replaces_its_stale_node(make_client, raw_zk, spelling):
    """A restarted process registers again while its old session's node is still there: the
    same host and port (spelt either way) take it over, for an explicit and a default label."""
    canonical = {"::1": "::1", "[::1]": "::1", "0:0::1": "::1", "DB-1.example": "db-1.example"}
    old = make_client("old")
    explicit = old.register("api", "p1", canonical.get(spelling, spelling), 80, label="a")
    default = old.register("api", "p1", canonical.get(spelling, spelling), 80)
    new = make_client("new")
    for before in (explicit, default):
        label = before.label if before is explicit else None
        again = new.register("api", "p1", spelling, 80, label=label)
        assert again.path == before.path
        data, stat = raw_zk.get(again.path)
        assert stat.ephemeralOwner == new.session_id != old.session_id
        assert json.loads(data)["host"] == spelling


@pytest.fixture
def link(zookeeper):
    """A relay to ZooKeeper that can be cut; closed after the clients (set up before them)."""
    proxy = TcpProxy("127.0.0.1", zookeeper.members[0].client_port)
    yield proxy
    proxy.close()


def test_a_restore_meeting_another_endpoint_skips_that_node_and_restores_the_rest(
    link, make_client, raw_zk, zookeeper, caplog
):
    """After a session expiry the client re-creates its nodes; when another instance took one
    of its labels meanwhile, that one is logged and left to it, and the others come back."""
    client = make_client("expired", hosts=link.address)
    mine = client.register("api", "p1", "10.0.0.1", 80, label="a")
    other = client.register("api", "p1", "10.0.0.1", 81, label="b")
    rival = make_client("rival")
    with caplog.at_level(logging.ERROR, logger="sentinel.zk.ephemeral"):
        # The client cut off, its session expired meanwhile (its nodes go with it), and
        # a rival registers label "a" before the client can reconnect.
        link.cut()
        old_session = expire_session(client, hosts=zookeeper.connect_string)
        assert raw_zk.exists(mine.path) is None and raw_zk.exists(other.path) is None
        rival.register("api", "p1", "10.0.0.2", 80, label="a")
        link.restore()
        assert wait_until(lambda: raw_zk.exists(other.path) is not None, 20)
    new_session = raw_zk.exists(other.path).ephemeralOwner
    assert new_session == client.session_id != old_session
    assert "not re-creating /services/api/p1:a" in caplog.text and "10.0.0.2" in caplog.text
    data, stat = raw_zk.get(mine.path)
    assert (json.loads(data)["host"], stat.ephemeralOwner) == ("10.0.0.2", rival.session_id)
