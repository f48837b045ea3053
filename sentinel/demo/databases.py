"""The demo's databases behind one small interface: real PostgreSQL when installed, else SQLite.

Per shard partition a primary takes the orders and replicas follow it. :class:`PostgresDatabases`
starts real servers (:class:`~sentinel.testing.postgres.LocalPostgres`: ``initdb``, then
``pg_basebackup -R`` streaming replicas), pauses a replica's WAL replay to make it lag, has the
metric collector's ``postgres`` source measure that lag on the replica, issues the job's
credentials as PostgreSQL login roles (:class:`~sentinel.auth.backends.PostgresBackend`) and
reads through :mod:`sentinel.integrations.postgres`. :class:`SqliteDatabases` plays the same
parts with files (:mod:`sentinel.demo.world`). :func:`choose` picks one and says why.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sentinel.auth.backends import FileBackend, PostgresBackend
from sentinel.demo.job import Aggregate, JobReads
from sentinel.demo.world import Partition, Ticker, Totals
from sentinel.errors import PostgresNotInstalled
from sentinel.integrations.spark import resolve_partitions
from sentinel.testing.helpers import wait_until

if TYPE_CHECKING:
    from pyspark import RDD

    from sentinel.auth.manager import CredentialBackend
    from sentinel.testing.postgres import LocalPostgres

READERS = "demo_readers"  # the group role every issued credential is a member of
MONITOR = "demo_monitor"  # the collector's login on every server
MONITOR_PASSWORD_ENV = "SENTINEL_DEMO_MONITOR_PASSWORD"
CATCH_UP = 30.0  # seconds a running replica may take to replay a write
REPLAYED = "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn"
ORDERS_TABLE = (
    "CREATE TABLE orders (seq bigserial PRIMARY KEY, tenant text NOT NULL, "
    "amount integer NOT NULL, committed_at timestamptz NOT NULL DEFAULT now())"
)


@dataclass(frozen=True)
class Replica:
    """One replica as its publisher process registers it."""

    partition: str
    label: str
    host: str
    port: int
    properties: Mapping[str, str] = field(default_factory=dict)


class Databases(Protocol):
    """What the demo does with its databases; the implementations below are the two kinds."""

    scheme: str  # the service's scheme in the registry
    kind: str  # how step 3 names them
    destroyed: str  # what happens to a killed replica's database
    collect_every: str  # the collector's interval (and timeout) for these databases

    def start(self, partitions: Sequence[str]) -> None:
        """Begin creating every primary and replica, in the background (PostgreSQL servers
        take seconds: the demo starts Spark and ZooKeeper meanwhile)."""

    def wait_ready(self) -> None:
        """Wait until :meth:`start` has finished; raise what it raised."""

    def stop(self) -> None:
        """Stop and remove every database (after a start under way has finished)."""

    def write(self, partition: str, orders: Sequence[tuple[str, int]]) -> None:
        """Commit ``orders`` (tenant, amount) on the primary; returns once every running,
        unpaused replica of the partition has them."""

    def replicas(self) -> list[Replica]:
        """Every replica, to register."""

    def pause(self, partition: str, label: str) -> None:
        """Stop one replica's replay: it falls behind as its primary takes writes."""

    def destroy(self, partition: str, label: str) -> None:
        """Take one replica's database away, as a dead host does."""

    def primary_totals(self, partition: str, tenants: Sequence[str]) -> Totals:
        """The primary's orders and total per tenant: what every replica says once caught up."""

    def collector_source(self) -> tuple[str, dict[str, str]]:
        """The collector sidecar's ``[services.source]`` TOML table and the environment it
        needs."""

    def credentials(self) -> CredentialBackend:
        """The backend that creates and revokes the job's logins."""

    def read(self, rows: RDD, job: JobReads) -> RDD:
        """The job's reads: ``(tenant, orders, total, partition, label)`` for every
        ``(tenant,)`` row, each read attempt appended to ``job.progress``."""


def choose(workdir: Path, labels: Sequence[str], wanted: str | None) -> tuple[Databases, str]:
    """PostgreSQL when its server and the ``postgres`` extra are installed (or ``wanted`` is
    ``"postgresql"``), else SQLite (or ``wanted="sqlite"``); returns them and one line why."""
    if wanted == "sqlite":
        return SqliteDatabases(workdir, labels), "SQLite files (--databases sqlite)"
    try:
        from sentinel.testing.postgres import find_bindir

        bindir = find_bindir()
        import psycopg_pool  # noqa: F401  (the 'postgres' extra)
    except (PostgresNotInstalled, ImportError) as exc:
        if wanted == "postgresql":
            raise
        missing = "the 'postgres' extra" if isinstance(exc, ImportError) else "PostgreSQL"
        reason = f"{missing} is not installed here, so the databases are SQLite files"
        return SqliteDatabases(workdir, labels), reason
    return PostgresDatabases(bindir, labels), f"PostgreSQL servers ({bindir})"


