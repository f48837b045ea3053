"""The operator commands through the real console script: tables, JSON shapes, exit codes."""

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sentinel.cli import build_parser
from sentinel.testing.zookeeper import free_ports
from tests.conftest import sentinel_in_process
from tests.parser_tree import every_command

pytestmark = pytest.mark.integration

SENTINEL = str(Path(sys.executable).with_name("sentinel"))


@pytest.fixture
def world(make_client):
    """orders-db sharded over p1/p2 (p2 empty of live replicas), with lag metrics; api."""
    publisher = make_client("publisher")
    publisher.shard_maps.create("tenants", "directory", partitions=["p1", "p2"], buckets=4)
    publisher.shard_maps.assign_many("tenants", {"acme": "p1", "globex": "p2"})
    publisher.ensure_service("orders-db", scheme="postgresql", shard_policy="tenants")
    for label, lag in (("replica-a", 3), ("replica-b", 12)):
        publisher.register(
            "orders-db", "p1", f"10.0.0.{lag}", 5432, label=label, scheme="postgresql", zone="z1"
        )
        publisher.update_metrics("orders-db", "p1", label, {"replication_lag": lag})
    publisher.register("api", "main", "10.1.0.1", 8080, label="api-1")
    return publisher


def test_ls_lists_services_and_instances(cli, world):
    table = cli("ls")
    assert table.returncode == 0, table.stderr
    assert "orders-db  postgresql  tenants       2          2   p1:2" in table.stdout
    services = json.loads(cli("ls", "--json").stdout)
    assert {s["service"]: s["partitions"] for s in services} == {
        "api": {"main": 1},
        "orders-db": {"p1": 2},
    }
    instances = json.loads(cli("ls", "orders-db", "--json").stdout)
    assert instances["shard_policy"] == "tenants"
    by_label = {i["label"]: i for i in instances["instances"]}
    assert by_label["replica-b"]["metrics"] == {"replication_lag": 12}
    assert by_label["replica-a"]["host"] == "10.0.0.3" and by_label["replica-a"]["zone"] == "z1"
    detail = cli("ls", "orders-db").stdout
    assert "replication_lag=12" in detail and "10.0.0.12:5432" in detail


