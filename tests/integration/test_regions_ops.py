"""Several regions for operators: the shard manager replicates its maps to every region (one
region down: the others written, exit 3, converging on a re-run), ``doctor`` catches a replica
that lags, was written behind the manager's back or lies, and ``doctor``/``ls`` take
``--region``. Three single-server ensembles, one per region (the session's server is ``east``).
"""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from sentinel.client import Sentinel
from sentinel.shards.digest import digest_path
from sentinel.shards.placement import request_placement
from sentinel.shards.spec import bucket_of, bucket_path
from sentinel.shards.store import read_map_state
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from tests.conftest import sentinel_in_process
from tests.integration.daemons import Daemon

pytestmark = pytest.mark.integration

REGIONS = ("east", "west", "south")


@pytest.fixture(scope="module")
def west() -> Iterator[LocalZooKeeper]:
    with LocalZooKeeper() as zk:
        yield zk


@pytest.fixture(scope="module")
def south() -> Iterator[LocalZooKeeper]:
    with LocalZooKeeper() as zk:
        yield zk


@pytest.fixture
def ensembles(zookeeper, west, south) -> dict[str, LocalZooKeeper]:
    return {"east": zookeeper, "west": west, "south": south}


@pytest.fixture
def regions_file(ensembles, namespace, tmp_path) -> str:
    """A regions document naming the three ensembles, each region's namespace the test's."""
    document = {
        "local": "east",
        "regions": {
            name: {"hosts": zk.connect_string, "namespace": namespace}
            for name, zk in ensembles.items()
        },
    }
    path = tmp_path / "regions.json"
    path.write_text(json.dumps(document))
    return str(path)


@pytest.fixture
def sentinel(regions_file):
    """``sentinel ARGS --regions FILE`` run in this process."""

    def run(*args: str, input: str = ""):
        return sentinel_in_process(*args, "--regions", regions_file, "--timeout", "3", input=input)

    return run


@pytest.fixture
def kazoo(ensembles, namespace) -> Iterator[dict[str, KazooClient]]:
    """A plain client on each region's namespace, for looking behind the CLI."""
    clients = {}
    for name, zk in ensembles.items():
        client = KazooClient(hosts=f"{zk.connect_string}{namespace}")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No chroot path exists")
            client.start(timeout=10)
        clients[name] = client
    yield clients
    for client in clients.values():
        client.stop()
        client.close()


def findings(result) -> list[dict]:
    return json.loads(result.stdout)


def problems(result, check: str) -> list[dict]:
    return [f for f in findings(result) if f["check"] == check and f["severity"] != "ok"]


