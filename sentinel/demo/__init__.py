"""``sentinel demo``: the paper's first use case end to end, on this machine.

A multi-tenant batch job on Spark reads each tenant's orders from the least-lagging replica of
the tenant's partition. The demo starts a throw-away ZooKeeper (unless given one), lets the
shard manager place the tenants on partitions, creates per partition a primary database and
replicas that follow it (each registered by an publisher process of its own), and runs the metric
collector sidecar (``sentinel collector run``), which publishes every replica's replication lag.
The databases are real PostgreSQL servers (streaming replicas) when PostgreSQL is installed, else
SQLite files (:mod:`sentinel.demo.databases`). The job's credential is created by a backend
(PostgreSQL login roles, or a file) and distributed through ``/auth``, encrypted to the job's
key. A PySpark job then aggregates every tenant's orders on its workers, logging in with the
credential they decrypted: through :mod:`sentinel.integrations.postgres`'s ``ReplicaPools`` on
PostgreSQL, through :func:`sentinel.integrations.spark.resolve_partitions` on SQLite. Halfway
through, one
replica stops replaying while its primary takes new orders, so that its lag passes the cut-off,
another replica's publisher is killed and its database taken away, and the credential is rotated by
Procedure 2; the second half of the job must read around the first two with the new credential.
Totals are checked against the primaries; the run fails if any check does.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient

from sentinel.auth import ClientKeyring
from sentinel.auth.config import AuthConfig
from sentinel.auth.manager import RotationResult
from sentinel.client import Sentinel
from sentinel.demo.databases import Databases, choose
from sentinel.demo.job import Gate, JobReads, release
from sentinel.demo.world import ReplicaPublishers, collector_sidecar
from sentinel.devserver import resolve_hosts
from sentinel.events import ChangeEvent, InstancesChanged, MetricsChanged
from sentinel.integrations.spark import ClientConfig
from sentinel.policies import MinLag
from sentinel.registry.layout import client_path
from sentinel.registry.reads import read_clients
from sentinel.shard_manager import ShardManager
from sentinel.tables import format_table
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper

if TYPE_CHECKING:
    from sentinel.auth.manager import CredentialBackend

SERVICE = "orders-db"
JOB = "demo-etl"
POLICY = "tenants"
CUTOFF = 1.0
ORDERS_PER_TENANT = 20
WAIT = 60.0
SPARK_LOGGING = """\
rootLogger.level = error
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


class _EventWaiter:
    """Remembers when each change reached the observing client's cache."""

    def __init__(self) -> None:
        self._events: list[tuple[float, ChangeEvent]] = []
        self._changed = threading.Condition()

    def __call__(self, event: ChangeEvent) -> None:
        with self._changed:
            self._events.append((time.time(), event))
            self._changed.notify_all()

    def wait(self, predicate: Callable[[ChangeEvent], bool]) -> tuple[float, ChangeEvent] | None:
        """The (wall-clock time, event) of the first matching event, None if none came."""

        def arrived() -> tuple[float, ChangeEvent] | None:
            return next(((t, e) for t, e in self._events if predicate(e)), None)

        with self._changed:
            return self._changed.wait_for(arrived, WAIT)


class _Progress:
    """Follows the job's progress file: every read attempt, as the workers append them."""

    def __init__(self, path: Path, emit: Callable[[str], None]) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._emit = emit
        self._offset = 0
        path.touch()

    def poll(self) -> None:
        """Read and print what was appended since the last poll."""
        with self.path.open(encoding="utf-8") as file:
            file.seek(self._offset)
            text = file.read()
        complete = text[: text.rfind("\n") + 1]
        self._offset += len(complete.encode("utf-8"))
        for line in complete.splitlines():
            event = json.loads(line)
            self.events.append(event)
            if "saw_lag" in event:
                continue
            tenants = ", ".join(event["tenants"])
            outcome = "read on" if event["ok"] else f"FAILED ({event['error']}) on"
            self._emit(f"  worker {event['pid']}: {tenants} {outcome} {event['replica']}")

    def tenants_read(self) -> set[str]:
        """Tenants read successfully so far."""
        return {t for e in self.events if e.get("ok") for t in e["tenants"]}