class _StartsInBackground:
    """:meth:`Databases.start`, :meth:`~Databases.wait_ready` and :meth:`~Databases.stop`
    around the ``_create(partitions)`` and ``_remove()`` of a kind."""

    _starter: threading.Thread | None = None
    _failure: BaseException | None = None

    def _create(self, partitions: Sequence[str]) -> None:
        raise NotImplementedError

    def _remove(self) -> None:
        raise NotImplementedError

    def start(self, partitions: Sequence[str]) -> None:
        def create() -> None:
            try:
                self._create(partitions)
            except BaseException as exc:  # raised by wait_ready, on the demo's thread
                self._failure = exc

        self._starter = threading.Thread(target=create, name="demo-databases", daemon=True)
        self._starter.start()

    def wait_ready(self) -> None:
        if self._starter is not None:
            self._starter.join()
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        if self._starter is not None:
            self._starter.join()
        self._remove()


def _each_in_thread(action: Callable[[Any], None], items: Sequence[Any]) -> None:
    """``action(item)`` for every item, each on a thread of its own (server commands wait on
    processes); raises the first failure once all are done."""
    failures: list[BaseException] = []

    def run(item: Any) -> None:
        try:
            action(item)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


class SqliteDatabases(_StartsInBackground):
    """Primaries and replicas as SQLite files in ``workdir``; replicas replay every 0.2 s."""

    scheme = "sqlite"
    kind = "SQLite files"
    destroyed = "database file removed"
    collect_every = "200ms"

    def __init__(self, workdir: Path, labels: Sequence[str]) -> None:
        self.workdir = workdir
        self.labels = list(labels)
        self.partitions: dict[str, Partition] = {}
        self._logins = FileBackend(workdir / "logins.json")  # the logins the databases accept
        self._ticker = Ticker(self._replicate, 0.2)

    def _replicate(self) -> None:
        for db in self.partitions.values():
            db.replay()

    def _create(self, partitions: Sequence[str]) -> None:
        self.partitions = {p: Partition(self.workdir, p, self.labels) for p in partitions}
        self._ticker.start()

    def _remove(self) -> None:
        self._ticker.stop()  # the files go with the demo's work directory

    def write(self, partition: str, orders: Sequence[tuple[str, int]]) -> None:
        db = self.partitions[partition]
        db.write(orders)
        db.replay()

    def replicas(self) -> list[Replica]:
        found = []
        for i, (p, db) in enumerate(self.partitions.items()):
            for j, (label, path) in enumerate(db.replicas.items()):
                where = {"path": str(path), "primary": str(db.primary)}
                found.append(Replica(p, label, "127.0.0.1", 15432 + 10 * i + j, where))
        return found

    def pause(self, partition: str, label: str) -> None:
        self.partitions[partition].paused.add(label)

    def destroy(self, partition: str, label: str) -> None:
        self.partitions[partition].destroy(label)

    def primary_totals(self, partition: str, tenants: Sequence[str]) -> Totals:
        return self.partitions[partition].primary_totals(tenants)

    def collector_source(self) -> tuple[str, dict[str, str]]:
        return 'type = "python"\ncallable = "sentinel.demo.world:replica_lag"\n', {}

    def credentials(self) -> FileBackend:
        return self._logins

    def read(self, rows: RDD, job: JobReads) -> RDD:
        return resolve_partitions(
            rows,
            job.service,
            Aggregate(job.progress, str(self._logins.path), job.config.client_id),
            key=0,
            policy=job.policy,
            config=job.config,
            retry_on=(sqlite3.Error,),
        )


