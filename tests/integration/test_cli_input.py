"""Careless and hostile input to the ``sentinel`` command: an exit code and one line on stderr,
never a traceback, and nothing half-written (issue 16, items 3 and 4)."""

import subprocess
import sys
from pathlib import Path

import pytest

from sentinel import cli as sentinel_cli
from sentinel.cli import inspect as inspect_commands
from sentinel.launcher import free_ports

pytestmark = pytest.mark.integration

SENTINEL = str(Path(sys.executable).with_name("sentinel"))


def assert_one_line_error(result, code):
    """Exit ``code``, and stderr is one ``sentinel: error:`` line without a traceback."""
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sentinel: error: "), result.stderr


def run(*args, timeout=60):
    return subprocess.run(
        [SENTINEL, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("ls", "--zk", "localhost:abc"), "must look like"),
        (("ls", "--zk", "host:99999"), "ports 1-65535"),
        (("ls", "--zk", ""), "must look like"),
        (("demo", "--zk", "localhost:abc"), "must look like"),
        (("ls", "--zk", "127.0.0.1:1", "--timeout", "0"), "above 0"),
        (("ls", "--zk", "127.0.0.1:1", "--timeout", "-1"), "above 0"),
        (("ls", "--zk", "127.0.0.1:1", "--timeout", "nan"), "above 0"),
        (("zk", "start", "--timeout", "0"), "above 0"),
    ],
)
def test_bad_hosts_and_timeouts_are_usage_errors(args, fragment):
    result = run(*args)
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("sentinel ")  # argparse's one error line


@pytest.fixture
def published(make_client):
    publisher = make_client("publisher")
    publisher.register_service("db", "p1", "10.0.0.1", 5432, label="a")
    publisher.update_metrics("db", "p1", "a", {"replication_lag": 1})
    return publisher


@pytest.mark.parametrize(
    "spec", ["min_lag:cutoff=abc", "min_lag:cutoff=NaN", "min_lag:max_age=true", "threshold:x=1"]
)
def test_bad_policy_arguments_exit_2(cli, published, spec):
    result = cli("resolve", "db", "--policy", spec)
    assert_one_line_error(result, 2)


def test_an_unwritable_file_is_exit_2_naming_it(cli, published, tmp_path):
    for args in (
        ("export", "/nonexistent-dir/x.json"),
        ("shard", "export", "/nonexistent-dir/x.csv", "--policy", "nope"),
    ):
        result = cli(*args)
        if args[0] == "shard":  # the policy is looked up first: exit 1, still one line
            assert_one_line_error(result, 1)
            continue
        assert_one_line_error(result, 2)
        assert "/nonexistent-dir/x.json" in result.stderr
    directory = tmp_path / "a-directory"
    directory.mkdir()
    result = cli("export", str(directory))
    assert_one_line_error(result, 2)
    assert str(directory) in result.stderr


def test_output_into_a_closed_pipe_exits_quietly(zookeeper, namespace, published, raw_zk):
    # Far more than a pipe's buffer, so that the writer meets the closed pipe.
    raw_zk.create("/metrics/big", b"x" * 400_000)
    process = subprocess.Popen(
        [SENTINEL, "export", "-", "--zk", zookeeper.connect_string, "--namespace", namespace],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout.read(10)  # like `| head -c 10`
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 1
    assert stderr == ""


def test_an_unexpected_error_is_one_line_and_v_shows_the_traceback(
    zookeeper, namespace, monkeypatch, capsys
):
    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(inspect_commands, "_ls", broken)
    argv = ["ls", "--zk", zookeeper.connect_string, "--namespace", namespace]
    assert sentinel_cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err == (
        "sentinel: error: unexpected RuntimeError: a bug (run with -v for the traceback)\n"
    )
    assert sentinel_cli.main(["-v", *argv]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("sentinel: error: unexpected RuntimeError: a bug\n")


def test_an_unreachable_server_is_exit_3():
    (port,) = free_ports(1)
    for args in (("ls",), ("export", "-"), ("shard", "list", "--policy", "p")):
        result = run(*args, "--zk", f"127.0.0.1:{port}", "--timeout", "0.5")
        assert_one_line_error(result, 3)
