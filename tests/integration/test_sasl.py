"""SASL DIGEST-MD5 identities (``sasl:user:password``) against a server with JAAS users.

One server for the module, with two SASL users, its plain port and a TLS port.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from kazoo.protocol.states import KazooState
from kazoo.security import ACL, Id

from sentinel import Sentinel
from sentinel.errors import AccessDenied, AuthenticationFailed
from sentinel.testing.zookeeper import LocalZooKeeper

pytestmark = pytest.mark.integration

ALICE_PW = "al1ce-s3cret"
BOB_PW = "b0b-s3cret"


@pytest.fixture(scope="module")
def sasl_zk() -> Iterator[LocalZooKeeper]:
    with LocalZooKeeper(tls=True, sasl_users={"alice": ALICE_PW, "bob": BOB_PW}) as zk:
        yield zk


@pytest.fixture
def connect(sasl_zk: LocalZooKeeper) -> Iterator:
    namespace = f"/sasl-{uuid.uuid4().hex[:12]}"
    clients: list[Sentinel] = []

    def make(identity: str, *, tls: bool = False, **kwargs: object) -> Sentinel:
        hosts = sasl_zk.secure_connect_string if tls else sasl_zk.connect_string
        client = Sentinel(
            hosts,
            f"c{len(clients)}",
            namespace,
            identity=identity,
            tls=sasl_zk.tls_client_config if tls else None,
            prometheus_registry=None,
            connect_timeout=5.0,
            **kwargs,
        )
        clients.append(client)
        return client.start()

    yield make
    for client in clients:
        client.close()


def test_nodes_of_a_sasl_identity_are_writable_by_that_user_alone(connect):
    alice = connect(f"sasl:alice:{ALICE_PW}")
    alice.ensure_service("api", scheme="http")
    acl, _ = alice.session.zk.get_acls("/services/api")
    assert ACL(31, Id("sasl", "alice")) in acl
    assert all(entry.id.scheme != "digest" for entry in acl)
    bob = connect(f"sasl:bob:{BOB_PW}", announce=False)  # /clients is alice's here too
    with pytest.raises(AccessDenied):
        bob.register("api", "main", "10.0.0.9", 80)
    alice.register("api", "main", "10.0.0.9", 80)
    assert bob.get_service("api").host == "10.0.0.9"


def test_a_wrong_password_is_refused_at_once_and_typed(connect):
    started = time.monotonic()
    with pytest.raises(AuthenticationFailed, match="SASL login failed") as raised:
        connect("sasl:alice:not-her-password")  # connect_timeout=5.0
    took = time.monotonic() - started
    # At once: on the server's answer, not after retrying until the 5 s connect timeout
    # (measured 0.05-0.13 s).
    assert took < 1.0, took
    assert "not-her-password" not in str(raised.value)


def test_a_refusal_heard_before_start_waits_is_still_refused_at_once(sasl_zk, monkeypatch):
    # kazoo reports CONNECTED before its SASL login, and the refusal then ends the connection
    # (CLOSED): a caller descheduled until after that (a loaded machine) found no connection
    # and waited out connect_timeout, then said no server answered. Made certain here: the
    # client's start_async() returns only once the refusal has been heard.
    client = Sentinel(
        sasl_zk.connect_string,
        "late",
        f"/sasl-{uuid.uuid4().hex[:12]}",
        identity="sasl:alice:not-her-password",
        prometheus_registry=None,
        connect_timeout=5.0,
    )
    zk = client.session.zk
    start_async = zk.start_async
    resumed = []

    def start_async_then_stall() -> threading.Event:
        lost = threading.Event()
        zk.add_listener(lambda state: state == KazooState.LOST and lost.set())
        live = start_async()
        assert lost.wait(60), "the login was never refused"
        resumed.append(time.monotonic())
        return live

    monkeypatch.setattr(zk, "start_async", start_async_then_stall)
    try:
        with pytest.raises(AuthenticationFailed, match="SASL login failed"):
            client.start()
        took = time.monotonic() - resumed[0]
        assert took < 1.0, took  # on what was heard, not after the 5 s connect timeout
    finally:
        client.close()


def test_sasl_over_tls_and_no_password_or_token_in_kazoos_logs(connect, caplog):
    caplog.set_level(1, logger="kazoo")
    alice = connect(f"sasl:alice:{ALICE_PW}", tls=True)
    alice.ensure_service("api", scheme="http")
    assert any("SASL(challenge=***)" in r.getMessage() for r in caplog.records)
    assert ALICE_PW not in caplog.text
    assert "response=" not in caplog.text  # the DIGEST-MD5 answer is derived from the password