def _stop_process(process: subprocess.Popen[str]) -> None:
    """SIGTERM, as a service manager stops a daemon; SIGKILL if it does not go in 10 s."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _remove_namespace(hosts: str, namespace: str) -> None:
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=10)
    try:
        zk.delete(namespace, recursive=True)
    finally:
        zk.stop()
        zk.close()


@contextlib.contextmanager
def _spark_session(
    master: str, workdir: Path, conf: Mapping[str, str]
) -> Iterator[Callable[[], Any]]:
    """Start a SparkSession on a thread (the JVM takes seconds); yields a function that waits
    for it. Workers run this interpreter; Spark logs only errors; ``conf`` adds settings."""
    conf_dir = workdir / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "log4j2.properties").write_text(SPARK_LOGGING)
    os.environ.setdefault("SPARK_CONF_DIR", str(conf_dir))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    holder: dict[str, Any] = {}

    def start() -> None:
        from pyspark.sql import SparkSession

        try:
            holder["session"] = (
                SparkSession.builder.master(master)
                .appName("sentinel-demo")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.python.worker.reuse", "true")
                .config(map=dict(conf))
                .getOrCreate()
            )
        except Exception as exc:
            holder["error"] = exc

    starter = threading.Thread(target=start, name="demo-spark", daemon=True)
    starter.start()

    def session() -> Any:
        starter.join()
        if "error" in holder:
            raise holder["error"]
        return holder["session"]

    try:
        yield session
    finally:
        starter.join()
        if "session" in holder:
            holder["session"].stop()


@dataclass(frozen=True)
class _Stage:
    """What every step after the first works with: where to report, clean up, and connect."""

    emit: Callable[[str], None]
    stack: contextlib.ExitStack
    workdir: Path
    hosts: str
    namespace: str
    admin: Sentinel
    tenants: list[str]
    partitions: list[str]
    master: str
    databases: Databases
    # The host agent the executors' Python workers use (``--spark standalone``), or None.
    agent: Sentinel | None = None


@dataclass(frozen=True)
class _World:
    """What step 3 built: the replicas' publishers, the observer's events, the job's key and the
    backend of its logins."""

    placement: dict[str, str]
    labels: list[str]
    publishers: ReplicaPublishers
    waiter: _EventWaiter
    rng: random.Random
    keys: Path
    logins: CredentialBackend


@dataclass(frozen=True)
class _HalfWay:
    """What step 5 did half-way through the job, for the checks."""

    lagging: str
    killed: str
    late: list[str]
    killed_at: float
    rotation: RotationResult
    released: float


@dataclass(frozen=True)
class _JobRun:
    """The finished job: its rows (or error), every read attempt, and what happened meanwhile."""

    outcome: dict[str, Any]
    took: float
    tasks: int
    progress: _Progress
    half_way: _HalfWay
    vanished: tuple[float, ChangeEvent] | None


def _start_zookeeper(
    emit: Callable[[str], None], stack: contextlib.ExitStack, hosts: str | None, master: str
) -> str:
    """[1/6] A throw-away ZooKeeper unless ``hosts`` names one; returns its connect string."""
    if hosts is not None:
        emit(f"[1/6] using ZooKeeper at {hosts}; starting Spark ({master}) meanwhile ...")
        return hosts
    emit(f"[1/6] starting a throw-away ZooKeeper, and Spark ({master}) meanwhile ...")
    started = time.monotonic()
    hosts = stack.enter_context(LocalZooKeeper()).connect_string
    emit(f"  ZooKeeper serving on {hosts} after {time.monotonic() - started:.2f}s")
    return hosts


def _start_agent(
    emit: Callable[[str], None],
    stack: contextlib.ExitStack,
    hosts: str,
    namespace: str,
    socket_path: str,
) -> Sentinel:
    """The host agent the executors' workers use: one session for this host; its client."""
    from sentinel.agent.server import AgentServer

    session = stack.enter_context(
        Sentinel(hosts, "demo-host-agent", namespace, announce=False, agent=False)
    )
    stack.enter_context(AgentServer(session, socket_path))
    emit(f"  host agent serving {socket_path}: the executors' Python workers read through it")
    return session


