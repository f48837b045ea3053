"""How a client picks its ensemble: explicit hosts, then SENTINEL_ZK, then the dev server."""

import pytest

from sentinel import Sentinel
from sentinel.devserver import resolve_hosts, validate_hosts
from sentinel.errors import (
    ClientClosed,
    DevServerNotRunning,
    InvalidConnectString,
    ValidationError,
)


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
        "127.0.0.1;2181",
        "zk1:2181;zk2:2181",
        "zk 1:2181",
    ],
)
def test_invalid_connect_strings(hosts):
    with pytest.raises(ValidationError, match="must look like"):
        validate_hosts(hosts)


@pytest.mark.parametrize(
    ("hosts", "part", "said"),
    [
        ("127.0.0.1;2181", "127.0.0.1;2181", "(';' cannot be in one)"),
        ("zk1:2181,zk2;2181", "zk2;2181", "'zk2;2181' is not a host name"),
        ("zk1:2181,zk2:99999", "99999", "the port '99999' of 'zk2:99999'"),
        ("zk1:2181,,zk3:2181", "", "server 2 is empty"),
        ("zk1:2181/prod", "/prod", "the chroot '/prod' goes in namespace="),
        ("[::1:2181", "[::1:2181", "'[::1:2181' is not a host name"),
    ],
)
def test_a_bad_connect_string_names_the_bad_part(hosts, part, said):
    with pytest.raises(InvalidConnectString) as raised:
        validate_hosts(hosts)
    assert raised.value.part == part
    assert said in str(raised.value)


def test_a_bad_connect_string_fails_at_once_not_after_the_connect_timeout():
    # Before issue 39, '127.0.0.1;2181' went to kazoo, which tried it as a host name until
    # the timeout (10 s by default); now the constructor refuses it before any connection.
    with pytest.raises(InvalidConnectString, match="';' cannot be in one"):
        Sentinel(hosts="127.0.0.1;2181", connect_timeout=10)


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
        client.register("db", "p1", "h", 1)
    client.close()  # closing a client that never started is harmless


def test_a_bad_sentinel_zk_says_it_came_from_the_variable(monkeypatch):
    monkeypatch.setenv("SENTINEL_ZK", "zk1:2181/prod")
    with pytest.raises(ValidationError, match=r"^\$SENTINEL_ZK \(the environment variable\) "):
        Sentinel()
    # Given explicitly, the same string is blamed on the argument, not on the variable.
    with pytest.raises(ValidationError, match=r"^hosts 'zk1:2181/prod' must look like") as raised:
        Sentinel(hosts="zk1:2181/prod")
    assert "SENTINEL_ZK" not in str(raised.value)


def test_the_cli_names_the_variable_or_the_flag_and_exits_2(monkeypatch):
    from tests.conftest import sentinel_in_process

    monkeypatch.setenv("SENTINEL_ZK", "localhost:abc")
    from_env = sentinel_in_process("ls")
    assert from_env.returncode == 2
    assert "$SENTINEL_ZK (the environment variable) 'localhost:abc'" in from_env.stderr
    from_flag = sentinel_in_process("ls", "--zk", "localhost:abc")
    assert from_flag.returncode == 2 and "argument --zk: hosts 'localhost:abc'" in from_flag.stderr
    semicolon = sentinel_in_process("ls", "--zk", "127.0.0.1;2181")
    assert semicolon.returncode == 2 and "(';' cannot be in one)" in semicolon.stderr
    assert "SENTINEL_ZK" not in from_flag.stderr.splitlines()[-1]


def test_no_zookeeper_given_is_a_usage_error_exit_2():
    from tests.conftest import sentinel_in_process

    # docs/cli.md: 2 is "usage error or bad input"; 4 is "ZooKeeper could not be started".
    result = sentinel_in_process("ls")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("sentinel: error: no ZooKeeper given")