def create_tenants(sentinel) -> None:
    result = sentinel(
        "shard", "create-policy", "tenants", "--kind", "directory", "--partitions", "p1,p2"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{r}: created directory policy tenants" for r in REGIONS]


def test_the_shard_manager_writes_every_region_and_doctor_finds_them_equal(sentinel, kazoo):
    create_tenants(sentinel)
    result = sentinel("shard", "assign", "acme", "p2", "--policy", "tenants", "--json")
    assert result.returncode == 0, result.stderr
    written = json.loads(result.stdout)["regions"]
    assert sorted(written) == sorted(REGIONS)
    assert all(written[r]["to"] == "p2" and written[r]["from"] is None for r in REGIONS)
    for region, zk in kazoo.items():
        state = read_map_state(zk, "tenants")
        assert state.content == state.stored and state.content.keys == 1, region
    # An import writes only what differs, in each region: the second run changes nothing.
    for expected in ("changed 2 of 3 keys", "changed 0 of 3 keys"):
        result = sentinel(
            "shard", "import", "-", "--policy", "tenants", input="acme,p2\nb,p1\nc,p2\n"
        )
        assert result.returncode == 0, result.stderr
        assert all(expected in line for line in result.stdout.splitlines()), result.stdout
    result = sentinel("doctor", "--region", "all", "--json")
    agree = [f for f in findings(result) if f["check"] == "shard maps agree"]
    assert agree == [
        {
            "severity": "ok",
            "check": "shard maps agree",
            "detail": "tenants: the same in all 3",
            "fix": "",
            "region": None,
        }
    ]
    assert {f["region"] for f in findings(result) if f["check"] == "zookeeper"} == set(REGIONS)


def test_one_region_down_the_others_are_written_exit_3_and_a_rerun_converges(
    sentinel, kazoo, south
):
    create_tenants(sentinel)
    south.members[0].stop()
    try:
        result = sentinel("shard", "assign", "acme", "p1", "--policy", "tenants")
        assert result.returncode == 3, (result.stdout, result.stderr)
        lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
        assert lines["east"].startswith("assigned acme") and lines["west"].startswith("assigned")
        assert lines["south"].startswith("NOT WRITTEN")
        assert "south" in result.stderr and "written in east, west" in result.stderr
        for region in ("east", "west"):
            assert read_map_state(kazoo[region], "tenants").content.keys == 1
        result = sentinel("shard", "remove", "ghost", "--policy", "tenants", "--json")
        assert result.returncode == 3  # unreachable outranks "not assigned" (1) elsewhere
        outcome = json.loads(result.stdout)["regions"]
        assert outcome["south"]["exit_code"] == 3 and "south" not in outcome["east"]
        assert outcome["east"]["removed_from"] is None
        # doctor checks the regions it reaches and names the one it cannot
        result = sentinel("doctor", "--region", "all", "--json")
        assert result.returncode == 1
        down = [f for f in findings(result) if f["check"] == "zookeeper" and f["region"] == "south"]
        assert [f["severity"] for f in down] == ["error"]
    finally:
        south.members[0].restart()
    result = sentinel("doctor", "--region", "all", "--json")
    (lag,) = problems(result, "shard maps agree")
    assert "east, west: 1 key(s)" in lag["detail"] and "south: 0 key(s)" in lag["detail"]
    result = sentinel("shard", "assign", "acme", "p1", "--policy", "tenants")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [  # east and west already held it: unchanged there
        "east: moved acme: p1 -> p1 (policy tenants)",
        "west: moved acme: p1 -> p1 (policy tenants)",
        "south: assigned acme: (unassigned) -> p1 (policy tenants)",
    ]
    result = sentinel("doctor", "--region", "all", "--json")
    assert problems(result, "shard maps agree") == []
    assert problems(result, "shard map") == []


def test_a_replica_written_behind_the_managers_back_is_caught(sentinel, kazoo):
    create_tenants(sentinel)
    assert sentinel("shard", "assign", "acme", "p1", "--policy", "tenants").returncode == 0
    # zkCli-style: west's bucket rewritten by hand, the digest untouched
    path = bucket_path("tenants", bucket_of("acme", 256))
    kazoo["west"].set(path, b'{"v":1,"partitions":{"p2":["acme"]}}')
    result = sentinel("doctor", "--region", "west", "--json")
    assert result.returncode == 1
    (tampered,) = problems(result, "shard map")
    assert tampered["region"] == "west" and "behind the shard manager's back" in tampered["detail"]
    result = sentinel("doctor", "--region", "all", "--json")
    (differs,) = problems(result, "shard maps agree")
    assert "east, south: 1 key(s)" in differs["detail"] and "west: 1 key(s)" in differs["detail"]
    # the repair the finding gives: a good region's map copied over west's
    assert "sentinel shard sync --policy tenants --from GOOD --region west" in tampered["fix"]
    repaired = sentinel("shard", "sync", "--policy", "tenants", "--from", "east")
    assert repaired.returncode == 0, repaired.stderr
    assert repaired.stdout.splitlines() == [
        "west: copied 1 bucket(s) of tenants from east",
        "south: tenants already as in east",
    ]
    result = sentinel("doctor", "--region", "all", "--json")
    assert problems(result, "shard map") == problems(result, "shard maps agree") == []


@pytest.mark.parametrize(
    "node, value",
    [
        ("bucket", b"\xff not json"),
        ("bucket", b'{"v":1,"partitions":{"p1":' + b"[" * 5000 + b"]" * 5000 + b"}}"),
        ("digest", b'{"v":1,"keys":-1,"sum":"zz"}'),
    ],
    ids=["bucket-bytes", "bucket-deep", "digest-lies"],
)
def test_a_region_whose_shard_map_lies_is_reported_and_never_spreads(sentinel, kazoo, node, value):
    create_tenants(sentinel)
    assert sentinel("shard", "assign", "acme", "p1", "--policy", "tenants").returncode == 0
    path = bucket_path("tenants", bucket_of("acme", 256)) if node == "bucket" else None
    kazoo["west"].set(path or digest_path("tenants"), value)
    result = sentinel("doctor", "--region", "all", "--json")
    assert result.returncode == 1, result.stderr
    (lie,) = problems(result, "shard map")
    assert lie["region"] == "west" and lie["severity"] == "error"
    # the other regions are compared and agree; nothing of west's reaches them on a write...
    assert sentinel("shard", "assign", "bolt", "p2", "--policy", "tenants").returncode in (0, 1)
    for region in ("east", "south"):
        state = read_map_state(kazoo[region], "tenants")
        assert state.content == state.stored and state.content.keys == 2, region
    # ...nor on a sync from it: refused before anything is written
    before = {r: kazoo[r].get(digest_path("tenants"))[0] for r in ("east", "south")}
    refused = sentinel("shard", "sync", "--policy", "tenants", "--from", "west")
    assert refused.returncode == 1 and "will not be copied" in refused.stderr, refused.stderr
    assert {r: kazoo[r].get(digest_path("tenants"))[0] for r in ("east", "south")} == before
    # and a sync from a good region repairs it
    assert sentinel("shard", "sync", "--policy", "tenants", "--from", "east").returncode == 0
    result = sentinel("doctor", "--region", "all", "--json")
    assert problems(result, "shard map") == problems(result, "shard maps agree") == []


def test_ls_and_doctor_take_a_region(sentinel, west, namespace):
    with Sentinel(west.connect_string, "publisher-west", namespace, announce=False) as client:
        client.register("orders", "p1", "10.1.0.7", 5432, label="a")
        result = sentinel("ls", "--region", "west", "--json")
        assert result.returncode == 0, result.stderr
        assert [d["service"] for d in json.loads(result.stdout)] == ["orders"]
        result = sentinel("ls", "orders", "--region", "west")
        assert "10.1.0.7:5432" in result.stdout
        east = sentinel("ls", "orders", "--region", "east")
        assert east.returncode == 1  # registrations are regional
        result = sentinel("doctor", "--region", "west", "--json")
        assert {f["region"] for f in findings(result)} == {"west"}
    unknown = sentinel("doctor", "--region", f"nowhere{uuid.uuid4().hex[:4]}")
    assert unknown.returncode == 2 and "no region" in unknown.stderr


def test_placement_moves_the_digest_with_the_bucket(make_client, raw_zk):
    from sentinel.shards.placement import place_key
    from sentinel.shards.store import read_spec

    client = make_client()
    client.shard_maps.create("tenants", "directory", partitions=["p1", "p2"])
    spec = read_spec(raw_zk, "tenants")
    assert place_key(raw_zk, spec, "acme", "p2") == "p2"
    assert place_key(raw_zk, spec, "acme", "p1") == "p2"  # kept: placed once
    client.shard_maps.assign("tenants", "bolt", "p1")
    client.shard_maps.unassign("tenants", "acme")
    state = read_map_state(raw_zk, "tenants")
    assert state.content == state.stored and state.content.keys == 1


@pytest.mark.parametrize(
    "value, says",
    [
        (b"\xff not json", "unreadable"),
        (b'{"v":1,"partitions":{"p2":["acme"]}}', "behind the shard manager's back"),
    ],
    ids=["garbage", "rewritten"],
)
def test_one_ensembles_doctor_reports_a_shard_map_that_lies_or_was_rewritten(
    cli_in_process, make_client, raw_zk, value, says
):
    client = make_client()
    client.shard_maps.create("tenants", "directory", partitions=["p1", "p2"])
    client.shard_maps.assign("tenants", "acme", "p1")
    raw_zk.set(bucket_path("tenants", bucket_of("acme", 256)), value)
    result = cli_in_process("doctor", "--json")
    assert result.returncode == 1, result.stderr
    (lie,) = problems(result, "shard map")
    assert lie["severity"] == "error" and says in lie["detail"] and lie["region"] is None


def test_the_daemon_copies_its_placements_and_a_region_down_catches_up(
    sentinel, kazoo, south, zookeeper, namespace, regions_file
):
    create_tenants(sentinel)
    daemon = Daemon(
        zookeeper, namespace, "shard", "serve", "--policy", "tenants", "--regions", regions_file
    )
    try:
        assert wait_until(lambda: daemon.saw("leader"), timeout=20), daemon.events
        south.members[0].stop()
        try:
            assert request_placement(kazoo["east"], "tenants", "fresh") is True
            assert wait_until(lambda: daemon.saw("replicated", region="west", key="fresh"), 20)
            assert wait_until(lambda: daemon.saw("behind", region="south"), 20), daemon.events
        finally:
            south.members[0].restart()
        assert wait_until(lambda: daemon.saw("caught up", region="south"), 30), daemon.events
        assert daemon.saw("replicated", region="south", key="fresh")
        result = sentinel("doctor", "--region", "all", "--json")
        assert problems(result, "shard maps agree") == problems(result, "shard map") == []
    finally:
        daemon.stop()


def test_region_all_is_refused_where_a_command_acts_in_one_region(sentinel):
    result = sentinel("ls", "--region", "all")
    assert result.returncode == 2 and "name one" in result.stderr, result.stderr
    result = sentinel("shard", "show", "acme", "--policy", "tenants", "--region", "all")
    assert result.returncode == 2 and "name one" in result.stderr, result.stderr


def test_a_policy_missing_in_a_region_is_reported_and_sync_creates_it(sentinel, kazoo):
    result = sentinel(
        "shard", "create-policy", "tenants", "--kind", "directory", "--region", "east"
    )
    assert result.stdout.splitlines() == ["east: created directory policy tenants"]
    assert sentinel("shard", "assign", "acme", "p9", "--policy", "tenants", "--region", "east")
    result = sentinel("doctor", "--region", "all", "--json")
    (missing,) = problems(result, "shard maps agree")
    assert "tenants is missing in west, south" in missing["detail"]
    dry = sentinel("shard", "sync", "--policy", "tenants", "--from", "east", "--dry-run")
    assert dry.returncode == 0 and kazoo["west"].exists("/shard_info/tenants") is None
    assert sentinel("shard", "sync", "--policy", "tenants", "--from", "east").returncode == 0
    result = sentinel("doctor", "--region", "all", "--json")
    assert problems(result, "shard maps agree") == problems(result, "shard map") == []
    assert read_map_state(kazoo["south"], "tenants").content.keys == 1