def _place_tenants(stage: _Stage) -> dict[str, str]:
    """[2/6] A shard manager places every tenant on a partition; returns the placement."""
    tenants, partitions = stage.tenants, stage.partitions
    stage.emit(
        f"[2/6] the shard manager places {len(tenants)} tenants on {len(partitions)} partitions"
    )
    placement, took = _run_shard_manager(stage.admin, tenants, partitions)
    stage.emit(f"  placed in {took * 1000:.0f} ms:")
    stage.emit(
        format_table(
            [(p, ", ".join(t for t in tenants if placement[t] == p)) for p in partitions],
            headers=("PARTITION", "TENANTS"),
        )
    )
    return placement


def _run_shard_manager(
    sentinel: Sentinel, tenants: list[str], partitions: list[str]
) -> tuple[dict[str, str], float]:
    """Let a shard manager place every tenant; returns the placement and the seconds it took."""
    sentinel.shard_maps.create(POLICY, "directory", partitions=partitions)
    placed: dict[str, str] = {}
    changed = threading.Condition()

    def report(kind: str, details: dict[str, Any]) -> None:
        if kind == "placed":
            with changed:
                placed[details["key"]] = details["partition"]
                changed.notify_all()

    manager = ShardManager(sentinel, POLICY, report)
    runner = threading.Thread(target=manager.run, name="demo-shard-manager", daemon=True)
    runner.start()
    started = time.monotonic()
    try:
        for tenant in tenants:
            sentinel.shard_maps.request_placement(POLICY, tenant)
        with changed:
            if not changed.wait_for(lambda: len(placed) == len(tenants), WAIT):
                raise RuntimeError(f"the shard manager placed {len(placed)} of {len(tenants)}")
    finally:
        manager.stop()
        runner.join()
    return placed, time.monotonic() - started


def _start_databases(stage: _Stage, placement: dict[str, str], labels: list[str]) -> _World:
    """[3/6] Per partition a primary and replicas, each replica registered by a publisher, their
    lags published by the collector sidecar; then the job's credential."""
    databases = stage.databases
    stage.emit(
        f"[3/6] databases: per partition a primary and {len(labels)} replicas "
        f"({databases.kind}), each replica registered by its own publisher process"
    )
    started = time.monotonic()
    databases.wait_ready()
    rng = random.Random(8)
    for p in stage.partitions:
        here = [t for t in stage.tenants if placement[t] == p]
        orders = [(t, rng.randint(1, 500)) for _ in range(ORDERS_PER_TENANT) for t in here]
        databases.write(p, orders)
    stage.emit(f"  ready and filled {time.monotonic() - started:.1f}s later")
    stage.admin.ensure_service(SERVICE, scheme=databases.scheme, shard_policy=POLICY)
    publishers = _start_publishers(stage)
    observer = stage.stack.enter_context(Sentinel(stage.hosts, "demo-observer", stage.namespace))
    waiter = _EventWaiter()
    observer.prefetch(SERVICE)
    observer.listen(SERVICE, waiter)
    _start_collector(stage, observer)
    keys, logins = _create_credential(stage)
    return _World(placement, labels, publishers, waiter, rng, keys, logins)


