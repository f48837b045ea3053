"""``sentinel.integrations.spark`` on a real Spark standalone cluster (issue 19 item 6): a master
and two workers, separate JVMs started by :mod:`sentinel.testing.spark`, each worker's executor
with its own Python worker daemon. The ZooKeeper sessions a job opens are its executors' Python
worker processes, one each, as ZooKeeper itself counts them.

The module's applications (one driver process each) run on one cluster, started once for the
module (issue 38 item 5): what differs between them is an application's setting, and starting
a master and two workers costs about as much CPU as an application. Executors, their Python
worker daemons and those daemons' workers belong to an application, so each test asserts that
they all ended once its driver exited, while the cluster's workers live on. The master's and
workers' own JVMs end when the cluster stops, after the module's last test: the fixture's
teardown stops it and asserts that none of them, and no process left in their process groups,
is still running. A failed assertion there is an error of the last test's teardown, which fails
the run as a failed test does, whichever of the module's tests ran (a final test that stops the
cluster would prove nothing when run alone, and would stop it under any test ordered after it).
"""

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sentinel.testing.helpers import wait_until
from sentinel.testing.spark import LocalSparkCluster
from sentinel.testing.zookeeper import four_letter_word
from tests.integration.spark_driver import parent_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICE = "orders-db"
TASKS = 8
ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no longer does: its parent may be gone, and with it the
    reaping)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def in_groups(groups: set[int]) -> list[int]:
    """The running processes whose process group is one of ``groups``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if fields[0] != "Z" and int(fields[2]) in groups:
                members.append(int(entry.name))
    return members


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalSparkCluster]:
    """A master and two workers for the module's applications. Once stopped, none of their JVMs
    runs, nor anything in their process groups (which a worker's executors join), or the
    teardown fails."""
    spark_cluster = LocalSparkCluster(workers=2).start()
    daemons = {daemon.name: daemon.pid for daemon in spark_cluster.daemons}
    try:
        yield spark_cluster
    finally:
        spark_cluster.stop()
    left = {name: pid for name, pid in daemons.items() if alive(pid)}
    assert not left, f"stopping the cluster left its JVMs running: {left}"
    grouped = wait_until(lambda: not in_groups(set(daemons.values())), 10)
    assert grouped is not None, (
        f"left in the cluster's process groups: {in_groups(set(daemons.values()))}"
    )


def run_job(
    cluster: LocalSparkCluster,
    directory: Path,
    make_client,
    zookeeper,
    namespace,
    raw_zk,
    conf: dict | None = None,
) -> dict:
    """The job as an application of the module's cluster: its reports, the /clients entries
    and the server's connections while the driver holds its executors, and the processes it ran
    on, each of which has ended once the driver exited (the cluster's workers have not)."""
    publisher = make_client("publisher")
    tenants = {f"t{i:02d}": f"p{i % 2 + 1}" for i in range(TASKS)}
    publisher.shard_maps.create("tenants", "directory", partitions=["p1", "p2"])
    publisher.shard_maps.assign_many("tenants", tenants)
    publisher.ensure_service(SERVICE, scheme="sqlite", shard_policy="tenants")
    for port, partition in enumerate(("p1", "p2")):
        publisher.register(SERVICE, partition, "127.0.0.1", 7000 + port, label="a")
    config = {"hosts": zookeeper.connect_string, "namespace": namespace, "client_id": "etl"}

    with (directory / "driver.log").open("w") as driver_log:
        out = directory / "reports.json"
        conf = {
            **cluster.driver_conf,
            "spark.python.worker.reuse": "true",
            "spark.ui.enabled": "false",  # the driver's web UI: a Jetty server nobody reads
            **(conf or {}),
        }
        settings = {"conf": conf, "config": config, "service": SERVICE, "tasks": TASKS}
        arguments = [cluster.master_url, json.dumps({**settings, "out": str(out)})]
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.spark_driver", *arguments],
            stdin=subprocess.PIPE,
            stdout=driver_log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
        try:
            finished = wait_until(lambda: out.exists() or driver.poll() is not None, 180)
            assert finished is not None, "the driver neither reported nor exited in 180 s"
            assert out.exists(), (directory / "driver.log").read_text()[-3000:]
            reports = json.loads(out.read_text())
            # Read while the driver holds its executors, whose workers hold their sessions.
            entries = {
                name: raw_zk.get(f"/clients/{SERVICE}/{name}")
                for name in raw_zk.get_children(f"/clients/{SERVICE}")
            }
            connections = four_letter_word("127.0.0.1", zookeeper.members[0].client_port, "cons")
            executor_hosts = {e: parent_of(e) for e in {r["executor"] for r in reports}}
        finally:
            driver.stdin.close()
            driver.wait(60)
    # The application ended with its driver: the master had its workers end its executors,
    # each executor its Python worker daemon, each daemon its Python workers.
    ran = [*executor_hosts, *{r["daemon"] for r in reports}, *{r["pid"] for r in reports}]
    ended = wait_until(lambda: not any(alive(pid) for pid in ran), 30)
    assert ended is not None, (
        f"still running after the driver exited: {[p for p in ran if alive(p)]}"
    )
    workers = cluster.worker_pids
    assert all(alive(pid) for pid in workers)  # the cluster outlives its applications
    return {
        "reports": reports,
        "entries": entries,
        "connections": connections,
        "executor_hosts": executor_hosts,
        "workers": workers,
    }


def test_sessions_are_the_executors_python_workers(
    cluster, make_client, zookeeper, namespace, raw_zk, tmp_path
):
    job = run_job(cluster, tmp_path, make_client, zookeeper, namespace, raw_zk)
    reports, entries, connections = job["reports"], job["entries"], job["connections"]
    executor_hosts, workers = job["executor_hosts"], job["workers"]

    assert len(reports) == TASKS
    assert {r["partition"] for r in reports} == {"p1", "p2"}
    # One executor JVM on each worker, each with one Python worker daemon.
    assert sorted(executor_hosts.values()) == sorted(workers)
    daemons = {r["daemon"]: r["executor"] for r in reports}
    assert sorted(daemons.values()) == sorted(executor_hosts)
    # Workers were reused across tasks, and each kept one session for all of its tasks.
    sessions = {r["pid"]: {s["session"] for s in reports if s["pid"] == r["pid"]} for r in reports}
    assert len(sessions) < TASKS
    assert all(len(s) == 1 for s in sessions.values()), sessions
    opened = {s for per_pid in sessions.values() for s in per_pid}
    assert len(opened) == len(sessions)
    # ZooKeeper's side: one /clients entry per Python worker, owned by that worker's session,
    # and each of those sessions is a live connection the server lists.
    etl = {
        name: (json.loads(data), stat.ephemeralOwner)
        for name, (data, stat) in entries.items()
        if json.loads(data)["app"] == "etl"
    }
    assert sorted(doc["pid"] for doc, _ in etl.values()) == sorted(sessions)
    assert {owner for _, owner in etl.values()} == opened
    listed = {int(sid, 16) for sid in re.findall(r"sid=0x([0-9a-f]+)", connections)}
    assert opened <= listed


def test_with_the_hosts_agent_the_executors_python_workers_open_no_session(
    cluster, make_client, zookeeper, namespace, raw_zk, tmp_path
):
    """``SENTINEL_AGENT`` in the executors' environment: every Python worker takes the
    registry from the host's agent, and ZooKeeper sees one session for the host."""
    from sentinel.agent.server import AgentServer

    socket_path = str(tmp_path / "agent.sock")
    host_agent = make_client("host-agent", announce=False, agent=False)
    with AgentServer(host_agent, socket_path):
        job = run_job(
            cluster,
            tmp_path,
            make_client,
            zookeeper,
            namespace,
            raw_zk,
            {"spark.executorEnv.SENTINEL_AGENT": socket_path},
        )
    reports = job["reports"]
    assert len(reports) == TASKS and {r["partition"] for r in reports} == {"p1", "p2"}
    assert {r["session"] for r in reports} == {None}  # no worker opened a session
    # Each worker is in /clients as before, its entry kept by the agent's one session.
    etl = [(json.loads(data), stat.ephemeralOwner) for data, stat in job["entries"].values()]
    etl = [(doc, owner) for doc, owner in etl if doc["app"] == "etl"]
    assert sorted(doc["pid"] for doc, _ in etl) == sorted({r["pid"] for r in reports})
    assert {owner for _, owner in etl} == {host_agent.session_id}