class PostgresDatabases(_StartsInBackground):
    """Per partition a PostgreSQL primary and streaming replicas on loopback."""

    scheme = "postgresql"
    kind = "PostgreSQL servers"
    destroyed = "server stopped (immediate shutdown)"
    collect_every = "1s"  # a new connection per collection: slower than a file read

    def __init__(self, bindir: Path, labels: Sequence[str]) -> None:
        self.bindir = bindir
        self.labels = list(labels)
        self.primaries: dict[str, LocalPostgres] = {}
        self.servers: dict[tuple[str, str], LocalPostgres] = {}
        self._paused: set[tuple[str, str]] = set()
        self._gone: set[tuple[str, str]] = set()
        self._monitor_password = secrets.token_urlsafe(18)
        self._started: list[LocalPostgres] = []  # every primary, even one that failed to start

    def _create(self, partitions: Sequence[str]) -> None:
        _each_in_thread(self._start_partition, partitions)  # initdb alone takes seconds

    def _remove(self) -> None:
        # A primary stops its replicas first; throw-away servers need no shutdown checkpoint.
        _each_in_thread(lambda primary: primary.stop("immediate"), list(self._started))

    def _start_partition(self, partition: str) -> None:
        from psycopg import sql

        from sentinel.testing.postgres import LocalPostgres

        primary = LocalPostgres(bindir=self.bindir)
        self._started.append(primary)
        primary.start()
        _execute(
            primary,
            ORDERS_TABLE,
            sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(READERS)),
            sql.SQL("GRANT SELECT ON orders TO {}").format(sql.Identifier(READERS)),
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE pg_monitor").format(
                sql.Identifier(MONITOR), sql.Literal(self._monitor_password)
            ),
        )
        self.primaries[partition] = primary
        for label in self.labels:  # one at a time: each base backup takes two WAL senders
            self.servers[partition, label] = primary.add_replica()

    def write(self, partition: str, orders: Sequence[tuple[str, int]]) -> None:
        import psycopg

        with psycopg.connect(self.primaries[partition].dsn()) as conn:
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO orders (tenant, amount) VALUES (%s, %s)", list(orders)
                )
            conn.commit()
            written = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
        for label in self.labels:
            if (partition, label) in self._paused | self._gone:
                continue
            replica = self.servers[partition, label]
            with psycopg.connect(replica.dsn(), autocommit=True) as standby:

                def replayed(standby: Any = standby) -> bool:
                    return standby.execute(REPLAYED, written).fetchone() == (True,)

                if wait_until(replayed, CATCH_UP, interval=0.01) is None:
                    raise RuntimeError(f"{partition}:{label} did not replay a write")

    def replicas(self) -> list[Replica]:
        return [
            Replica(p, label, server.host, server.port)
            for (p, label), server in self.servers.items()
        ]

    def pause(self, partition: str, label: str) -> None:
        self._paused.add((partition, label))
        _execute(self.servers[partition, label], "SELECT pg_wal_replay_pause()")

    def destroy(self, partition: str, label: str) -> None:
        self._gone.add((partition, label))
        self.servers[partition, label].stop("immediate")

    def primary_totals(self, partition: str, tenants: Sequence[str]) -> Totals:
        import psycopg

        query = "SELECT tenant, count(*), sum(amount) FROM orders WHERE tenant = ANY(%s) GROUP BY 1"
        with psycopg.connect(self.primaries[partition].dsn()) as conn:
            rows = conn.execute(query, (list(tenants),)).fetchall()
        return {tenant: (count, int(total)) for tenant, count, total in rows}

    def collector_source(self) -> tuple[str, dict[str, str]]:
        source = f'type = "postgres"\nuser = "{MONITOR}"\npassword_env = "{MONITOR_PASSWORD_ENV}"\n'
        return source, {MONITOR_PASSWORD_ENV: self._monitor_password}

    def credentials(self) -> EveryPrimary:
        return EveryPrimary(list(self.primaries.values()))

    def read(self, rows: RDD, job: JobReads) -> RDD:
        from sentinel.demo.pooled import PooledTotals

        return rows.mapPartitions(PooledTotals(job))


def _execute(server: LocalPostgres, *statements: Any) -> None:
    """Run ``statements`` on ``server`` as its superuser."""
    import psycopg

    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


class EveryPrimary:
    """:class:`~sentinel.auth.backends.PostgresBackend` on every primary at once: login roles
    belong to one server (and its replicas), while the job's one credential must log in on
    every partition's replicas, so each primary's role gets the first one's password."""

    def __init__(self, primaries: Sequence[LocalPostgres]) -> None:
        self._servers = list(primaries)
        self._backends = [
            PostgresBackend(server.dsn(), member_of=READERS, dbname="postgres")
            for server in primaries
        ]

    def __repr__(self) -> str:
        return f"EveryPrimary({len(self._backends)} servers)"

    def create(self, service: str, client: str, version: int) -> Mapping[str, Any]:
        """Create the version's role on every primary, with one password."""
        from psycopg import sql

        first, *others = self._backends
        credential = first.create(service, client, version)
        same_password = sql.SQL("ALTER ROLE {} PASSWORD {}").format(
            sql.Identifier(credential["user"]), sql.Literal(credential["password"])
        )
        for server, backend in zip(self._servers[1:], others, strict=True):
            backend.create(service, client, version)
            _execute(server, same_password)
        return credential

    def revoke(self, service: str, client: str, version: int) -> None:
        """End the version's sessions and drop its role on every primary."""
        for backend in self._backends:
            backend.revoke(service, client, version)
