"""Attacks on the registries beside the namespace's own sections, on a namespace secured by the
CLI (docs/auth.md, threat model): the collector's cluster, the instances a secured namespace
serves, and the Curator base paths its clients follow (issue 37 items 7 and 8)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.security import Permissions

import sentinel.cache.curator
from sentinel import CacheConfig, Sentinel
from sentinel.agent.server import AgentServer
from sentinel.auth import acl as acls
from sentinel.collector.runner import CONFIG_PROPERTY, member_service
from sentinel.curator import CuratorPublisher, CuratorSource
from sentinel.errors import AccessDenied
from sentinel.registry.layout import DEFAULT_COLLECTOR_CLUSTER, client_path, service_path
from sentinel.testing.helpers import wait_until
from tests.integration import test_attacks
from tests.integration.test_attacks import (
    ANOTHER_CLIENT,
    SERVICE,
    SecuredNamespace,
    enrolled_victim,
    intruders,
    refused,
    secure_with_cli,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]
# The namespaces test_attacks.py makes: secured by the CLI, and open until a test secures it.
secured = test_attacks.secured
upgrade = test_attacks.upgrade


# --- the collector's cluster ------------------------------------------------------------------


def test_only_the_collector_identity_joins_the_collectors_cluster(secured: SecuredNamespace):
    """The publisher identity writes /services, but not the collector's cluster group: a
    member it registered with a forged configuration digest would be the cluster's
    configuration if it outnumbered the real ones, and every real collector would refuse
    work (issue 37: collection stopped for 25 s)."""
    cluster = member_service(DEFAULT_COLLECTOR_CLUSTER)
    publisher = secured.role("publisher")
    with pytest.raises(AccessDenied):
        publisher.register(
            cluster,
            DEFAULT_COLLECTOR_CLUSTER,
            "6.6.6.6",
            1,
            label="forged",
            properties={CONFIG_PROPERTY: "0" * 64},
        )
    raw = secured.kazoo(secured.identities["publisher"])
    assert refused(lambda: raw.create(f"{service_path(cluster)}/default:forged-2", b"{}"))
    for intruder in intruders(secured):
        assert refused(lambda i=intruder: i.create(f"{service_path(cluster)}/default:x", b"{}"))
    # The collector identity still joins.
    collector = secured.role("collector")
    member = collector.register(
        cluster,
        DEFAULT_COLLECTOR_CLUSTER,
        "10.0.0.9",
        1,
        label="c1",
        properties={CONFIG_PROPERTY: "1" * 64},
    )
    assert secured.kazoo().exists(member.path) is not None


# --- instances planted where anyone could write -----------------------------------------------

MALLORY = "mallory:evil"  # the attacker's own digest identity


def pin(zk: KazooClient, path: str, value: bytes) -> None:
    """Create ``path`` persistent, and a child under it, both the attacker's alone (readable
    by all): nobody else may delete the child, so nobody may delete the node."""
    zk.add_auth("digest", MALLORY)
    mine = [acls.owner_acl(MALLORY), acls.WORLD_READ]
    zk.create(path, value, acl=mine, makepath=True)
    zk.create(f"{path}/pin", b"", acl=mine)


def test_a_pinned_planted_instance_is_not_served_after_init_secure(
    upgrade: SecuredNamespace, cli_in_process
):
    """Issue 37: while the namespace was open, an attacker created a persistent
    ``billing-db/p1:evil`` (host 6.6.6.6) with a child under it. ``init --secure`` cannot
    remove it (exit 1, named), and clients gave 6.6.6.6 to half of their lookups. A secured
    namespace serves ephemeral instance nodes only: never again, however the attacker
    rewrites it, and doctor names it."""
    legit = upgrade.sentinel("old-publisher")  # the open era's publisher, anonymous
    legit.register(SERVICE, "p1", "10.0.0.5", 5432, scheme="postgresql", label="real")
    record = json.loads(upgrade.kazoo().get(f"{service_path(SERVICE)}/p1:real")[0])
    evil = f"{service_path(SERVICE)}/p1:evil"
    attacker = upgrade.kazoo()
    pin(attacker, evil, json.dumps({**record, "label": "evil", "host": "6.6.6.6"}).encode())
    code, report = secure_with_cli(upgrade, cli_in_process)
    assert code == 1 and evil in report["unrepaired"], report
    victim = enrolled_victim(upgrade)  # registers 10.0.0.5 as the publisher, then resolves
    assert {e.host for e in victim.cached_instances(SERVICE)} == {"10.0.0.5"}
    assert {victim.get_service(SERVICE).host for _ in range(50)} == {"10.0.0.5"}
    skipped = victim.cache_stats.decode_errors
    assert skipped >= 1
    # The attacker still holds the node and rewrites it: still never served.
    attacker.set(evil, json.dumps({**record, "label": "evil", "host": "6.6.6.7"}).encode())
    assert wait_until(lambda: victim.cache_stats.decode_errors > skipped)
    assert {e.host for e in victim.cached_instances(SERVICE)} == {"10.0.0.5"}
    newcomer = upgrade.app("billing-report")
    assert {e.host for e in newcomer.eligible_instances(SERVICE)} == {"10.0.0.5"}
    findings = json.loads(cli_in_process("doctor", "--json").stdout)
    assert any(evil in f["detail"] and "persistent" in f["detail"] for f in findings), findings


# --- Curator base paths -----------------------------------------------------------------------


def curator_instance(base: str, service: str, node: str, host: str, **fields: object) -> bytes:
    """A Curator ServiceInstance as Java writes it."""
    document = {"name": service, "id": node, "address": host, "port": 8080, **fields}
    return json.dumps(document).encode()


@pytest.fixture
def base() -> str:
    """A Curator base path of the test's own (server-wide, outside the namespace)."""
    return f"/jvm-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def jvm_service(zookeeper, base) -> Iterator[KazooClient]:
    """``orders`` under the base path as Curator makes it without an ACL provider (anyone may
    write there, as Curator's default ACL says), with one live Java instance (ephemeral,
    world-writable as Curator writes it) at 10.0.0.7; the test's session at the server's
    root."""
    zk = KazooClient(zookeeper.connect_string)
    zk.start(timeout=10)
    zk.ensure_path(f"{base}/orders")
    zk.create(
        f"{base}/orders/java-1",
        curator_instance(base, "orders", "java-1", "10.0.0.7"),
        ephemeral=True,
    )
    yield zk
    zk.stop()
    zk.close()


