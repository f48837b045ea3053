"""TLS settings: TlsConfig, the environment, the CLI's options and the errors (no server)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from sentinel.cli import build_parser
from sentinel.cli.common import tls_config
from sentinel.connection import client_arguments, unavailable
from sentinel.errors import TlsConfigError, TlsHandshakeFailed, ZooKeeperUnavailable
from sentinel.testing.zookeeper import LocalZooKeeper
from sentinel.zk.certificates import make_local_pki
from sentinel.zk.tls import CA_ENV, CERT_ENV, KEY_ENV, TlsConfig

ENV = {CA_ENV: "/etc/zk/ca.pem", CERT_ENV: "/etc/zk/me.pem", KEY_ENV: "/etc/zk/me.key"}


def test_from_env_reads_the_three_variables_and_overrides_win():
    assert TlsConfig.from_env(ENV) == TlsConfig(
        "/etc/zk/ca.pem", "/etc/zk/me.pem", "/etc/zk/me.key"
    )
    assert TlsConfig.from_env(ENV, ca="/other.pem", certfile=None).ca == "/other.pem"
    assert TlsConfig.from_env({}) == TlsConfig()


def test_resolve_accepts_a_config_true_or_nothing(monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    assert TlsConfig.resolve(True) == TlsConfig.from_env(ENV)
    assert TlsConfig.resolve(None) is None and TlsConfig.resolve(False) is None
    config = TlsConfig(ca="/ca.pem")
    assert TlsConfig.resolve(config) is config
    with pytest.raises(TlsConfigError):
        TlsConfig.resolve("yes")  # type: ignore[arg-type]


def test_a_certificate_needs_its_key():
    with pytest.raises(TlsConfigError, match=KEY_ENV):
        TlsConfig(ca="/ca.pem", certfile="/me.pem")


def test_it_is_plain_values_that_pickle_and_hash():
    config = TlsConfig.from_env(ENV)
    assert pickle.loads(pickle.dumps(config)) == config
    assert {config: 1}[TlsConfig.from_env(ENV)] == 1


def test_files_that_do_not_load_are_named_in_the_error(tmp_path):
    with pytest.raises(TlsConfigError, match=r"CA file '.*missing\.pem'"):
        TlsConfig(ca=str(tmp_path / "missing.pem")).ssl_context()
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(TlsConfigError, match=r"client certificate '.*junk\.pem'"):
        TlsConfig(
            certfile=str(tmp_path / "junk.pem"), keyfile=str(tmp_path / "junk.pem")
        ).ssl_context()


def test_connection_arguments_carry_tls_and_identity(tmp_path, monkeypatch):
    monkeypatch.delenv("SENTINEL_ZK_IDENTITY", raising=False)
    config = make_local_pki(tmp_path).client_config()
    arguments = client_arguments("user:pw", config)
    assert arguments["use_ssl"] is True and arguments["verify_certs"] is True
    assert arguments["check_hostname"] is True
    assert (arguments["ca"], arguments["certfile"], arguments["keyfile"]) == (
        config.ca,
        config.certfile,
        config.keyfile,
    )
    assert arguments["auth_data"] == [("digest", "user:pw")]
    assert "use_ssl" not in client_arguments()


def test_unavailable_names_tls_when_the_handshake_failed():
    plain = unavailable("zk:2281", 2.0, SimpleNamespace(tls_failure=None))
    assert type(plain) is ZooKeeperUnavailable
    assert str(plain) == "no ZooKeeper server at zk:2281 answered within 2s"
    failed = unavailable("zk:2281", 2.0, SimpleNamespace(tls_failure="CERTIFICATE_VERIFY_FAILED"))
    assert isinstance(failed, TlsHandshakeFailed) and isinstance(failed, ZooKeeperUnavailable)
    assert "TLS handshake failed (CERTIFICATE_VERIFY_FAILED)" in str(failed)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], None),
        (["--zk-tls"], TlsConfig.from_env(ENV)),
        (["--zk-tls-ca", "/x.pem"], TlsConfig("/x.pem", ENV[CERT_ENV], ENV[KEY_ENV])),
        (
            ["--zk-tls-cert", "/c.pem", "--zk-tls-key", "/k.pem"],
            TlsConfig(ENV[CA_ENV], "/c.pem", "/k.pem"),
        ),
    ],
)
def test_the_cli_options_and_the_environment(argv, expected, monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["ls", *argv])
    assert tls_config(args) == expected


def test_the_launcher_refuses_a_server_nobody_could_reach():
    with pytest.raises(ValueError, match="tls=True"):
        LocalZooKeeper(plaintext=False)
    with pytest.raises(ValueError, match="need, want, none"):
        LocalZooKeeper(tls=True, tls_client_auth="always")
