"""The ``sentinel`` console script, run as a user would: a subprocess, output and exit codes."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from sentinel import Sentinel
from sentinel.cli import build_parser
from sentinel.errors import PostgresNotInstalled
from sentinel.testing.helpers import wait_until
from sentinel.testing.postgres import find_bindir
from sentinel.testing.spark import JVM_OPTIONS as SPARK_JVM_OPTIONS
from tests.parser_tree import summaries

pytestmark = pytest.mark.integration

SENTINEL = str(Path(sys.executable).with_name("sentinel"))


def run(*args, env=None, timeout=120):
    return subprocess.run(
        [SENTINEL, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


@pytest.fixture
def cli_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SENTINEL_ZK"}
    env["SENTINEL_STATE_DIR"] = str(tmp_path / "state")
    yield env
    run("zk", "stop", env=env)


def test_dev_server_life_cycle(cli_env, monkeypatch):
    assert run("zk", "status", env=cli_env).returncode == 1

    started = run("zk", "start", "--json", env=cli_env)
    assert started.returncode == 0, started.stderr
    server = json.loads(started.stdout)
    assert server["started"] is True and server["connect_string"].startswith("127.0.0.1:")

    again = run("zk", "start", "--json", env=cli_env)
    assert json.loads(again.stdout)["started"] is False
    assert json.loads(again.stdout)["pid"] == server["pid"]

    status = run("zk", "status", env=cli_env)
    assert status.returncode == 0
    assert "standalone" in status.stdout and server["connect_string"] in status.stdout
    status_json = json.loads(run("zk", "status", "--json", env=cli_env).stdout)
    assert status_json["running"] is True and status_json["mode"] == "standalone"

    # A client given no hosts finds the development server by itself.
    monkeypatch.setenv("SENTINEL_STATE_DIR", cli_env["SENTINEL_STATE_DIR"])
    monkeypatch.delenv("SENTINEL_ZK", raising=False)
    with Sentinel(client_id="cli-test") as client:
        assert client.hosts == server["connect_string"]
        client.register("api", "p1", "h", 80)

    stopped = run("zk", "stop", env=cli_env)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert run("zk", "status", env=cli_env).returncode == 1
    assert run("zk", "stop", env=cli_env).returncode == 1


def test_dev_server_keeps_its_port_and_data_so_clients_reconnect(cli_env, monkeypatch):
    first = json.loads(run("zk", "start", "--json", env=cli_env).stdout)
    hosts = first["connect_string"]
    monkeypatch.setenv("SENTINEL_STATE_DIR", cli_env["SENTINEL_STATE_DIR"])
    monkeypatch.delenv("SENTINEL_ZK", raising=False)
    with Sentinel(client_id="restart-test") as client:
        client.register("api", "p1", "10.0.0.1", 80)
        assert client.get_service("api").port == 80
        zk = KazooClient(hosts=hosts)
        zk.start(timeout=10)
        zk.create("/kept", b"across restarts")
        zk.stop()
        zk.close()

        assert run("zk", "stop", env=cli_env).returncode == 0
        assert wait_until(lambda: client.connection_state != "connected", timeout=30) is not None
        stopped = run("zk", "status", "--json", env=cli_env)
        assert stopped.returncode == 1
        assert f"127.0.0.1:{json.loads(stopped.stdout)['port']}" == hosts

        # A taken port is refused before anything starts: exit 4, saying so.
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", 0))
            squatter.listen()
            taken = run("zk", "start", "--port", str(squatter.getsockname()[1]), env=cli_env)
        assert taken.returncode == 4, taken.stderr
        assert "is taken by another process" in taken.stderr and "Traceback" not in taken.stderr

        again = json.loads(run("zk", "start", "--json", env=cli_env).stdout)
        assert again["started"] is True and again["connect_string"] == hosts
        # The client was never told anything: it finds the server again at the same address.
        assert wait_until(lambda: client.connection_state == "connected", timeout=30) is not None
        assert client.get_service("api").port == 80
        zk = KazooClient(hosts=hosts)
        zk.start(timeout=10)
        assert zk.get("/kept")[0] == b"across restarts"
        zk.stop()
        zk.close()


def test_dev_server_port_is_chosen_with_port(cli_env):
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    wanted = free.getsockname()[1]
    free.close()
    started = run("zk", "start", "--port", str(wanted), "--json", env=cli_env)
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["connect_string"] == f"127.0.0.1:{wanted}"
    moved = run("zk", "start", "--port", str(wanted + 1 if wanted < 65535 else 1025), env=cli_env)
    assert moved.returncode == 2 and "already runs on" in moved.stderr
    assert run("zk", "start", "--port", "70000", env=cli_env).returncode == 2


def test_demo_runs_every_check(zookeeper):
    """On real PostgreSQL when it is installed, as users get it; else on SQLite. Two partitions
    (one for the lagging replica, one for the killed one): six servers, not nine. Its Spark
    driver's JVM is tuned as the suite's Spark JVMs are (the client compiler, one GC thread:
    about half the CPU of a session's start), through the environment the JVM reads."""
    result = run(
        "demo",
        *("--zk", zookeeper.connect_string, "--namespace", "/cli-demo"),
        *("--partitions", "2", "--tenants", "8"),
        env={**os.environ, "JAVA_TOOL_OPTIONS": " ".join(SPARK_JVM_OPTIONS)},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        find_bindir()
    except PostgresNotInstalled:
        assert (
            "PostgreSQL is not installed here, so the databases are SQLite files" in result.stdout
        )
    else:
        assert "databases: PostgreSQL servers" in result.stdout
        assert "(PostgreSQL servers), each replica registered" in result.stdout
        assert "its server stopped (immediate shutdown)" in result.stdout
    assert "7 of 7 checks passed" in result.stdout
    assert "every tenant's total equals its primary's (8 of 8)" in result.stdout
    assert "FAIL " not in result.stdout  # a retried read prints "FAILED (...)"


def test_usage_errors_exit_2():
    assert run("zk").returncode == 2
    assert run("no-such-command").returncode == 2
    bad = run("demo", "--zk", "zk1:2181/chroot")
    assert bad.returncode == 2
    assert "must look like" in bad.stderr and "Traceback" not in bad.stderr


def test_help_explains_every_command():
    result = run("--help")
    assert result.returncode == 0
    assert "Exit codes" in result.stdout
    # The COMMAND section: each command on a line of its own, its summary beside it (wrapped
    # onto lines indented further), in the parser's order.
    section = result.stdout.split("\n  COMMAND\n", 1)[1].split("\n\n", 1)[0]
    listed: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith("    ") and not line.startswith("     "):
            name, _, summary = line.strip().partition(" ")
            listed[name] = summary.strip()
        else:
            listed[name] += " " + line.strip()
    expected = summaries(build_parser())
    assert all(expected.values()), expected  # every command says what it is for
    assert list(listed) == list(expected)
    assert listed == {name: " ".join(summary.split()) for name, summary in expected.items()}
