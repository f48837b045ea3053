"""TLS to ZooKeeper: a server whose plain port is closed, reached by every kind of client.

One TLS-only server (``ssl.clientAuth=need``) serves the whole module; each test works in a
namespace of its own on it.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest
from kazoo.exceptions import KazooException

from sentinel import Sentinel
from sentinel.errors import (
    TlsConfigError,
    TlsHandshakeFailed,
    ZooKeeperUnavailable,
)
from sentinel.integrations import spark
from sentinel.integrations.spark import ClientConfig, get_client
from sentinel.testing.helpers import expire_session, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper, server_mode
from sentinel.zk.tls import CA_ENV, CERT_ENV, KEY_ENV, TlsConfig
from tests.conftest import sentinel_in_process

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_zk() -> Iterator[LocalZooKeeper]:
    """A standalone ZooKeeper that speaks TLS only (its plain port is closed)."""
    with LocalZooKeeper(tls=True, plaintext=False) as zk:
        yield zk


@pytest.fixture
def tls_namespace() -> str:
    return f"/tls-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def tls_client(tls_zk: LocalZooKeeper, tls_namespace: str) -> Iterator[Callable[..., Sentinel]]:
    """Start Sentinel clients over TLS on the module's server; close them after the test."""
    clients: list[Sentinel] = []

    def make(client_id: str = "tls-client", **kwargs: object) -> Sentinel:
        kwargs.setdefault("tls", tls_zk.tls_client_config)
        kwargs.setdefault("connect_timeout", 10.0)
        client = Sentinel(
            tls_zk.secure_connect_string,
            client_id,
            tls_namespace,
            prometheus_registry=None,
            **kwargs,
        )
        clients.append(client.start())
        return client

    yield make
    for client in clients:
        client.close()


def _cli(
    zk: LocalZooKeeper, namespace: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``sentinel ARGS`` in this process, with only ``env``'s TLS variables set."""
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if name.startswith("SENTINEL_ZK_TLS")]:
            patch.delenv(name)
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        return sentinel_in_process(
            *args, "--zk", zk.secure_connect_string, "--namespace", namespace
        )


def _tls_env(config: TlsConfig) -> dict[str, str]:
    assert config.ca and config.certfile and config.keyfile
    return {CA_ENV: config.ca, CERT_ENV: config.certfile, KEY_ENV: config.keyfile}


def test_the_plain_port_is_closed_and_the_tls_port_answers_only_tls(tls_zk):
    assert tls_zk.members[0].client_port is None
    assert tls_zk.leader().mode() == "standalone"  # srvr over TLS
    host, port = tls_zk.secure_connect_string.split(":")
    assert server_mode(host, int(port), timeout=0.5) is None  # in clear: no answer


def test_a_publisher_and_a_client_resolve_over_tls(tls_client):
    publisher = tls_client("publisher")
    publisher.ensure_service("orders-db", scheme="postgresql")
    publisher.register("orders-db", "main", "10.0.0.5", 5432, scheme="postgresql", label="a")
    reader = tls_client("reader")
    assert reader.get_service("orders-db").uri == "postgresql://10.0.0.5:5432"
    publisher.register("orders-db", "main", "10.0.0.6", 5432, scheme="postgresql", label="b")
    assert wait_until(lambda: len(reader.eligible_instances("orders-db")) == 2) is not None
    # An SSL socket is never written by a caller's thread while the connection thread reads
    # it: over TLS every request goes through kazoo's queue.
    assert publisher.session.zk.connected and not publisher.session.zk._connection._direct


def test_an_expired_session_reconnects_over_tls_and_registers_again(tls_client):
    publisher = tls_client("publisher")
    registration = publisher.register("api", "main", "10.0.0.8", 80, scheme="http")
    old_session = expire_session(publisher)  # the intruder joins the session over TLS too

    def registered_again() -> bool:
        node = publisher.session.zk.exists(registration.path)
        return node is not None and node.ephemeralOwner == publisher.session_id != old_session

    assert wait_until(registered_again, timeout=20, ignore=(KazooException,)) is not None