def _start_publishers(stage: _Stage) -> ReplicaPublishers:
    """One publisher process per replica, registering it; returns once every one has."""
    publishers = ReplicaPublishers()
    stage.stack.callback(publishers.stop)
    for replica in stage.databases.replicas():
        publishers.start(
            f"{replica.partition}:{replica.label}",
            stage.hosts,
            stage.namespace,
            SERVICE,
            replica.partition,
            replica.label,
            replica.host,
            str(replica.port),
            stage.databases.scheme,
            json.dumps(dict(replica.properties)),
        )
    publishers.wait_ready(WAIT)
    return publishers


def _start_collector(stage: _Stage, observer: Sentinel) -> None:
    """The collector sidecar publishes the replicas' lags. Returns once the observer sees
    every replica's lag."""
    started = time.monotonic()
    databases = stage.databases
    sidecar = collector_sidecar(
        stage.hosts,
        stage.namespace,
        SERVICE,
        stage.workdir,
        databases.collector_source(),
        databases.collect_every,
    )
    stage.stack.callback(_stop_process, sidecar)
    expected = len(databases.replicas())

    def all_measured() -> bool:
        if sidecar.poll() is not None:
            raise RuntimeError(f"the collector sidecar exited with {sidecar.returncode}")
        found = observer.cached_instances(SERVICE)
        return len(found) == expected and all("replication_lag" in e.metrics for e in found)

    if wait_until(all_measured, WAIT) is None:
        raise RuntimeError("the collector sidecar never published every replica's lag")
    stage.emit(
        f"  {expected} replicas registered; the collector sidecar (`sentinel "
        f"collector run`, every {databases.collect_every}) had published all their lags after "
        f"{time.monotonic() - started:.1f}s"
    )


def _create_credential(stage: _Stage) -> tuple[Path, CredentialBackend]:
    """The job's key ring (public keys in /auth/.keys) and its first credential, made by a
    backend and published in /auth; returns the key file and the backend."""
    keys = stage.workdir / f"{JOB}.keys"
    ClientKeyring.generate().save(keys)
    stage.stack.enter_context(  # the job's key ring: its public keys go to /auth/.keys
        Sentinel(
            stage.hosts,
            f"{JOB}-keys",
            stage.namespace,
            auth=AuthConfig(keys=keys, client=JOB),
            announce=False,
        )
    )
    logins = stage.databases.credentials()
    first_login = stage.admin.credentials.rotate(SERVICE, JOB, logins, timeout=WAIT)
    stage.emit(
        f"  {JOB}'s credential v{first_login.versions[JOB]} created by the backend and "
        "published in /auth, encrypted to the job's key (HPKE)"
    )
    return keys, logins


def _wait_for_spark(stage: _Stage, spark: Callable[[], Any]) -> Any:
    """[4/6] The Spark session started in step 1; returns it once it is ready."""
    stage.emit("[4/6] waiting for Spark ...")
    started = time.monotonic()
    session = spark()
    stage.stack.callback(session.stop)  # before ZooKeeper stops under its workers' clients
    stage.emit(
        f"  Spark {session.version} on {stage.master} ready "
        f"(waited {time.monotonic() - started:.1f}s more)"
    )
    return session


