"""The Spark helpers against a real ZooKeeper: grouping and retries on a plain client, then
on a local SparkSession (two worker processes) resolution per partition, one ZooKeeper session
per worker process, a replica leaving during a job, and a replica dying mid-partition."""

import dataclasses
import json
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest
from pyspark import TaskContext, cloudpickle
from sentinel.policies import MinLag

from sentinel.auth import ClientKeyring, ManagerKey
from sentinel.auth.backends import FileBackend
from sentinel.auth.config import AuthConfig
from sentinel.client import Sentinel
from sentinel.errors import EndpointFailed
from sentinel.feedback import OutlierDetection
from sentinel.integrations.spark import (
    ClientConfig,
    get_client,
    resolve_groups,
    resolve_partitions,
    with_endpoint,
)
from sentinel.publisher import Registration
from sentinel.testing.helpers import wait_until

pytestmark = pytest.mark.integration

# Spark's workers do not import the tests package: ship this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SERVICE = "orders-db"
TENANTS = {f"t{i:02d}": f"p{i % 3 + 1}" for i in range(12)}
LAGS = {
    "p1": {"replica-a": 0.5, "replica-b": 2.0},
    "p2": {"replica-a": 9.0, "replica-b": 1.0},  # replica-a is past the cut-off
    "p3": {"replica-a": 0.2, "replica-b": 0.1},
}
BEST = {"p1": "replica-a", "p2": "replica-b", "p3": "replica-b"}
# The fixture publishes the lags once and no collector refreshes them, while a Spark job may
# outlive METRICS_MAX_AGE: their age is not what these tests are about.
POLICY = MinLag(cutoff=5, max_age=None)
ROWS = [(tenant, amount) for amount in range(1, 5) for tenant in TENANTS]


@dataclass
class World:
    publisher: Sentinel
    registrations: dict[tuple[str, str], Registration]
    config: ClientConfig


@pytest.fixture
def world(make_client, zookeeper, namespace):
    publisher = make_client("publisher")
    publisher.shard_maps.create("tenants", "directory", partitions=list(LAGS))
    publisher.shard_maps.assign_many("tenants", TENANTS)
    publisher.ensure_service(SERVICE, scheme="sqlite", shard_policy="tenants")
    registrations = {}
    for port, (partition, label, lag) in enumerate(
        (p, label, lag) for p, lags in LAGS.items() for label, lag in lags.items()
    ):
        registrations[partition, label] = publisher.register(
            SERVICE, partition, "127.0.0.1", 7000 + port, scheme="sqlite", label=label
        )
        publisher.update_metrics(SERVICE, partition, label, {"replication_lag": lag})
    config = ClientConfig(hosts=zookeeper.connect_string, namespace=namespace, client_id="etl")
    return World(publisher, registrations, config)


def served(endpoint, rows):
    """One result per row: which replica served it."""
    return [(row[0], row[1], endpoint.partition, endpoint.label) for row in rows]


def failing_on(dead, calls):
    """``served``, except that a replica named in ``dead`` fails half-way through a group."""

    def fn(endpoint, rows):
        calls.append(endpoint.name)
        for done, row in enumerate(rows):
            if endpoint.name in dead and done == len(rows) // 2:
                raise ConnectionError(f"{endpoint.name} went away")
            yield (row[0], row[1], endpoint.partition, endpoint.label)

    return fn


def assert_each_row_once_from(results, label_of):
    assert Counter((t, a) for t, a, _, _ in results) == Counter(ROWS)
    for tenant, _, partition, label in results:
        assert partition == TENANTS[tenant]
        assert label == label_of(partition), (tenant, partition, label)


# --- resolve_groups on a plain client -------------------------------------------------------


def test_one_lookup_per_shard_partition_not_per_row(world, make_client, monkeypatch):
    client = make_client("etl")
    lookups = []
    real = client.get_service
    monkeypatch.setattr(client, "get_service", lambda *a: lookups.append(a[1]) or real(*a))

    results = list(resolve_groups(client, SERVICE, ROWS, served, key=0, policy=POLICY))

    assert_each_row_once_from(results, BEST.get)
    assert sorted(TENANTS[key] for key in lookups) == ["p1", "p2", "p3"]