def test_exit_codes_mean_what_they_say(cli, world):
    assert cli("ls", "nothing").returncode == 1
    missing = cli("ls", namespace_override="/never-created")
    assert missing.returncode == 1 and "sentinel init" in missing.stderr
    (port,) = free_ports(1)
    unreachable = subprocess.run(
        [SENTINEL, "ls", "--zk", f"127.0.0.1:{port}", "--timeout", "1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert unreachable.returncode == 3 and "connection refused" in unreachable.stderr
    assert cli("ls", "--timeout", "x").returncode == 2
    bad_hosts = subprocess.run(
        [SENTINEL, "ls", "--zk", "a b"], capture_output=True, text=True, timeout=30, check=False
    )
    assert bad_hosts.returncode == 2
    for result in (missing, unreachable, bad_hosts):
        assert "Traceback" not in result.stderr


def test_resolve_explains_every_verdict(cli, world):
    result = cli(
        "resolve", "orders-db", "acme", "--policy", "min_lag:cutoff=5", "-n", "3", "--json"
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["partition"] == "p1" and answer["shard_policy"] == "tenants"
    verdicts = {i["label"]: i["verdict"] for i in answer["instances"]}
    assert verdicts["replica-a"] == "eligible"
    assert verdicts["replica-b"].startswith("excluded by MinLag(")
    assert [p["label"] for p in answer["picks"]] == ["replica-a"] * 3
    text = cli("resolve", "orders-db", "acme", "--balancer", "sticky:key=t1", "-n", "4").stdout
    assert "partition p1" in text and "picked (4 calls): replica-" in text


def test_resolve_exit_codes(cli, world):
    nothing = cli("resolve", "orders-db", "acme", "--policy", "min_lag:cutoff=1")
    assert nothing.returncode == 1 and "nothing eligible" in nothing.stdout
    empty_partition = cli("resolve", "orders-db", "globex", "--json")
    assert empty_partition.returncode == 1
    assert json.loads(empty_partition.stdout)["error"].endswith("has no live instance")
    assert cli("resolve", "orders-db", "unknown-key").returncode == 1
    assert cli("resolve", "orders-db", "acme", "--policy", "fastest").returncode == 2
    assert cli("resolve", "orders-db", "acme", "--policy", "min_lag:cutoff").returncode == 2
    assert cli("resolve", "orders-db", "acme", "--policy", "min_lag:speed=1").returncode == 2


@contextlib.contextmanager
def watching(zookeeper, namespace, *options):
    """``sentinel watch`` running and ready; it must exit 0 on Ctrl-C, without a traceback."""
    process = subprocess.Popen(
        [SENTINEL, "watch", *options, "--zk", zookeeper.connect_string, "--namespace", namespace],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _read_until(process.stderr, "watching every service")
        yield process
        process.send_signal(signal.SIGINT)
        assert process.wait(10) == 0
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
        process.stderr.close()


def test_watch_shows_a_registration_within_100_ms(zookeeper, namespace, world, make_client):
    with watching(zookeeper, namespace) as process:
        writer = make_client("late-publisher")
        writer.register("api", "main", "10.1.0.9", 8080, label="api-9")
        registered = time.monotonic()
        line = process.stdout.readline()
        seen = time.monotonic()
        assert "api" in line and "+ main:api-9 http://10.1.0.9:8080 (up)" in line
        assert seen - registered < 0.1, f"shown {1000 * (seen - registered):.0f} ms later"
        writer.register("brand-new", "p1", "h", 1)
        assert "brand-new" in process.stdout.readline()


def test_watch_initial_prints_what_is_there_first_then_the_changes(
    zookeeper, namespace, world, make_client
):
    with watching(zookeeper, namespace, "--initial") as process:
        # Printed before it said it was watching: the current state, every service.
        current = sorted(line.split("  ", 1)[1].strip() for line in _lines(process, 3))
        assert current == [
            "api                   = main:api-1 http://10.1.0.1:8080 (up)",
            "orders-db             = p1:replica-a postgresql://10.0.0.3:5432 (up)",
            "orders-db             = p1:replica-b postgresql://10.0.0.12:5432 (up)",
        ]
        make_client("late-publisher").register("api", "main", "10.1.0.9", 8080, label="api-9")
        assert "+ main:api-9 http://10.1.0.9:8080 (up)" in process.stdout.readline()
    # Without --initial only changes are printed (test_watch_shows_a_registration_within_100_ms).


def _lines(process, count):
    return [process.stdout.readline() for _ in range(count)]


def _read_until(stream, text, limit=50):
    """Read lines until one contains ``text``; fail with everything read if none does."""
    lines = []
    for _ in range(limit):
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return line
    raise AssertionError(f"{text!r} never came; read {lines!r}")


@pytest.fixture
def chain(make_client):
    """s1 -> s2 -> s3 -> s4 -> s5 -> s6, and s6 -> s4 closing a cycle, as live clients."""
    publisher = make_client("publisher")
    for i in range(1, 7):
        publisher.register(f"s{i}", "p", f"10.2.0.{i}", 80)
    for source, target in [(f"s{i}", f"s{i + 1}") for i in range(1, 6)] + [("s6", "s4")]:
        make_client(f"{source}-to-{target}", app=source).prefetch(target)


def test_deps_tree_impact_and_cycle(cli, chain):
    tree = cli("deps", "s1")
    assert tree.returncode == 0, tree.stderr
    assert tree.stdout.splitlines()[:7] == [
        "s1",
        "└── s2",
        "    └── s3",
        "        └── s4",
        "            └── s5",
        "                └── s6",
        "                    └── s4 (cycle)",
    ]
    assert "cycle: s4 <-> s5 <-> s6" in tree.stdout
    impact = json.loads(cli("deps", "--impact", "s4", "--format", "json").stdout)
    assert impact["impact"] == {"service": "s4", "dependents": ["s1", "s2", "s3", "s5", "s6"]}
    assert impact["cycles"] == [["s4", "s5", "s6"]]
    assert {(e["from"], e["to"]) for e in impact["edges"]} == {
        ("s1", "s2"),
        ("s2", "s3"),
        ("s3", "s4"),
        ("s4", "s5"),
        ("s5", "s6"),
        ("s6", "s4"),
    }
    assert "if s6 goes down, 5 depend on it" in cli("deps", "--impact", "s6").stdout
    assert cli("deps", "nowhere").returncode == 1


def test_deps_dot_renders_with_graphviz(cli, chain, tmp_path):
    dot = cli("deps", "--format", "dot").stdout
    assert '"s6" -> "s4" [label="1", color=red];' in dot
    assert '"s1" -> "s2" [label="1"];' in dot
    if shutil.which("dot") is None:
        pytest.skip(
            "Graphviz `dot` is not installed (./run.sh test installs it): DOT checked as text only"
        )
    svg = subprocess.run(
        ["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True
    ).stdout
    assert svg.count('<g id="node') == 6 and svg.count('<g id="edge') == 6


def test_doctor_reports_findings_with_fixes(cli, world, raw_zk):
    raw_zk.create("/services/orders-db/p1:broken", b"\x00")
    raw_zk.ensure_path("/metrics/orders-db")
    raw_zk.create(
        "/metrics/orders-db/p1:gone",
        json.dumps({"v": 1, "measured_at": 1.0, "metrics": {"x": 1}}).encode(),
    )
    result = cli("doctor", "--json")
    assert result.returncode == 1
    findings = json.loads(result.stdout)
    by_check = {}
    for finding in findings:
        by_check.setdefault(finding["check"], []).append(finding)
    assert by_check["zookeeper"][0]["severity"] == "ok"
    assert "3.8" in by_check["zookeeper"][0]["detail"]
    (empty,) = by_check["no live instance"]
    assert (
        "partition p2" in empty["detail"] and "registers orders-db in partition p2" in empty["fix"]
    )
    assert any(
        "p1:gone has no instance" in f["detail"] and f["fix"].startswith("sentinel prune")
        for f in by_check["orphaned metrics"]
    )
    assert any("cannot be decoded" in f["detail"] for f in by_check["schema"])
    assert by_check["acl"][0]["severity"] == "warn"
    text = cli("doctor").stdout
    assert "ERROR" in text and "problem(s)" in text
    missing = cli("doctor", namespace_override="/never-created")
    assert missing.returncode == 1 and "sentinel init --namespace /never-created" in missing.stdout


def test_doctor_passes_a_healthy_namespace(cli, make_client):
    make_client("publisher").register("api", "main", "h", 80)
    result = cli("doctor")
    assert result.returncode == 0, result.stdout
    assert "0 problem(s)" in result.stdout


def test_init_export_import_round_trip(cli, world, namespace, tmp_path):
    target = f"{namespace}-copy"
    init = cli("init", "--json", namespace_override=target)
    assert init.returncode == 0 and json.loads(init.stdout)["namespace"] == target
    exported = tmp_path / "backup.json"
    assert cli("export", str(exported)).returncode == 0
    nodes = json.loads(exported.read_text())["nodes"]
    assert any(n["path"] == "/services/orders-db/p1:replica-a" and n["ephemeral"] for n in nodes)
    dry = cli("import", str(exported), "--dry-run", "--json", namespace_override=target)
    assert json.loads(dry.stdout)["created"] > 0
    assert json.loads(cli("ls", "--json", namespace_override=target).stdout) == []
    first = json.loads(cli("import", str(exported), "--json", namespace_override=target).stdout)
    assert first["created"] > 0 and first["updated"] == 0
    again = json.loads(cli("import", str(exported), "--json", namespace_override=target).stdout)
    assert again == {
        "created": 0,
        "updated": 0,
        "unchanged": first["created"] + first["unchanged"],
        "dry_run": False,
    }
    copy = tmp_path / "copy.json"
    cli("export", str(copy), namespace_override=target)
    persistent = {(n["path"], json.dumps(n.get("json"))) for n in nodes if not n["ephemeral"]}
    copied = {(n["path"], json.dumps(n.get("json"))) for n in json.loads(copy.read_text())["nodes"]}
    assert persistent == copied


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[]",
        '{"sentinel_export": 2, "nodes": []}',
        '{"sentinel_export": 1}',
        '{"sentinel_export": 1, "nodes": [{"path": "relative", "json": 1}]}',
        '{"sentinel_export": 1, "nodes": [{"path": "/a/../b", "json": 1}]}',
        '{"sentinel_export": 1, "nodes": [{"path": "/a"}]}',
        '{"sentinel_export": 1, "nodes": [{"path": "/a", "json": 1}, '
        '{"path": "/b", "base64": "!"}]}',
    ],
)
def test_import_refuses_bad_files_and_writes_nothing(cli, namespace, tmp_path, content, raw_zk):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    result = cli("import", str(bad))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert raw_zk.exists("/a") is None


def test_prune_removes_only_old_orphaned_metrics(cli, world, raw_zk):
    raw_zk.ensure_path("/metrics/orders-db")
    old = json.dumps({"v": 1, "measured_at": 1.0, "metrics": {"x": 1}}).encode()
    fresh = json.dumps({"v": 1, "measured_at": time.time(), "metrics": {"x": 1}}).encode()
    raw_zk.create("/metrics/orders-db/p1:old-orphan", old)
    raw_zk.create("/metrics/orders-db/p1:restarting", fresh)
    dry = json.loads(cli("prune", "--dry-run", "--json").stdout)
    assert dry == {"would_remove": ["/metrics/orders-db/p1:old-orphan"]}
    assert raw_zk.exists("/metrics/orders-db/p1:old-orphan") is not None
    assert cli("prune").returncode == 0
    assert raw_zk.exists("/metrics/orders-db/p1:old-orphan") is None
    assert raw_zk.exists("/metrics/orders-db/p1:restarting") is not None
    assert raw_zk.exists("/metrics/orders-db/p1:replica-a") is not None


def test_every_command_has_help():
    """``sentinel WORDS --help`` for every command and group the parser has: exit 0, a usage
    line naming the command, and the command's description. In this process (the console
    script's own --help is test_cli's): 37 interpreters would take a minute of CI."""
    commands = list(every_command(build_parser()))
    assert len(commands) > 30  # the walk found the groups' commands too
    for words, parser in commands:
        result = sentinel_in_process(*words, "--help")
        assert result.returncode == 0, (words, result.stderr)
        assert result.stdout.startswith("usage: sentinel " + " ".join(words) + " "), words
        assert parser.description, f"{words} has no description"
        # argparse re-wraps the text, breaking lines after hyphens too: compare it unspaced.
        assert "".join(parser.description.split()) in "".join(result.stdout.split()), words


def test_watch_exits_cleanly_whenever_ctrl_c_lands(zookeeper, namespace, world, make_client):
    """Ctrl-C sent at moments the command's own output marks: while it loads the services
    there at start, idle, while it follows new services, while it prints a stream of events.
    Each time: exit 0, no traceback."""
    writer = make_client("busy-publisher")
    for i in range(40):  # enough services that loading them at start takes a while
        writer.register(f"present-{i}", "p1", "h", 1)

    def ctrl_c_after(stream: str, text: str, then=None) -> None:
        process = subprocess.Popen(
            [SENTINEL, "-v", "watch", "--zk", zookeeper.connect_string, "--namespace", namespace],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            if then is not None:
                _read_until(process.stderr, "watching every service", limit=500)
                then()
            _read_until(getattr(process, stream), text, limit=500)
            process.send_signal(signal.SIGINT)
            assert process.wait(10) == 0, (stream, text, process.stderr.read())
            assert "Traceback" not in process.stderr.read(), (stream, text)
        finally:
            if process.poll() is None:
                process.kill()
            process.stdout.close()
            process.stderr.close()

    # Connected (the client's -v line), the services there not loaded yet.
    ctrl_c_after("stderr", "connected to")
    # Ready, nothing happening.
    ctrl_c_after("stderr", "watching every service")

    def new_services():
        for i in range(20):
            writer.register(f"burst-{i}", "p1", "h", 1)

    # The first of 20 new services shown, the others still being followed.
    ctrl_c_after("stdout", "service appeared", then=new_services)

    def new_instances():
        for i in range(50):
            writer.register("api", "main", "10.1.0.2", 9000 + i, label=f"api-x{i}")

    # The first of 50 registrations printed, the others still arriving.
    ctrl_c_after("stdout", "+ main:api-x", then=new_instances)
