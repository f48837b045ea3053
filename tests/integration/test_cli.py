"""The ``sentinel`` console script, run as a user would: a subprocess, output and exit codes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel import Sentinel

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
        client.register_service("api", "p1", "h", 80)

    stopped = run("zk", "stop", env=cli_env)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert run("zk", "status", env=cli_env).returncode == 1
    assert run("zk", "stop", env=cli_env).returncode == 1


def test_demo_runs_every_check(zookeeper):
    result = run("demo", "--zk", zookeeper.connect_string, "--namespace", "/cli-demo", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "7 of 7 checks passed" in result.stdout
    assert "every tenant's total equals its primary's (12 of 12)" in result.stdout
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
    for word in ("zk", "demo", "Exit codes"):
        assert word in result.stdout