def outsiders(space: SecuredNamespace, anonymous: KazooClient) -> list[KazooClient]:
    """Sessions at the server's root: ``anonymous``, and one with another client's identity."""
    space.enroll("billing-batch", ANOTHER_CLIENT)
    other = KazooClient(space.hosts, **acls.client_arguments(ANOTHER_CLIENT))
    other.start(timeout=10)
    space._closing.append(lambda: (other.stop(), other.close()))
    return [anonymous, other]


def reader(space: SecuredNamespace, base: str, client_id: str = "reader", **kwargs) -> Sentinel:
    """A client of the secured namespace following the Curator base path."""
    return space.sentinel(
        client_id, cache=CacheConfig(curator_base_paths=(base,), persistent_watches=True), **kwargs
    )


def hosts_of(client: Sentinel) -> set[str]:
    return {e.host for e in client.eligible_instances("orders")}


def test_a_planted_persistent_curator_instance_is_not_served_in_a_secured_namespace(
    secured: SecuredNamespace, jvm_service: KazooClient, base: str, make_client, raw_zk
):
    """Anyone may write a base path Curator made: a persistent DYNAMIC instance (Curator
    writes those ephemeral) pinned by a child is planted. A secured namespace's clients do
    not serve it, nor a persistent STATIC one unless the service's spec opts in."""
    attacker = KazooClient(secured.hosts)
    attacker.start(timeout=10)
    try:
        pin(attacker, f"{base}/orders/evil", curator_instance(base, "orders", "evil", "6.6.6.6"))
        static = curator_instance(base, "orders", "static", "10.0.0.8", serviceType="STATIC")
        attacker.create(f"{base}/orders/static", static)  # as Curator writes a STATIC one
        client = reader(secured, base)
        assert hosts_of(client) == {"10.0.0.7"}
        assert {client.get_service("orders").host for _ in range(50)} == {"10.0.0.7"}
        # The attacker's change reaches a live client: still not served.
        attacker.set(f"{base}/orders/evil", curator_instance(base, "orders", "evil", "6.6.6.7"))
        attacker.create(
            f"{base}/orders/evil-2", curator_instance(base, "orders", "evil-2", "6.6.6.8")
        )
        java_2 = curator_instance(base, "orders", "java-2", "10.0.0.9")
        jvm_service.create(f"{base}/orders/java-2", java_2, ephemeral=True)
        assert wait_until(lambda: hosts_of(client) == {"10.0.0.7", "10.0.0.9"})
        # A spec in the namespace may opt in to Curator's STATIC instances: only those.
        publisher = secured.role("publisher", "spec-writer")
        publisher.ensure_service("orders", curator=CuratorSource(base, static_instances=True))
        opted = secured.sentinel("opted", cache=CacheConfig(persistent_watches=True))
        assert {e.host for e in opted.eligible_instances("orders")} == {
            "10.0.0.7",
            "10.0.0.8",
            "10.0.0.9",
        }
    finally:
        attacker.stop()
        attacker.close()