def test_the_cli_lists_and_resolves_with_zk_tls_and_the_environment(tls_zk, tls_client):
    publisher = tls_client("publisher")
    publisher.register("api", "main", "10.0.0.7", 80, scheme="http")
    namespace = publisher.namespace
    env = _tls_env(tls_zk.tls_client_config)
    listed = _cli(tls_zk, namespace, "ls", "--zk-tls", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "api" in listed.stdout
    resolved = _cli(tls_zk, namespace, "resolve", "api", "--zk-tls", env=env)
    assert resolved.returncode == 0, resolved.stderr
    assert "http://10.0.0.7:80" in resolved.stdout


def test_the_cli_takes_the_tls_files_as_options(tls_zk, tls_client):
    publisher = tls_client("publisher")
    publisher.ensure_namespace()  # starting writes nothing; ls needs the namespace to exist
    namespace = publisher.namespace
    config = tls_zk.tls_client_config
    listed = _cli(
        tls_zk,
        namespace,
        "ls",
        "--zk-tls-ca",
        str(config.ca),
        "--zk-tls-cert",
        str(config.certfile),
        "--zk-tls-key",
        str(config.keyfile),
    )
    assert listed.returncode == 0, listed.stderr


def test_a_client_without_the_ca_fails_with_a_tls_error(tls_zk, tls_namespace):
    config = dataclasses.replace(tls_zk.tls_client_config, ca=None)  # the system's CAs only
    client = Sentinel(
        tls_zk.secure_connect_string, "no-ca", tls_namespace, tls=config, connect_timeout=1.0
    )
    with pytest.raises(TlsHandshakeFailed, match=r"TLS handshake failed.*CERTIFICATE_VERIFY"):
        client.start()


def test_a_client_without_a_certificate_is_refused_when_the_server_needs_one(tls_zk, tls_namespace):
    config = TlsConfig(ca=tls_zk.tls_client_config.ca)
    client = Sentinel(
        tls_zk.secure_connect_string, "no-cert", tls_namespace, tls=config, connect_timeout=1.0
    )
    with pytest.raises(TlsHandshakeFailed, match="TLS handshake failed"):
        client.start()


def test_a_plain_client_on_the_tls_port_is_unavailable(tls_zk, tls_namespace):
    client = Sentinel(tls_zk.secure_connect_string, "plain", tls_namespace, connect_timeout=1.0)
    with pytest.raises(ZooKeeperUnavailable):
        client.start()


def test_the_cli_without_the_ca_exits_3_naming_tls(tls_zk, tls_client):
    namespace = tls_client("publisher").namespace
    env = _tls_env(tls_zk.tls_client_config)
    del env[CA_ENV]
    listed = _cli(tls_zk, namespace, "ls", "--zk-tls", "--timeout", "1", env=env)
    assert listed.returncode == 3
    assert "TLS handshake failed" in listed.stderr
    resolved = _cli(tls_zk, namespace, "resolve", "api", "--zk-tls", "--timeout", "1", env=env)
    assert resolved.returncode == 3
    assert "TLS handshake failed" in resolved.stderr


def test_an_unreadable_tls_file_is_a_usage_error_naming_the_file(tls_zk, tls_namespace, tmp_path):
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(TlsConfigError, match=r"nowhere\.pem"):
        Sentinel(tls_zk.secure_connect_string, "x", tls_namespace, tls=TlsConfig(ca=str(missing)))
    listed = _cli(tls_zk, tls_namespace, "ls", "--zk-tls-ca", str(missing))
    assert listed.returncode == 2
    assert "nowhere.pem" in listed.stderr


def test_spark_workers_connect_over_tls_from_plain_values(tls_zk, tls_client, monkeypatch):
    monkeypatch.setattr(spark, "_clients", {})
    namespace = tls_client("publisher").namespace
    config = ClientConfig(
        hosts=tls_zk.secure_connect_string,
        namespace=namespace,
        client_id="etl",
        tls=tls_zk.tls_client_config,
    )
    client = get_client(config)
    try:
        assert get_client(config) is client
        assert client.tls == tls_zk.tls_client_config
        assert client.session_id is not None
    finally:
        client.close()
