"""What a client keeps of what it no longer needs (issue 53): of a service it no longer
follows, nothing that grows with every service it ever followed and nothing it writes again
after a session expiry; of a region no rule names any more, no session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sentinel import Sentinel, telemetry
from sentinel.auth import ClientKeyring
from sentinel.auth.config import AuthConfig
from sentinel.regions import Failover, Region, Regions, remotes
from sentinel.registry.layout import client_path
from sentinel.registry.retire import retire_service
from sentinel.testing.helpers import expire_session, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper

pytestmark = pytest.mark.integration


def test_a_retired_service_leaves_no_clients_entry_behind_not_even_after_an_expiry(
    make_client, raw_zk
):
    writer = make_client("writer")
    gone = writer.register("gone", "p0", "10.0.0.1", 80, label="a")
    writer.register("kept", "p0", "10.0.0.2", 80, label="b")
    reader = make_client("reader")
    reader.get_service("gone")
    reader.get_service("kept")
    assert raw_zk.exists(client_path("gone", "reader"))

    writer.deregister(gone)
    retire_service(raw_zk, "gone", force=True)  # its /clients entries go with it
    nodes = reader.session.nodes
    assert wait_until(lambda: "gone" not in reader.session.cache.snapshots) is not None
    assert wait_until(lambda: nodes.kept(client_path("gone", "reader")) is None) is not None, (
        "the reader still keeps its entry of the retired service"
    )

    expire_session(reader)  # the new session writes again what the reader keeps
    assert wait_until(lambda: raw_zk.exists(client_path("kept", "reader")), 20) is not None
    assert raw_zk.exists("/clients/gone") is None
    assert nodes.kept(client_path("kept", "reader")) is not None


def test_a_service_retired_and_created_again_is_registered_to_as_it_is_now(make_client, raw_zk):
    """A client keeps a service's spec while it holds a registration of it, and no longer:
    kept for every service it ever registered to, it grew with them, and a service retired
    and created again with another scheme was registered to with the old one."""
    writer = make_client("writer")
    first = writer.register("reborn", "p0", "10.0.0.1", 80, label="a")
    assert first.instance.scheme == "http"
    writer.deregister(first)
    assert "reborn" not in writer.session.publisher._targets
    retire_service(raw_zk, "reborn", force=True)

    make_client("admin").ensure_service("reborn", scheme="postgresql")
    again = writer.register("reborn", "p0", "10.0.0.1", 5432, label="a")
    assert again.instance.scheme == "postgresql"
    assert writer.read_service("reborn").instances[0].scheme == "postgresql"


def test_a_retired_services_credential_is_not_kept_decrypted(make_client, raw_zk):
    """A client kept the decrypted credential (and its version's series) of every service it
    was ever given one for, retired or not; it keeps the version's floor only (a replay of an
    older credential is still refused, sentinel.auth.reader)."""
    writer = make_client("writer")
    writer.register("vault", "p0", "10.0.0.1", 5432, label="a")
    reader = make_client("reader", auth=AuthConfig(keys=ClientKeyring.generate()))
    reader.get_service("vault")
    writer.credentials.publish("vault", "reader", {"user": "r", "password": "s3cret"})
    assert wait_until(lambda: reader.get_service("vault").auth is not None) is not None
    credentials = reader.session._credentials
    assert "vault" in credentials._applied
    assert wait_until(lambda: ("vault",) in _series(telemetry.AUTH_VERSION)) is not None

    writer.deregister(writer.registrations[0])
    retire_service(raw_zk, "vault", force=True)
    assert wait_until(lambda: "vault" not in reader.session.cache.snapshots) is not None
    assert "vault" not in credentials._applied and "vault" not in credentials._opened
    assert ("vault",) not in _series(telemetry.AUTH_VERSION)
    assert credentials.highest_versions() == {"vault": 1}


def _series(metric) -> set[tuple[str, ...]]:
    """The label sets ``metric`` exports now."""
    return {tuple(s.labels.values()) for family in metric.collect() for s in family.samples}


@pytest.fixture(scope="module")
def west() -> Iterator[LocalZooKeeper]:
    with LocalZooKeeper() as zk:
        yield zk


def test_a_region_no_rule_names_any_more_is_closed_and_opened_again_when_one_does(
    zookeeper, west, namespace, monkeypatch
):
    monkeypatch.setattr(remotes, "RTT_INTERVAL", 0.05)
    monkeypatch.setattr(remotes, "CLOSE_AFTER", 0.5)
    regions = Regions(
        "east",
        [
            Region("east", zookeeper.connect_string, namespace=namespace),
            Region("west", west.connect_string, namespace=namespace),
        ],
    )
    options = {"namespace": namespace, "prometheus_registry": None}
    rule = Failover(regions=("west",))

    with (
        Sentinel(zookeeper.connect_string, "pub-east", regions=regions, **options) as east,
        Sentinel(west.connect_string, "pub-west", regions=False, **options) as elsewhere,
        Sentinel(zookeeper.connect_string, "reader", regions=regions, **options) as reader,
    ):
        elsewhere.register("api", "p0", "10.0.2.1", 80, label="w")
        east.ensure_service("api", failover=rule)  # nothing in east: lookups go west
        assert reader.get_service("api").host == "10.0.2.1"
        others = reader.regions_router.remotes
        remote = others.by_name["west"]
        opened = remote.client
        assert opened is not None and others._prober is not None

        east.set_failover("api", None)
        assert wait_until(lambda: remote.client is None, 10) is not None, (
            "west stays open with no rule naming it"
        )
        # closed just after it is let go of
        assert wait_until(lambda: not opened.session.zk.connected, 10) is not None
        assert wait_until(lambda: others._prober is None, 5) is not None  # the prober ended

        east.set_failover("api", rule)
        assert (
            wait_until(
                lambda: reader.get_service("api").host == "10.0.2.1", 10, ignore=(Exception,)
            )
            is not None
        )
        assert remote.client is not None and remote.client is not opened
        assert others._prober is not None