def _run_job(stage: _Stage, world: _World, session: Any) -> _JobRun:
    """[5/6] The Spark job reads every tenant; half-way through, :func:`_disrupt` strikes."""
    tenants = stage.tenants
    tasks = max(4, (len(tenants) + 1) // 2)
    slices = [
        tenants[i * len(tenants) // tasks : (i + 1) * len(tenants) // tasks] for i in range(tasks)
    ]
    first_half = tasks // 2
    config = ClientConfig(
        hosts=stage.hosts, namespace=stage.namespace, client_id=JOB, key_file=str(world.keys)
    )
    progress = _Progress(stage.workdir / "progress.jsonl", stage.emit)
    go = stage.workdir / "go"
    rows = (
        session.sparkContext.parallelize(slices, tasks)
        .flatMap(lambda tenants: [(t,) for t in tenants])
        .mapPartitionsWithIndex(Gate(config, SERVICE, first_half, str(go), str(progress.path)))
    )
    policy = MinLag(cutoff=CUTOFF)
    job = stage.databases.read(rows, JobReads(SERVICE, config, policy, str(progress.path)))
    stage.emit(
        f"[5/6] Spark job: orders per tenant in {tasks} tasks, each tenant read from the "
        f"replica {policy!r} picks in its partition"
    )
    outcome: dict[str, Any] = {}

    def run_job() -> None:
        try:
            outcome["rows"] = job.collect()
        except Exception as exc:
            outcome["error"] = exc

    started = time.monotonic()
    runner = threading.Thread(target=run_job, name="demo-job", daemon=True)
    runner.start()
    first = {t for s in slices[:first_half] for t in s}
    deadline = time.monotonic() + WAIT
    with _driving(go, runner):
        while not first <= progress.tenants_read() and runner.is_alive():
            if time.monotonic() > deadline:
                raise RuntimeError("the first half of the job did not finish")
            progress.poll()
            time.sleep(0.05)
        half_way = _disrupt(stage, world, {t for s in slices[first_half:] for t in s})
        release(go, {"replica": half_way.lagging, "cutoff": CUTOFF})
        while runner.is_alive():
            progress.poll()
            runner.join(0.05)
    progress.poll()
    took = time.monotonic() - started
    vanished = world.waiter.wait(
        lambda e: (
            isinstance(e, InstancesChanged) and any(n.name == half_way.killed for n in e.removed)
        )
    )
    return _JobRun(outcome, took, tasks, progress, half_way, vanished)


@contextlib.contextmanager
def _driving(go: Path, runner: threading.Thread) -> Iterator[None]:
    """The driver's side of the job ``runner`` runs. When it fails, the job's second half is
    released with why (its tasks then fail at once, saying so) and the job waited for, a bounded
    time; the driver's error is the one raised, neither replaced by what releasing the job
    raises nor hidden behind a wait for a job that does not end."""
    try:
        yield
    except BaseException as exc:
        try:
            release(go, {"abort": f"{type(exc).__name__}: {exc}"})
        except OSError as cleanup:
            exc.add_note(f"and the job's second half could not be released: {cleanup}")
        runner.join(WAIT)
        raise


def _disrupt(stage: _Stage, world: _World, second_half: set[str]) -> _HalfWay:
    """Half-way: one replica stops replaying while its primary takes new orders, another's
    publisher is killed and its database removed, and the job's credential is rotated."""
    emit, label, databases = stage.emit, world.labels[0], stage.databases
    lag_partition, killed_partition = stage.partitions[:2]
    lagging, killed = f"{lag_partition}:{label}", f"{killed_partition}:{label}"
    emit(f"  -- half-way: {lagging} stops replaying while its primary takes new orders")
    databases.pause(lag_partition, label)
    late = sorted(t for t in second_half if world.placement[t] == lag_partition)
    databases.write(lag_partition, [(t, world.rng.randint(1, 500)) for _ in range(3) for t in late])
    seen = world.waiter.wait(
        lambda e: (
            isinstance(e, MetricsChanged)
            and any(
                n.name == lagging and n.metrics.get("replication_lag", 0) > CUTOFF
                for _, n in e.updated
            )
        )
    )
    if seen is not None:
        at, event = seen
        measured = next(n for _, n in event.updated if n.name == lagging)
        emit(
            f"     its lag reached {measured.metrics['replication_lag']:.2f} s > "
            f"cut-off {CUTOFF:g} s; from measurement to the observer's cache: "
            f"{(at - (measured.metrics_at or at)) * 1000:.1f} ms"
        )
    emit(f"  -- half-way: {killed}'s publisher is killed and its {databases.destroyed}")
    killed_at = time.time()
    world.publishers.kill(killed)
    databases.destroy(killed_partition, label)
    emit(f"  -- half-way: {JOB}'s credential is rotated (Procedure 2)")
    rotation = stage.admin.credentials.rotate(SERVICE, JOB, world.logins, timeout=WAIT)
    emit(
        f"     v{rotation.versions[JOB]} published next to the old one, confirmed by "
        f"every live worker in {rotation.confirmed_in * 1000:.0f} ms, then "
        f"v{', v'.join(map(str, rotation.revoked[JOB]))} revoked"
    )
    return _HalfWay(lagging, killed, late, killed_at, rotation, released=time.time())


def _check_results(stage: _Stage, world: _World, run: _JobRun) -> list[bool]:
    """[6/6] Every tenant's total against its primary, and what the job must have avoided."""
    tenants = stage.tenants
    emit, placement, half_way = stage.emit, world.placement, run.half_way
    lagging, killed, released = half_way.lagging, half_way.killed, half_way.released
    events = run.progress.events
    checks: list[bool] = []

    def check(what: str, ok: bool) -> None:
        checks.append(ok)
        emit(f"  {'ok  ' if ok else 'FAIL'} {what}")

    emit("[6/6] results, checked against the primaries")
    check(
        f"the job finished in {run.took:.1f}s"
        + (f": {run.outcome['error']!r}" if "error" in run.outcome else ""),
        "rows" in run.outcome,
    )
    results = {row[0]: row for row in run.outcome.get("rows", [])}
    truth = {t: stage.databases.primary_totals(placement[t], [t]).get(t, (0, 0)) for t in tenants}
    table = []
    for tenant in tenants:
        row = results.get(tenant)
        got = None if row is None else (row[1], row[2])
        served = "-" if row is None else f"{row[3]}:{row[4]}"
        ok = got == truth[tenant]
        table.append(
            (
                tenant,
                placement[tenant],
                served,
                *(got or ("-", "-")),
                truth[tenant][1],
                "ok" if ok else "WRONG",
            )
        )
    emit(
        format_table(
            table,
            headers=("TENANT", "PARTITION", "SERVED BY", "ORDERS", "TOTAL", "PRIMARY", ""),
        )
    )
    wrong = [row[0] for row in table if row[-1] != "ok"]
    check(
        f"every tenant's total equals its primary's "
        f"({len(tenants) - len(wrong)} of {len(tenants)})",
        not wrong,
    )
    after = [e for e in events if "tenants" in e and e["at"] >= released]
    check(
        f"after half-way no read came from {lagging} (lag past the cut-off; "
        f"{len(half_way.late)} tenants there had new orders)",
        bool(after) and all(e["replica"] != lagging for e in after if e["ok"]),
    )
    waited = [e["waited"] for e in events if "saw_lag" in e]
    if waited:
        emit(
            f"  the second half's workers waited {max(waited) * 1000:.1f} ms at most for "
            f"{lagging}'s lag to reach their own caches"
        )
    failed = [e for e in after if not e["ok"]]
    check(
        f"no read was served by the dead {killed}"
        # ReplicaPools retries inside the read: its attempts on the dead replica are not reads.
        + (f": {len(failed)} attempt(s) failed on it and were resolved again" if failed else ""),
        all(e["replica"] == killed for e in failed)
        and not any(e["ok"] and e["replica"] == killed for e in after),
    )
    vanished = run.vanished
    check(
        f"{killed}'s registration left the caches with its publisher's session, "
        + (
            "never"
            if vanished is None
            else f"{vanished[0] - half_way.killed_at:.1f} s after the kill"
        ),
        vanished is not None,
    )
    new_version = half_way.rotation.versions[JOB]
    logged_in = [e for e in events if e.get("ok")]
    check(
        f"every read logged in with a credential the databases accepted: "
        f"v{new_version} (the rotated one) for all {len(after)} reads after half-way",
        all(e["auth"] == new_version for e in logged_in if e["at"] >= released)
        and all(e["auth"] is not None for e in logged_in),
    )
    workers = {e["pid"] for e in events}
    clients = read_clients(stage.admin.session.zk).get(SERVICE, {})
    entries = {name: r for name, r in clients.items() if r.app == JOB}
    if stage.agent is None:
        check(
            f"{len(workers)} worker processes ran the {run.tasks} tasks with one ZooKeeper "
            "session each (their /clients entries)",
            sorted(r.pid for r in entries.values()) == sorted(workers),
        )
    else:
        owners = {
            stat.ephemeralOwner
            for stat in (
                stage.admin.session.zk.exists(client_path(SERVICE, name)) for name in entries
            )
            if stat is not None
        }
        check(
            f"{len(workers)} worker processes ran the {run.tasks} tasks through the host's "
            f"agent: {len(owners)} ZooKeeper session for this host, none of their own (their "
            "/clients entries, kept by the agent)",
            sorted(r.pid for r in entries.values()) == sorted(workers)
            and owners == {stage.agent.session_id},
        )
    return checks


def run_demo(
    emit: Callable[[str], None],
    hosts: str | None = None,
    namespace: str = "/sentinel-demo",
    *,
    tenants: int = 12,
    partitions: int = 3,
    replicas: int = 2,
    master: str = "local[2]",
    spark_conf: Mapping[str, str] | None = None,
    databases: str | None = None,
    agent: bool = False,
) -> bool:
    """Run the demonstration, reporting each line through ``emit``; True if every check passed.

    ``spark_conf`` adds Spark settings (a standalone cluster's ``driver_conf``). ``databases``
    is ``"postgresql"`` or ``"sqlite"``; by default PostgreSQL when it is installed, else
    SQLite (one line says so). ``agent``: the executors' Python workers take the registry
    from a host agent (``sentinel agent``) run here, the one host of a loopback cluster,
    rather than each opening a session; a check counts ZooKeeper sessions per host."""
    if partitions < 2 or replicas < 2 or tenants < 2 * partitions:
        raise ValueError("the demo needs 2+ partitions, 2+ replicas and 2+ tenants per partition")
    if hosts is not None:
        hosts = resolve_hosts(hosts)  # bad input fails here, before anything starts
    own_server = hosts is None
    names = [f"t{i:02d}" for i in range(tenants)]
    partition_names = [f"p{i + 1}" for i in range(partitions)]
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sentinel-demo-")))
        socket_path = str(workdir / "agent.sock") if agent else None
        conf = dict(spark_conf or {})
        if socket_path is not None:
            conf["spark.executorEnv.SENTINEL_AGENT"] = socket_path
        spark = stack.enter_context(_spark_session(master, workdir, conf))
        labels = [f"replica-{chr(ord('a') + r)}" for r in range(replicas)]
        chosen, why = choose(workdir, labels, databases)
        stack.callback(chosen.stop)
        chosen.start(partition_names)
        hosts = _start_zookeeper(emit, stack, hosts, master)
        emit(f"  databases: {why}, starting meanwhile")
        admin = stack.enter_context(Sentinel(hosts, "demo-admin", namespace))
        stack.callback(_remove_namespace, hosts, namespace)
        host_agent = None
        if socket_path is not None:
            host_agent = _start_agent(emit, stack, hosts, namespace, socket_path)
        stage = _Stage(
            emit,
            stack,
            workdir,
            hosts,
            namespace,
            admin,
            names,
            partition_names,
            master,
            chosen,
            host_agent,
        )

        placement = _place_tenants(stage)
        world = _start_databases(stage, placement, labels)
        session = _wait_for_spark(stage, spark)
        run = _run_job(stage, world, session)
        checks = _check_results(stage, world, run)

    emit(
        "cleaned up: publishers and Spark stopped, databases and namespace removed"
        + (", ZooKeeper stopped" if own_server else "")
    )
    emit(f"{sum(checks)} of {len(checks)} checks passed")
    return all(checks)