def test_a_failing_replica_is_replaced_by_a_fresh_resolution(world, make_client):
    client = make_client("etl")
    calls = []
    fn = failing_on({"p1:replica-a"}, calls)

    results = list(resolve_groups(client, SERVICE, ROWS, fn, key=0, policy=POLICY))

    # The half-done attempt's rows are dropped; the retry serves them all from replica-b.
    assert_each_row_once_from(results, lambda p: "replica-b" if p == "p1" else BEST[p])
    assert calls.count("p1:replica-a") == 1 and calls.count("p1:replica-b") == 1


def test_retries_are_bounded(world, make_client):
    client = make_client("etl", feedback=OutlierDetection(consecutive_failures=2))
    calls = []
    fn = failing_on({"p1:replica-a", "p1:replica-b"}, calls)
    p1_rows = [row for row in ROWS if TENANTS[row[0]] == "p1"]

    with pytest.raises(EndpointFailed, match="3 attempt") as failure:
        list(resolve_groups(client, SERVICE, p1_rows, fn, key=0, policy=MinLag(), retries=2))

    assert isinstance(failure.value.__cause__, ConnectionError)
    # Both replicas failed once, then (none left) the policy's pick was tried again.
    assert calls == ["p1:replica-a", "p1:replica-b", "p1:replica-a"]
    # Each failure was reported: two of replica-a mark it down for the client's other lookups.
    down = {e.name for e in client.cached_instances(SERVICE) if client.feedback.is_down(e)}
    assert down == {"p1:replica-a"}


def test_rows_whose_key_moves_before_resolution_are_grouped_again(world, make_client):
    client = make_client("etl")
    moved = threading.Event()

    def key(row):
        # Reading the last row, the shard manager moves t00 (grouped under p1 already) to p2.
        if row is ROWS[-1] and not moved.is_set():
            moved.set()
            world.publisher.shard_maps.assign("tenants", "t00", "p2")
            assert wait_until(lambda: client.partition_of(SERVICE, "t00") == "p2")
        return row[0]

    results = list(resolve_groups(client, SERVICE, ROWS, served, key=key, policy=POLICY))

    assert {(p, label) for t, _, p, label in results if t == "t00"} == {("p2", "replica-b")}
    assert Counter((t, a) for t, a, _, _ in results) == Counter(ROWS)


# --- on a local SparkSession ----------------------------------------------------------------


def test_every_tenant_reads_from_its_partitions_least_lagging_replica(world, spark):
    rdd = spark.sparkContext.parallelize(ROWS, 4)
    df = spark.createDataFrame(rdd, "tenant string, amount long")

    rows = with_endpoint(df, SERVICE, key="tenant", policy=POLICY, config=world.config).collect()

    assert len(rows) == len(ROWS)
    for row in rows:
        assert row.sentinel_partition == TENANTS[row.tenant]
        assert row.sentinel_label == BEST[row.sentinel_partition]
        assert row.sentinel_uri.startswith("sqlite://127.0.0.1:")

    def group(endpoint, rows):
        return [(TaskContext.get().partitionId(), endpoint.partition, len(rows))]

    groups = resolve_partitions(
        df, SERVICE, group, key="tenant", policy=POLICY, config=world.config
    ).collect()
    expected = {
        (index, TENANTS[tenant])
        for index, rows in enumerate(rdd.glom().collect())
        for tenant, _ in rows
    }
    assert sorted((i, p) for i, p, _ in groups) == sorted(expected)  # one call per group
    assert sum(n for _, _, n in groups) == len(ROWS)


