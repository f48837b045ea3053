"""How a client picks its ensemble: explicit hosts, then SENTINEL_ZK, then the dev server."""

import pytest

from sentinel import Sentinel
from sentinel.devserver import resolve_hosts, validate_hosts
from sentinel.errors import ClientClosed, DevServerNotRunning, ValidationError


@pytest.fixture(autouse=True)
def isolated_state(monkeypatch, tmp_path):
    monkeypatch.setenv("SENTINEL_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("SENTINEL_ZK", raising=False)


@pytest.mark.parametrize("hosts", ["127.0.0.1:2181", "zk1:2181,zk2:2181,zk3", "[::1]:2181"])
def test_valid_connect_strings(hosts):
    assert validate_hosts(hosts) == hosts


@pytest.mark.parametrize(
    "hosts",
    [
        "",
        "zk1:2181/chroot",
        "zk1:2181, zk2:2181",
        "a,,b",
        None,
        "localhost:abc",
        "host:99999",
        "host:0",
        "host:",
        ":2181",
        "[::1",
        "zk1:2181,zk2:-1",
    ],
)
def test_invalid_connect_strings(hosts):
    with pytest.raises(ValidationError, match="must look like"):
        validate_hosts(hosts)


@pytest.mark.parametrize("hosts", ["localhost:abc", "host:99999", ""])
def test_the_client_refuses_bad_hosts_with_a_validation_error(hosts):
    with pytest.raises(ValidationError, match="must look like"):
        Sentinel(hosts=hosts)


def test_explicit_hosts_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("SENTINEL_ZK", "env:2181")
    assert resolve_hosts("explicit:2181") == "explicit:2181"
    assert resolve_hosts() == "env:2181"


def test_no_hosts_and_no_dev_server_says_what_to_do():
    with pytest.raises(DevServerNotRunning, match="sentinel zk start"):
        resolve_hosts()


def test_a_stale_state_file_is_not_trusted(tmp_path):
    (tmp_path / "zk.json").write_text(
        '{"pid": 999999999, "connect_string": "127.0.0.1:1", "directory": "/nowhere",'
        ' "started_at": 0}'
    )
    with pytest.raises(DevServerNotRunning):
        resolve_hosts()
    assert not (tmp_path / "zk.json").exists()


def test_a_client_that_was_not_started_refuses_to_work():
    client = Sentinel(hosts="127.0.0.1:1")
    with pytest.raises(ClientClosed, match="not started"):
        client.register_service("db", "p1", "h", 1)
    client.close()  # closing a client that never started is harmless
