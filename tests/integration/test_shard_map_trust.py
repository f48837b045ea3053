"""A shard map that lies is refused by every reader alike (issue 50, item 5).

Whoever may write ``/shard_info`` can put a key in a bucket that is not its own, or assign it
to a partition the policy does not declare, and write the digest so that it adds up. Each
reader of a map checks every bucket with the one function
(:func:`sentinel.shards.spec.decode_bucket`): the cache skips the bucket (counted) and keeps
what it held, the host agent's processes keep serving the service, the snapshot file is
refused, ``sentinel shard sync`` copies nothing, and ``sentinel doctor`` names the key.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from sentinel.cache.snapshot_file import (
    dump_snapshot,
    instance_entry,
    load_snapshot,
    policy_entry,
    service_entry,
)
from sentinel.errors import PartitionNotFound, SnapshotRejected
from sentinel.private_files import write_private
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.layout import SHARD_INFO
from sentinel.registry.records import InstanceRecord
from sentinel.shards.digest import MapDigest, digest_path
from sentinel.shards.spec import bucket_of, bucket_path, encode_bucket
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from tests.conftest import sentinel_in_process

pytestmark = pytest.mark.integration

POLICY = "tenants"
SERVICE = "orders-db"
BUCKETS = 256
ASSIGNED = {"acme": "p1", "globex": "p2"}
HOME = bucket_of("acme", BUCKETS)  # the bucket the forger rewrites


@dataclass(frozen=True)
class Forgery:
    """What the forger planted in bucket ``HOME``: ``key`` assigned to ``partition``."""

    key: str
    partition: str
    text: str  # the bucket's forged value

    def resolves_forged(self, client) -> bool:
        """Whether ``client`` sends the forged key to the forger's partition."""
        try:
            return client.partition_of(SERVICE, self.key) == self.partition
        except PartitionNotFound:
            return False


def _key(wanted: Callable[[int], bool]) -> str:
    return next(k for k in (f"tenant-{i}" for i in range(10_000)) if wanted(bucket_of(k, BUCKETS)))


def forgery(kind: str) -> Forgery:
    """A key in another bucket than its own (a declared partition), or a key in its own
    bucket assigned to a partition the policy does not declare."""
    if kind == "misplaced":
        key, partition = _key(lambda bucket: bucket != HOME), "p2"
    else:
        key, partition = _key(lambda bucket: bucket == HOME), "p9"
    held = {k: p for k, p in ASSIGNED.items() if bucket_of(k, BUCKETS) == HOME}
    path = bucket_path(POLICY, HOME)
    return Forgery(key, partition, encode_bucket(path, {**held, key: partition}).decode())


def plant(zk: KazooClient, forged: Forgery) -> None:
    """Write the forged bucket, and the digest the forged map adds up to: only the checks
    against the policy can tell."""
    digest = MapDigest.of([*ASSIGNED.items(), (forged.key, forged.partition)])
    transaction = zk.transaction()
    transaction.set_data(bucket_path(POLICY, HOME), forged.text.encode())
    transaction.set_data(digest_path(POLICY), digest.to_bytes(digest_path(POLICY)))
    assert all(result is True or result for result in transaction.commit())


@pytest.fixture
def admin(make_client):
    admin = make_client("admin", announce=False, agent=False)
    admin.shard_maps.ensure(POLICY, "directory", partitions=["p1", "p2"])
    admin.shard_maps.assign_many(POLICY, ASSIGNED)
    admin.ensure_service(SERVICE, scheme="postgresql", shard_policy=POLICY)
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    admin.register(SERVICE, "p2", "10.0.2.1", 5432, label="b")
    return admin


@pytest.fixture(scope="module")
def west() -> Iterator[LocalZooKeeper]:
    """A second region's ensemble, for ``shard sync``."""
    with LocalZooKeeper() as zk:
        yield zk


@dataclass
class Readers:
    """What each reader's check needs."""

    make_client: Callable[..., object]
    raw_zk: KazooClient
    zookeeper: LocalZooKeeper
    namespace: str
    tmp_path: Path
    west: LocalZooKeeper | None = None


def refused_by_the_cache(readers: Readers, forged: Forgery) -> None:
    """A client following ZooKeeper skips the bucket (counted) and keeps it as it held it."""
    client = readers.make_client("app", announce=False, agent=False)
    assert client.partition_of(SERVICE, "acme") == "p1"
    errors = client.cache_stats.decode_errors
    plant(readers.raw_zk, forged)
    assert wait_until(lambda: client.cache_stats.decode_errors > errors), "the bucket was taken"
    assert client.partition_of(SERVICE, "acme") == "p1"  # the bucket held before
    assert not forged.resolves_forged(client)
    assert client.get_service(SERVICE, key="acme").partition == "p1"