def test_one_zookeeper_session_per_worker_process_not_per_task(world, spark, raw_zk):
    config = world.config
    tasks = 24

    def who(endpoint, rows):
        return [(os.getpid(), get_client(config).session_id)]

    rdd = spark.sparkContext.parallelize([("t00",)] * tasks, tasks)  # one row per task
    seen = resolve_partitions(rdd, SERVICE, who, key=0, config=config).collect()

    pids = {pid for pid, _ in seen}
    sessions = {session for _, session in seen}
    assert len(seen) == tasks  # one group per task: the tasks each resolved once
    assert len(pids) < tasks  # workers were reused (spark.python.worker.reuse)
    assert len(sessions) == len(pids)
    # ZooKeeper's side: one /clients entry per worker process, owned by its session.
    entries = raw_zk.get_children(f"/clients/{SERVICE}")
    documents = [json.loads(raw_zk.get(f"/clients/{SERVICE}/{e}")[0]) for e in entries]
    owners = {raw_zk.exists(f"/clients/{SERVICE}/{e}").ephemeralOwner for e in entries}
    assert sorted(d["pid"] for d in documents if d["app"] == "etl") == sorted(pids)
    assert owners == sessions


def test_a_replica_deregistered_during_the_job_is_not_used_once_it_has_propagated(
    world, spark, tmp_path
):
    config = world.config
    gone = world.registrations["p3", "replica-b"]
    gone_name = f"{gone.partition}:{gone.label}"
    p3_rows = [(t, 1) for t in TENANTS if TENANTS[t] == "p3"]
    before, tasks = 4, 10
    go = tmp_path / "go"

    def gate(index, rows):
        """Tasks after the first few wait for the deregistration, then until this worker's
        cache has seen it (the time that took is the propagation time)."""
        if index >= before:
            assert wait_until(go.exists, 60)
            deregistered_at = float(go.read_text())
            client = get_client(config)
            seen = wait_until(
                lambda: gone_name not in {e.name for e in client.cached_instances(SERVICE)}, 30
            )
            assert seen is not None, "the deregistration never reached this worker"
            (tmp_path / f"propagated-{index}").write_text(str(time.time() - deregistered_at))
        return rows

    def record(endpoint, rows):
        index = TaskContext.get().partitionId()
        (tmp_path / f"done-{index}").touch()
        return [(index, endpoint.label)]

    rdd = spark.sparkContext.parallelize(p3_rows * tasks, tasks).mapPartitionsWithIndex(gate)
    job = resolve_partitions(rdd, SERVICE, record, key=0, policy=POLICY, config=config)
    results = []
    runner = threading.Thread(target=lambda: results.extend(job.collect()))
    runner.start()
    try:
        assert wait_until(lambda: len(list(tmp_path.glob("done-*"))) >= before, 120)
        world.publisher.deregister(gone)
        go.write_text(str(time.time()))
    finally:
        go.touch()
        runner.join(120)

    labels = dict(results)
    assert sorted(labels) == list(range(tasks))
    assert {labels[i] for i in range(before)} == {"replica-b"}  # the least lagging, at first
    assert {labels[i] for i in range(before, tasks)} == {"replica-a"}  # once it had gone
    delays = [float(p.read_text()) for p in tmp_path.glob("propagated-*")]
    print(f"deregistration reached the workers in {max(delays) * 1000:.1f} ms at most")


def test_a_replica_dying_mid_partition_is_retried_elsewhere_and_the_job_completes(world, spark):
    rdd = spark.sparkContext.parallelize(ROWS, 4)
    fn = failing_on({"p1:replica-a"}, [])

    results = resolve_partitions(
        rdd, SERVICE, fn, key=0, policy=POLICY, config=world.config
    ).collect()

    assert_each_row_once_from(results, lambda p: "replica-b" if p == "p1" else BEST[p])

    everything_dead = failing_on({"p1:replica-a", "p1:replica-b"}, [])
    job = resolve_partitions(
        rdd, SERVICE, everything_dead, key=0, policy=POLICY, config=world.config, retries=1
    )
    with pytest.raises(Exception, match="EndpointFailed"):
        job.collect()


