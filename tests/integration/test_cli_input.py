"""Careless and hostile input to the ``sentinel`` command: an exit code and one line on stderr,
never a traceback, and nothing half-written (issue 16, items 3 and 4)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from sentinel import cli as sentinel_cli
from sentinel.cli import inspect as inspect_commands
from sentinel.shards.store import iter_assignments
from sentinel.testing.zookeeper import free_ports
from tests.conftest import sentinel_in_process

pytestmark = pytest.mark.integration

SENTINEL = str(Path(sys.executable).with_name("sentinel"))


def assert_one_line_error(result, code):
    """Exit ``code``, and stderr is one ``sentinel: error:`` line without a traceback."""
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sentinel: error: "), result.stderr


@pytest.fixture
def cli(cli_in_process):
    """These commands are tested for what they write and print, not as processes (the
    non-UTF-8 argument and the closed pipe below are): run in this process, it saves a
    Python start and a CLI import per call."""
    return cli_in_process


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("ls", "--zk", "localhost:abc"), "must look like"),
        (("ls", "--zk", "host:99999"), "ports 1-65535"),
        (("ls", "--zk", ""), "must look like"),
        (("demo", "--zk", "localhost:abc"), "must look like"),
        (("ls", "--zk", "127.0.0.1:1", "--timeout", "0"), "above 0"),
        (("ls", "--zk", "127.0.0.1:1", "--timeout", "-1"), "above 0"),
        (("ls", "--zk", "127.0.0.1:1", "--timeout", "nan"), "not a finite number"),
        (("prune", "--zk", "127.0.0.1:1", "--older-than", "-1"), "0 or more"),
        (("resolve", "db", "--zk", "127.0.0.1:1", "-n", "0"), "1 or more"),
        (("zk", "start", "--timeout", "0"), "above 0"),
    ],
)
def test_bad_hosts_and_timeouts_are_usage_errors(args, fragment):
    result = sentinel_in_process(*args)
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("sentinel ")  # argparse's one error line


@pytest.fixture
def published(make_client):
    publisher = make_client("publisher")
    publisher.register("db", "p1", "10.0.0.1", 5432, label="a")
    publisher.update_metrics("db", "p1", "a", {"replication_lag": 1})
    return publisher


@pytest.mark.parametrize(
    "spec", ["min_lag:cutoff=abc", "min_lag:cutoff=NaN", "min_lag:max_age=true", "threshold:x=1"]
)
def test_bad_policy_arguments_exit_2(cli, published, spec):
    result = cli("resolve", "db", "--policy", spec)
    assert_one_line_error(result, 2)


def test_an_argument_that_is_not_utf8_is_exit_2(zookeeper, namespace, make_client):
    make_client("manager").shard_maps.create("tenants", "directory", partitions=["p1"])
    connection = [b"--zk", zookeeper.connect_string.encode(), b"--namespace", namespace.encode()]
    result = subprocess.run(
        [
            SENTINEL.encode(),
            b"shard",
            b"assign",
            b"\xff",
            b"p1",
            b"--policy",
            b"tenants",
            *connection,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert_one_line_error(result, 2)
    assert "not UTF-8" in result.stderr


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
        result = sentinel_in_process(*args, "--zk", f"127.0.0.1:{port}", "--timeout", "0.5")
        assert_one_line_error(result, 3)


# --- sentinel import ----------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def export_of(*nodes):
    return json.dumps({"sentinel_export": 1, "nodes": list(nodes)})


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"42", "is not a sentinel export"),
        (b"null", "is not a sentinel export"),
        (b'{"sentinel_export": 1,\n "nodes": []}\n\xff\n', "line 3 is not UTF-8 (byte 0xff)"),
        (DEEP.encode(), "nested too deeply"),
        (
            export_of({"path": "/services", "json": 1}).replace("/services", "/\\ud800").encode(),
            "lone surrogate",
        ),
        (
            export_of({"path": "/metrics", "json": {"lag": 1}}).replace("1}", "NaN}").encode(),
            "nodes[0].json.lag is nan",
        ),
        (
            export_of({"path": "/a", "json": 1}, {"path": "/a/b/c", "json": 1}).encode(),
            "its parent /a/b is neither in the file nor in the namespace",
        ),
        (
            export_of({"path": "/a", "json": 1}, {"path": "/a", "json": 2}).encode(),
            "appear more than once",
        ),
        (export_of({"path": "/a\u0001", "json": 1}).encode(), "is not an absolute node path"),
    ],
)
def test_a_bad_import_file_is_exit_2_and_writes_nothing(
    cli, namespace, tmp_path, content, fragment
):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    target = f"{namespace}-new"
    for dry_run in ((), ("--dry-run",)):
        result = cli("import", str(bad), *dry_run, namespace_override=target)
        assert_one_line_error(result, 2)
        assert fragment in result.stderr
    # Nothing written: not even the namespace.
    assert "sentinel init" in cli("ls", namespace_override=target).stderr


def test_dry_run_into_a_new_namespace_says_what_the_real_run_does(cli, namespace, tmp_path):
    source = tmp_path / "in.json"
    source.write_text(
        export_of(
            {"path": "/services", "json": None},
            {"path": "/services/api", "json": {"v": 1, "scheme": "http"}},
            {"path": "/services/api/p1:a", "json": {"v": 1}, "ephemeral": True},
        )
    )
    target = f"{namespace}-new/deeper"
    dry = cli("import", str(source), "--dry-run", "--json", namespace_override=target)
    assert dry.returncode == 0, dry.stderr
    assert "sentinel init" in cli("ls", namespace_override=target).stderr  # still nothing
    real = cli("import", str(source), "--json", namespace_override=target)
    assert real.returncode == 0, real.stderr
    assert {**json.loads(dry.stdout), "dry_run": False} == json.loads(real.stdout)
    assert json.loads(real.stdout)["created"] == 2
    assert cli("ls", "--json", namespace_override=target).returncode == 0


def test_nodes_json_cannot_carry_round_trip_as_their_bytes(cli, namespace, raw_zk, tmp_path):
    hostile = {
        "/metrics/nan": b"NaN",
        "/metrics/surrogate": b'{"k": "\\ud800"}',
        "/metrics/deep": b"[" * 100_000 + b"]" * 100_000,
        "/metrics/huge": b"1" + b"0" * 5000,
        "/metrics/bytes": b"\xff\xfe",
        "/metrics/fine": b'{"v": 1}',
    }
    raw_zk.ensure_path("/metrics")
    for path, data in hostile.items():
        raw_zk.create(path, data)
    exported = tmp_path / "out.json"
    assert cli("export", str(exported)).returncode == 0
    nodes = {n["path"]: n for n in json.loads(exported.read_text())["nodes"]}
    assert nodes["/metrics/nan"]["base64"] == "TmFO"
    assert nodes["/metrics/fine"]["json"] == {"v": 1}
    target = f"{namespace}-copy"
    result = cli("import", str(exported), namespace_override=target)
    assert result.returncode == 0, result.stderr
    copy = KazooClient(hosts=f"{raw_zk.hosts[0][0]}:{raw_zk.hosts[0][1]}{target}")
    copy.start(timeout=10)
    try:
        for path, data in hostile.items():
            assert copy.get(path)[0] == (b'{"v":1}' if path.endswith("fine") else data), path
    finally:
        copy.stop()
        copy.close()


def test_a_failed_batch_says_what_was_committed_and_a_rerun_resumes(
    zookeeper, namespace, tmp_path, monkeypatch, capsys
):
    from sentinel.cli import backup

    big = "x" * 200_000  # about three nodes per 512 KiB batch
    source = tmp_path / "in.json"
    source.write_text(
        export_of(
            {"path": "/metrics", "json": None},
            *({"path": f"/metrics/n{i}", "json": {"blob": big}} for i in range(8)),
        )
    )
    target = f"{namespace}-new"
    other = KazooClient(hosts=zookeeper.connect_string)
    other.start(timeout=10)
    other.ensure_path(f"{target}/metrics")
    plan = backup._batches

    def racing(writes):
        batches = plan(writes)
        # Another writer creates a node of the second batch between the plan and the commit.
        other.create(batches[1][0].path, b"theirs")
        return batches

    argv = ["import", str(source), "--zk", zookeeper.connect_string, "--namespace", target]
    monkeypatch.setattr(backup, "_batches", racing)
    assert sentinel_cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "stopped in batch 2: batches 1-1 of 4 are committed" in err
    assert "run the same command again to resume" in err and len(err.splitlines()) == 1
    monkeypatch.setattr(backup, "_batches", plan)
    assert sentinel_cli.main([*argv, "--json"]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert resumed == {"created": 5, "updated": 1, "unchanged": 3, "dry_run": False}
    assert sentinel_cli.main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unchanged"] == 9
    other.stop()
    other.close()


def test_imported_nodes_get_their_sections_acl(cli, namespace, raw_zk, tmp_path, monkeypatch):
    identities = tmp_path / "ids.json"
    assert cli("init", "--secure", "--identities", str(identities)).returncode == 0
    admin = json.loads(identities.read_text())["admin"]
    source = tmp_path / "in.json"
    source.write_text(
        export_of(
            {"path": "/metrics/api", "json": None},
            {"path": "/metrics/api/p1:a", "json": {"v": 1, "measured_at": 1.0, "metrics": {}}},
            {"path": "/shard_info/tenants", "json": {"v": 1}},
        )
    )
    monkeypatch.setenv("SENTINEL_ZK_IDENTITY", admin)
    result = cli("import", str(source))
    assert result.returncode == 0, result.stderr
    for section, node in (
        ("/metrics", "/metrics/api"),
        ("/metrics", "/metrics/api/p1:a"),
        ("/shard_info", "/shard_info/tenants"),
    ):
        assert raw_zk.get_acls(node)[0] == raw_zk.get_acls(section)[0], node
    assert raw_zk.get_acls("/metrics")[0] != raw_zk.get_acls("/shard_info")[0]


# --- sentinel shard import ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"42", "JSON must be an object of key -> partition"),
        (b"null", "JSON must be an object of key -> partition"),
        (b"key,partition\nacme,p1\n\xfe\xff,p2\n", "line 3 is not UTF-8 (byte 0xfe)"),
        (DEEP.encode(), "nested too deeply"),
        (b'{"acme": "p1", "\\ud800": "p2", "zeta": "p1"}', "lone surrogate"),
        (b'[["acme", "p1"], ["b", NaN]]', "[1][1] is nan"),
    ],
)
def test_a_bad_shard_import_file_is_exit_2_and_writes_nothing(
    cli, make_client, raw_zk, tmp_path, content, fragment
):
    make_client("manager").shard_maps.create("tenants", "directory", partitions=["p1", "p2"])
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    for dry_run in (("--dry-run",), ()):
        result = cli("shard", "import", str(bad), "--policy", "tenants", *dry_run)
        assert_one_line_error(result, 2)
        assert fragment in result.stderr
    assert dict(iter_assignments(raw_zk, "tenants")) == {}


def test_a_bucket_over_the_size_limit_is_refused_by_the_dry_run_too(
    cli, make_client, raw_zk, tmp_path
):
    make_client("manager").shard_maps.create("one", "directory", partitions=["p1"], buckets=1)
    source = tmp_path / "keys.csv"
    source.write_text("".join(f"{'k' * 200}-{i:06d},p1\n" for i in range(3000)))  # ~600 KB
    for dry_run in (("--dry-run",), ()):
        result = cli("shard", "import", str(source), "--policy", "one", *dry_run)
        assert_one_line_error(result, 2)
        assert "more buckets" in result.stderr
    assert dict(iter_assignments(raw_zk, "one")) == {}


# --- a large namespace --------------------------------------------------------------------


def test_a_namespace_with_a_100000_key_map_exports_and_imports_identically(
    cli, make_client, namespace, tmp_path
):
    # 256 buckets of about 8 KB each, 2 MB in all: more than one multi request may carry
    # (batches of 200 nodes were over jute.maxbuffer and failed with ConnectionLoss).
    manager = make_client("manager")
    manager.shard_maps.create("tenants", "directory", partitions=["p0", "p1", "p2", "p3"])
    manager.shard_maps.assign_many(
        "tenants", {f"tenant-{i:07d}": f"p{i % 4}" for i in range(100_000)}
    )
    manager.register("db", "p0", "10.0.0.1", 5432, label="a")
    exported, copied = tmp_path / "out.json", tmp_path / "copy.json"
    assert cli("export", str(exported)).returncode == 0
    target = f"{namespace}-copy"
    first = cli("import", str(exported), "--json", namespace_override=target)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert summary["updated"] == 0 and summary["created"] > 256
    text = cli("import", str(exported), "--dry-run", namespace_override=f"{target}-2").stdout
    assert int(re.search(r"\((\d+) batch\(es\)\)", text).group(1)) >= 4, text
    again = json.loads(cli("import", str(exported), "--json", namespace_override=target).stdout)
    assert (again["created"], again["updated"]) == (0, 0)
    assert cli("export", str(copied), namespace_override=target).returncode == 0

    def persistent(path):
        return [
            (n["path"], n.get("json"), n.get("base64"))
            for n in json.loads(path.read_text())["nodes"]
            if not n["ephemeral"]
        ]

    assert persistent(exported) == persistent(copied)
    listed = cli("shard", "list", "--policy", "tenants", "--json", namespace_override=target)
    assert len(json.loads(listed.stdout)) == 100_000


@pytest.mark.parametrize(
    "credential",
    ["[" * 5_000 + "]" * 5_000, '{"password": ' + "9" * 400 + "}", "42", "null", "{"],
)
def test_a_hostile_credential_for_auth_set_is_exit_2_and_writes_nothing(cli, raw_zk, credential):
    args = ("auth", "set", "--service", "db", "--client", "app", "-")
    assert_one_line_error(cli(*args, input=credential), 2)
    assert raw_zk.exists("/auth/db/app") is None


def test_auth_status_and_rotate_read_past_a_hostile_clients_node(cli, raw_zk, tmp_path):
    raw_zk.ensure_path("/clients/db")
    raw_zk.create("/clients/db/hostile", b"[" * 100_000 + b"]" * 100_000)
    raw_zk.create("/clients/db/huge", b'{"v": 1, "auth_version": ' + b"9" * 1_000 + b"}")
    status = cli("auth", "status", "--service", "db", "--json")
    assert status.returncode == 0, status.stderr
    rows = {row["client"]: row for row in json.loads(status.stdout)}
    assert rows["hostile"]["processes"] == {"hostile": None}  # counted, confirming nothing
    rotated = cli(
        "auth",
        "rotate",
        "--service",
        "db",
        "--client",
        "nobody",
        "--option",
        f"path={tmp_path / 'c.json'}",
    )
    assert_one_line_error(rotated, 1)
    assert "step 'publish'" in rotated.stderr