def test_a_python_publishers_instance_cannot_be_redirected(
    secured: SecuredNamespace, jvm_service: KazooClient, base: str, caplog
):
    """Issue 37: an anonymous setData on a live instance redirected it. Published with an
    identity (docs/interop.md: the publisher role's), the node is that identity's: nobody else
    may rewrite it or its ACL (deleting it is the parent's right: where the service node is
    anyone's, as Curator makes it by default, anyone may; docs/interop.md says so). Without
    an identity the publisher says at start that anyone may rewrite its nodes."""
    identity = secured.identities["publisher"]
    with CuratorPublisher(secured.hosts, base, identity=identity) as publisher:
        mine = publisher.register("orders", "10.0.0.5", 8080, instance_id="python-1")
        client = reader(secured, base)
        assert wait_until(lambda: "10.0.0.5" in hosts_of(client))
        redirect = curator_instance(base, "orders", "python-1", "6.6.6.6")
        for intruder in outsiders(secured, jvm_service):
            assert refused(lambda i=intruder: i.set(mine.path, redirect))
            assert refused(lambda i=intruder: i.set_acls(mine.path, acls.OPEN_ACL_UNSAFE))
        assert hosts_of(client) == {"10.0.0.5", "10.0.0.7"}
        assert {a.perms for a in jvm_service.get_acls(mine.path)[0] if a.id.scheme == "world"} == {
            Permissions.READ
        }
    with (
        caplog.at_level(logging.WARNING, logger="sentinel.curator"),
        CuratorPublisher(secured.hosts, base),
    ):
        pass
    said = [r.getMessage() for r in caplog.records]
    assert any("anyone may" in m and "identity=" in m for m in said), said


FLOOD = 600  # persistent junk names that sort before the real ones


def flood(zk: KazooClient, parent: str, count: int = FLOOD, **fields: object) -> list[str]:
    """``count`` junk instances at 6.6.6.6 under ``parent`` in transactions of 300 (fast),
    named to sort first; the paths."""
    paths = [f"{parent}/0-junk-{n:06d}" for n in range(count)]
    for start in range(0, count, 300):
        transaction = zk.transaction()
        for path in paths[start : start + 300]:
            node = path.rsplit("/", 1)[1]
            transaction.create(path, curator_instance("", "orders", node, "6.6.6.6", **fields))
        assert all(isinstance(r, str) for r in transaction.commit())
    return paths


def unflood(zk: KazooClient, paths: list[str]) -> None:
    for start in range(0, len(paths), 300):
        transaction = zk.transaction()
        for path in paths[start : start + 300]:
            transaction.delete(path)
        assert all(r is True for r in transaction.commit())


def test_a_curator_only_service_gets_no_clients_entry_direct_or_through_the_agent(
    secured: SecuredNamespace, jvm_service: KazooClient, base: str, caplog
):
    """A service followed from a Curator base path only (the namespace holds no spec of it)
    has no credentials to rotate, so no ``/clients`` entry. A process with a session of its
    own wrote none; the agent wrote one for each process it fed, which a secured namespace
    refused (``/clients/orders`` may be made by the publisher only): a warning, retried in the
    background for as long as the process stayed. A namespace service's entry is written as
    before (the control: the agent serves a process's requests in order, so once it is there
    the Curator service's announce has been handled)."""
    secured.role("publisher").register(SERVICE, "p1", "10.0.0.5", 5432, scheme="postgresql")
    zk = secured.kazoo()
    caplog.set_level(logging.WARNING)
    direct = reader(secured, base, "direct")
    assert hosts_of(direct) == {"10.0.0.7"}
    direct.prefetch(SERVICE)
    agent_session = reader(secured, base, "host-agent", announce=False, agent=False)
    socket_path = os.path.join(tempfile.mkdtemp(prefix="agent-"), "agent.sock")
    with AgentServer(agent_session, socket_path, send_timeout=2.0):
        fed = secured.sentinel("fed", agent=socket_path)
        assert hosts_of(fed) == {"10.0.0.7"}
        fed.prefetch(SERVICE)
        for client in ("direct", "fed"):
            path = client_path(SERVICE, client)
            assert wait_until(lambda p=path: zk.exists(p) is not None), path
        assert zk.exists("/clients/orders") is None
        refusals = [r.getMessage() for r in caplog.records if "/clients/orders" in r.getMessage()]
        assert refusals == []
        assert direct.cache_stats.clients_write_failures == 0


