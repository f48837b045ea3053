"""``sentinel shard`` through the console script against a real ZooKeeper."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.shards.store import iter_assignments
from sentinel.testing.helpers import wait_until

pytestmark = pytest.mark.integration

SENTINEL = str(Path(sys.executable).with_name("sentinel"))


@pytest.fixture
def shard(cli_in_process):
    """``sentinel shard ARGS`` in this process (see ``cli_in_process``); the interrupted
    import below is a process of its own, since it is killed."""

    def run(*args):
        return cli_in_process("shard", *args)

    assert (
        run(
            "create-policy",
            "tenants",
            "--kind",
            "directory",
            "--partitions",
            "p1,p2,p3",
            "--buckets",
            "16",
        ).returncode
        == 0
    )
    return run


def write_csv(path, mapping):
    path.write_text("key,partition\n" + "".join(f"{k},{p}\n" for k, p in mapping.items()))


def test_import_then_export_is_identical_and_reimport_changes_nothing(shard, tmp_path):
    mapping = {f"tenant-{i:05d}": f"p{1 + i % 3}" for i in range(3000)}
    source = tmp_path / "in.csv"
    write_csv(source, mapping)
    first = shard("import", str(source), "--policy", "tenants", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["changed"] == 3000
    again = json.loads(shard("import", str(source), "--policy", "tenants", "--json").stdout)
    assert (again["changed"], again["unchanged"]) == (0, 3000)
    out_csv, out_json = tmp_path / "out.csv", tmp_path / "out.json"
    assert shard("export", str(out_csv), "--policy", "tenants").returncode == 0
    assert out_csv.read_text() == "key,partition\n" + "".join(
        f"{k},{p}\n" for k, p in sorted(mapping.items())
    )
    shard("export", str(out_json), "--policy", "tenants")
    assert json.loads(out_json.read_text()) == mapping
    reimported = shard("import", str(out_json), "--policy", "tenants", "--json")
    assert json.loads(reimported.stdout)["changed"] == 0


def test_an_interrupted_import_resumes_to_the_same_map(
    shard, tmp_path, zookeeper, namespace, raw_zk
):
    mapping = {f"k{i:05d}": f"p{1 + i % 3}" for i in range(20_000)}
    source = tmp_path / "big.csv"
    write_csv(source, mapping)
    process = subprocess.Popen(
        [
            SENTINEL,
            "shard",
            "import",
            str(source),
            "--policy",
            "tenants",
            "--batch",
            "500",
            "--zk",
            zookeeper.connect_string,
            "--namespace",
            namespace,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(
            lambda: len(dict(iter_assignments(raw_zk, "tenants"))) >= 500,
            timeout=60,
            interval=0.005,
        )
        process.kill()
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
    partial = dict(iter_assignments(raw_zk, "tenants"))
    assert 0 < len(partial) < len(mapping), "the import finished before it could be killed"
    resumed = json.loads(shard("import", str(source), "--policy", "tenants", "--json").stdout)
    assert resumed["changed"] == len(mapping) - len(partial)
    assert dict(iter_assignments(raw_zk, "tenants")) == mapping


def test_move_shows_the_instances_before_and_after(shard, make_client):
    publisher = make_client("publisher")
    publisher.ensure_service("orders", shard_policy="tenants")
    publisher.register("orders", "p1", "10.0.0.1", 5432, label="one")
    publisher.register("orders", "p2", "10.0.0.2", 5432, label="two")
    assert shard("assign", "acme", "p1", "--policy", "tenants").returncode == 0
    dry = json.loads(
        shard("move", "acme", "p2", "--policy", "tenants", "--dry-run", "--json").stdout
    )
    assert dry["from"] == "p1" and dry["dry_run"] is True
    assert (
        json.loads(shard("show", "acme", "--policy", "tenants", "--json").stdout)["partition"]
        == "p1"
    )
    moved = shard("move", "acme", "p2", "--policy", "tenants")
    assert moved.returncode == 0
    assert "served before by: orders:one@10.0.0.1:5432" in moved.stdout
    assert "served after by:  orders:two@10.0.0.2:5432" in moved.stdout
    shown = json.loads(shard("show", "acme", "--policy", "tenants", "--json").stdout)
    assert shown == {
        "key": "acme",
        "policy": "tenants",
        "partition": "p2",
        "instances": ["orders:two@10.0.0.2:5432"],
    }
    stats = json.loads(shard("stats", "--policy", "tenants", "--json").stdout)
    assert stats["keys_per_partition"] == {"p2": 1}
    assert stats["partitions_without_live_instance"] == {"orders": ["p3"]}
    assert shard("validate", "--policy", "tenants").returncode == 1
    publisher.register("orders", "p3", "10.0.0.3", 5432, label="three")
    assert shard("validate", "--policy", "tenants").returncode == 0
    assert shard("remove", "acme", "--policy", "tenants").returncode == 0
    assert shard("remove", "acme", "--policy", "tenants").returncode == 1
    assert shard("show", "acme", "--policy", "tenants").returncode == 1


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("key,partition\nok,p1\nbroken-line\n", "line 3 must be KEY,PARTITION"),
        ("a,p1,extra\n", "line 1 must be KEY,PARTITION"),
        ("a,p9\n", "'p9' is not one of"),
        ('{"a": 1}', "entry 1 must be a [key, partition] pair"),
        ("{not json", "is not JSON"),
    ],
)
def test_bad_imports_exit_2_and_write_nothing(shard, tmp_path, raw_zk, content, fragment):
    bad = tmp_path / ("bad.json" if content.startswith("{") else "bad.csv")
    bad.write_text(content)
    result = shard("import", str(bad), "--policy", "tenants")
    assert result.returncode == 2
    assert fragment in result.stderr and "Traceback" not in result.stderr
    assert dict(iter_assignments(raw_zk, "tenants")) == {}


def test_other_bad_input_and_unknown_names(shard):
    assert shard("show", "k", "--policy", "nope").returncode == 1
    assert "does not exist" in shard("list", "--policy", "nope").stderr
    assert shard("assign", "k", "p9", "--policy", "tenants").returncode == 2
    assert shard("create-policy", "tenants", "--kind", "directory").returncode == 1
    assert (
        shard("create-policy", "r", "--kind", "range", "--boundaries", "b:p1,a:p2").returncode == 2
    )
    assert shard("create-policy", "x", "--kind", "tree").returncode == 2
    ranged = shard(
        "create-policy",
        "ids",
        "--kind",
        "range",
        "--key-type",
        "int",
        "--boundaries",
        "0:low,1000:high",
        "--json",
    )
    assert json.loads(ranged.stdout)["boundaries"] == [[0, "low"], [1000, "high"]]
    assert (
        json.loads(shard("show", "1500", "--policy", "ids", "--json").stdout)["partition"] == "high"
    )
    assert shard("list", "--policy", "ids").returncode == 2