def test_workers_given_the_key_file_read_the_clients_credential(
    world, spark, make_client, tmp_path
):
    keys = tmp_path / "etl.keys"
    ClientKeyring.generate().save(keys)
    make_client("etl", auth=AuthConfig(keys=keys))  # publishes the client's public keys
    version = world.publisher.credentials.publish(
        SERVICE, "etl", {"user": "etl", "password": "s3cret"}
    )
    config = dataclasses.replace(world.config, key_file=str(keys))

    def credential(endpoint, rows):
        return [(endpoint.auth["user"], endpoint.auth["password"], endpoint.auth.version)]

    rdd = spark.sparkContext.parallelize(ROWS, 4)
    seen = set(resolve_partitions(rdd, SERVICE, credential, key=0, config=config).collect())

    assert seen == {("etl", "s3cret", version)}


def test_workers_given_the_manager_key_accept_only_signed_credentials(world, make_client, tmp_path):
    keys, signing_key = tmp_path / "etl.keys", ManagerKey.generate()
    ClientKeyring.generate().save(keys)
    make_client(
        "etl-setup",
        auth=AuthConfig(keys=keys, client="etl"),
    )  # publishes the public keys
    world.publisher.credentials.publish(SERVICE, "etl", {"user": "etl", "password": "unsigned"})
    config = dataclasses.replace(
        world.config, key_file=str(keys), auth_signer=signing_key.public_text
    )
    assert cloudpickle.loads(cloudpickle.dumps(config)) == config  # plain values travel
    worker = get_client(config)  # what each worker process does on its first task
    try:
        assert worker.get_service(SERVICE, "t00").auth is None
        assert worker.cache_stats.auth_errors >= 1
        world.publisher.credentials.publish(
            SERVICE, "etl", {"user": "etl", "password": "signed"}, signer=signing_key
        )

        def signed() -> bool:
            auth = worker.get_service(SERVICE, "t00").auth
            return auth is not None and auth["password"] == "signed"

        assert wait_until(signed)
    finally:
        worker.close()


def test_a_credential_rotation_during_the_job_is_picked_up_without_failing_it(
    world, spark, make_client, tmp_path
):
    keys = tmp_path / "etl.keys"
    ClientKeyring.generate().save(keys)
    make_client(
        "etl-setup",
        auth=AuthConfig(keys=keys, client="etl"),
    )  # publishes the public keys
    store = tmp_path / "credentials.json"
    backend = FileBackend(store)
    world.publisher.credentials.publish(SERVICE, "etl", backend.create(SERVICE, "etl", 1))
    config = dataclasses.replace(world.config, key_file=str(keys))
    before, tasks = 4, 10
    go = tmp_path / "go"

    def gate(index, rows):
        if index >= before:
            assert wait_until(go.exists, 120)
        return rows

    def use(endpoint, rows):
        # What a database would say of the credential at the moment the task logs in.
        accepted = FileBackend(store).accepts(SERVICE, "etl", dict(endpoint.auth))
        index = TaskContext.get().partitionId()
        (tmp_path / f"done-{index}").touch()
        return [(index, endpoint.auth.version, accepted)]

    rdd = spark.sparkContext.parallelize(ROWS[:3] * tasks, tasks).mapPartitionsWithIndex(gate)
    job = resolve_partitions(rdd, SERVICE, use, key=0, config=config)
    results = []
    runner = threading.Thread(target=lambda: results.extend(job.collect()))
    runner.start()
    try:
        assert wait_until(lambda: len(list(tmp_path.glob("done-*"))) >= before, 120)
        # Procedure 2 waits for every live worker process, then revokes version 1.
        rotated = world.publisher.credentials.rotate(SERVICE, "etl", backend, timeout=60)
        go.write_text("rotated")
    finally:
        go.touch()
        runner.join(120)

    assert rotated.revoked == {"etl": (1,)}
    assert all(accepted for _, _, accepted in results), results  # never a refused login
    versions = {index: version for index, version, _ in results}
    assert sorted(versions) == list(range(tasks))
    assert {versions[i] for i in range(before)} == {1}
    assert {versions[i] for i in range(before, tasks)} == {2}  # after the rotation: the new one