def refused_by_the_agent_link(readers: Readers, forged: Forgery) -> None:
    """The host agent's own cache keeps the forged bucket out, so a process started after it
    serves the service; and a process handed a forged map (an agent that lies) keeps its
    map's bucket and still applies the service's state."""
    from sentinel.agent.server import AgentServer

    # A short path: sun_path holds 108 bytes.
    socket_path = str(Path(tempfile.mkdtemp(prefix="agent-")) / "agent.sock")
    session = readers.make_client("host-agent", announce=False, agent=False)
    with AgentServer(session, socket_path, send_timeout=2.0):
        first = readers.make_client("app-1", agent=socket_path)
        assert first.partition_of(SERVICE, "acme") == "p1"
        plant(readers.raw_zk, forged)
        assert wait_until(lambda: session.cache_stats.decode_errors > 0), "the agent took it"
        later = readers.make_client("app-2", agent=socket_path)
        later.prefetch(SERVICE)  # its whole state, the map with it
        assert later.partition_of(SERVICE, "acme") == "p1"
        assert not forged.resolves_forged(later)
        # An agent that sends the forged bucket: the service's state is applied all the same.
        cache = first.session.cache
        good = policy_entry(POLICY, cache.shard_maps[POLICY])
        lie = {**good, "buckets": {**good["buckets"], str(HOME): forged.text}}
        newcomer = Endpoint.from_record(InstanceRecord(SERVICE, "p1", "z", "10.0.1.9", 5432))
        entry = service_entry(SERVICE, cache.snapshots[SERVICE])
        entry = {
            **entry,
            "instances": {**entry["instances"], "p1:z": instance_entry("p1:z", newcomer)},
        }
        errors = first.cache_stats.decode_errors
        cache._follower.receive(  # the link's reader hands every frame to it
            {"op": "service", "service": SERVICE, "entry": entry, "policies": {POLICY: lie}}
        )
        assert wait_until(lambda: "p1:z" in {e.name for e in first.cached_instances(SERVICE)})
        assert first.cache_stats.decode_errors == errors + 1
        assert first.partition_of(SERVICE, "acme") == "p1"
        assert not forged.resolves_forged(first)


def refused_by_the_snapshot_file(readers: Readers, forged: Forgery) -> None:
    """A snapshot file holding the forged bucket is refused whole, naming the key."""
    client = readers.make_client("app", announce=False, agent=False)
    client.prefetch(SERVICE)
    cache = client.session.cache
    hosts = readers.zookeeper.connect_string
    document = dump_snapshot(
        dict(cache.snapshots), dict(cache.shard_maps), readers.namespace, hosts
    )
    document["shard_maps"][POLICY]["buckets"][str(HOME)] = forged.text
    path = readers.tmp_path / "snapshot.json"
    write_private(path, json.dumps(document).encode())
    with pytest.raises(SnapshotRejected) as refused:
        load_snapshot(path, readers.namespace, hosts)
    assert repr(forged.key) in str(refused.value), refused.value
    assert repr(forged.partition) in str(refused.value), refused.value


def refused_by_shard_sync(readers: Readers, forged: Forgery) -> None:
    """``sentinel shard sync --from`` the lying region: exit 1, the key named, nothing
    written in the other region."""
    assert readers.west is not None
    plant(readers.raw_zk, forged)
    document = {
        "local": "east",
        "regions": {
            "east": {"hosts": readers.zookeeper.connect_string, "namespace": readers.namespace},
            "west": {"hosts": readers.west.connect_string, "namespace": readers.namespace},
        },
    }
    regions = readers.tmp_path / "regions.json"
    regions.write_text(json.dumps(document))
    result = sentinel_in_process(
        "shard", "sync", "--policy", POLICY, "--from", "east", "--regions", str(regions),
        "--timeout", "3",
    )  # fmt: skip
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "will not be copied" in result.stderr, result.stderr
    assert repr(forged.key) in result.stderr and repr(forged.partition) in result.stderr
    west = KazooClient(hosts=readers.west.connect_string)
    west.start(timeout=10)
    try:
        assert west.exists(f"{readers.namespace}{SHARD_INFO}/{POLICY}") is None
    finally:
        west.stop()
        west.close()


def refused_by_doctor(readers: Readers, forged: Forgery) -> None:
    """``sentinel doctor`` reports the map as an error naming the key and the bucket."""
    plant(readers.raw_zk, forged)
    result = sentinel_in_process(
        "doctor", "--json", "--zk", readers.zookeeper.connect_string,
        "--namespace", readers.namespace,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    (lie,) = [f for f in json.loads(result.stdout) if f["check"] == "shard map"]
    assert lie["severity"] == "error", lie
    assert repr(forged.key) in lie["detail"] and bucket_path(POLICY, HOME) in lie["detail"]
    assert "shard sync" in lie["fix"] or "restore" in lie["fix"]


READERS = {
    "cache": refused_by_the_cache,
    "agent": refused_by_the_agent_link,
    "snapshot": refused_by_the_snapshot_file,
    "sync": refused_by_shard_sync,
    "doctor": refused_by_doctor,
}


@pytest.mark.parametrize("kind", ["misplaced", "undeclared"])
@pytest.mark.parametrize("reader", list(READERS))
def test_a_map_that_lies_is_refused_by_every_reader_alike(
    reader, kind, admin, make_client, raw_zk, zookeeper, namespace, tmp_path, request
):
    """A map with a misplaced key or an undeclared partition, its digest adding up, refused
    by ``shard sync``, every reader and ``doctor`` alike."""
    readers = Readers(make_client, raw_zk, zookeeper, namespace, tmp_path)
    if reader == "sync":
        readers.west = request.getfixturevalue("west")  # a second ensemble only for it
    READERS[reader](readers, forgery(kind))