@pytest.fixture
def bound(monkeypatch) -> int:
    """The bound a Curator follower holds, lowered from 20,000 to 200 (and what it reads to
    choose, from 100,000 to 1,000), so that a flood of 900 exercises the first in seconds
    (a flood past what is read to choose leaves a newcomer to chance until it goes: the
    instances held are read first, the rest in random order)."""
    monkeypatch.setattr(sentinel.cache.curator, "MAX_INSTANCES", 200)
    monkeypatch.setattr(sentinel.cache.curator, "MAX_SCANNED", 1_000)
    return 200


def test_a_flooded_base_path_keeps_serving_the_real_instances(
    secured: SecuredNamespace, jvm_service: KazooClient, base: str, bound: int, tmp_path
):
    """Issue 37: 100,000 anonymous children under a base path made new clients serve the
    first 20,000 names in sorted order (junk at the attacker's address, the real instances
    squeezed out), and the agent could not load the service after the junk was deleted.
    Here the bound is 200 and the flood 600 persistent names that sort first, then 300
    ephemeral ones that do not decode: a live client, a new one and a process fed by the
    host agent serve the real instances only, during the flood and after it goes."""
    parent = f"{base}/orders"
    with CuratorPublisher(secured.hosts, base, identity=secured.identities["publisher"]) as pub:
        pub.register("orders", "10.0.0.5", 8080, instance_id="python-1")
        live = reader(secured, base, "live")
        assert wait_until(lambda: hosts_of(live) == {"10.0.0.5", "10.0.0.7"})
        agent_session = reader(secured, base, "host-agent", announce=False, agent=False)
        socket_path = os.path.join(tempfile.mkdtemp(prefix="agent-"), "agent.sock")
        with AgentServer(agent_session, socket_path, send_timeout=2.0):
            fed = secured.sentinel("fed", agent=socket_path)
            assert hosts_of(fed) == {"10.0.0.5", "10.0.0.7"}
            attacker = KazooClient(secured.hosts)
            attacker.start(timeout=10)
            try:
                junk = flood(attacker, parent)
                junk_ephemeral = [f"{parent}/1-junk-{n:06d}" for n in range(300)]
                transaction = attacker.transaction()
                for path in junk_ephemeral:
                    transaction.create(path, b"not an instance", ephemeral=True)
                assert all(isinstance(r, str) for r in transaction.commit())
                real = {"10.0.0.5", "10.0.0.7"}
                newcomer = reader(secured, base, "newcomer")
                assert hosts_of(newcomer) == real
                assert newcomer.cache_stats.decode_errors >= FLOOD
                assert wait_until(lambda: live.cache_stats.decode_errors >= FLOOD)
                for client in (live, newcomer, fed):
                    assert hosts_of(client) == real
                    assert {client.get_service("orders").host for _ in range(20)} <= real
                # A new Java instance during the flood is served.
                java_2 = curator_instance(base, "orders", "java-2", "10.0.0.9")
                jvm_service.create(f"{parent}/java-2", java_2, ephemeral=True)
                real.add("10.0.0.9")
                for client in (live, newcomer, fed):
                    assert wait_until(lambda c=client: hosts_of(c) == real, timeout=30)
                # The flood goes: everything recovers, and a new process loads at once.
                unflood(attacker, junk)
            finally:
                attacker.stop()
                attacker.close()
            # The ephemeral junk went with the attacker's session.
            assert wait_until(lambda: len(jvm_service.get_children(parent)) == 3)
            started = time.monotonic()
            after = secured.sentinel("after", agent=socket_path)
            assert hosts_of(after) == real
            assert hosts_of(reader(secured, base, "after-direct")) == real
            assert time.monotonic() - started < 10
            for client in (live, newcomer, fed):
                assert wait_until(lambda c=client: hosts_of(c) == real, timeout=30)
            for client in (live, newcomer):  # no junk held either
                assert wait_until(lambda c=client: not c.session.cache.snapshots["orders"].invalid)
