"""sentinel.integrations.postgres against a real primary and streaming replicas.

Lag comes from the replicas themselves: replay is paused with ``pg_wal_replay_pause()`` while
the primary keeps writing, and the metric collector's ``postgres`` source publishes it, as in
test_collector_postgres. Which server answered is ``inet_server_port()``; who logged in is
PostgreSQL's own ``pg_stat_activity``.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import psycopg
import pytest
from sentinel.policies.metrics import MinLag

from sentinel.auth import ClientKeyring
from sentinel.auth.backends import PostgresBackend
from sentinel.auth.config import AuthConfig
from sentinel.collector import MetricCollector, parse_config
from sentinel.errors import EndpointFailed
from sentinel.feedback import OutlierDetection
from sentinel.integrations.postgres import AsyncReplicaPools, ReplicaPools, aconnect, connect
from sentinel.testing.helpers import wait_until

pytestmark = pytest.mark.integration

SERVICE = "orders-db"
PASSWORD_VARIABLE = "SENTINEL_TEST_PG_PASSWORD"
CUTOFF = 1.0  # seconds of replication lag
DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def served_by(pools: ReplicaPools, key: object = None) -> int:
    with pools.connection(key=key) as conn:
        return conn.execute("SELECT inet_server_port()").fetchone()[0]


def superuser(server) -> dict:
    return {"user": "postgres", "password": server.password, "dbname": "postgres"}


def start_replicas(primary, publisher, count: int) -> list:
    """``count`` streaming replicas of ``primary``, caught up and registered as p1:r<n>."""
    replicas = [primary.add_replica() for _ in range(count)]
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (n int)")
    for replica in replicas:
        with psycopg.connect(replica.dsn(), autocommit=True) as standby:

            def caught_up(standby=standby):
                row = standby.execute("SELECT to_regclass('ledger') IS NOT NULL").fetchone()
                return row == (True,)

            assert wait_until(caught_up, 30), "a replica never caught up"
    publisher.ensure_service(SERVICE, scheme="postgresql")
    for n, replica in enumerate(replicas, 1):
        publisher.register(
            SERVICE, "p1", replica.host, replica.port, scheme="postgresql", label=f"r{n}"
        )
    return replicas


def cached_lags(client) -> dict:
    return {e.label: e.metrics.get("replication_lag") for e in client.eligible_instances(SERVICE)}


def test_connections_follow_the_least_lagging_replica_under_the_cutoff(
    postgres, make_client, monkeypatch
):
    r1, r2 = start_replicas(postgres, make_client("publisher"), 2)
    monkeypatch.setenv(PASSWORD_VARIABLE, postgres.password)
    config = parse_config(
        {
            "cluster": "pg",
            "services": [
                {
                    "service": SERVICE,
                    "interval": "700ms",
                    "jitter": "0ms",
                    "timeout": "700ms",
                    "source": {"type": "postgres", "password_env": PASSWORD_VARIABLE},
                }
            ],
        }
    )
    app = make_client("orders-api")
    with (
        MetricCollector(make_client("collector"), config),
        ReplicaPools(
            app, SERVICE, policy=MinLag(cutoff=CUTOFF), min_size=1, kwargs=superuser(postgres)
        ) as pools,
        psycopg.connect(postgres.dsn(), autocommit=True) as primary,
        psycopg.connect(r1.dsn(), autocommit=True) as standby1,
        psycopg.connect(r2.dsn(), autocommit=True) as standby2,
    ):
        assert wait_until(lambda: cached_lags(app) == {"r1": 0, "r2": 0}, 20), cached_lags(app)
        assert {served_by(pools, key=t) for t in range(8)} == {r1.port, r2.port}  # a tie

        def lagging(label):
            def check():
                primary.execute("INSERT INTO ledger VALUES (1)")  # WAL a paused replica holds
                lags = cached_lags(app)
                other = "r2" if label == "r1" else "r1"
                return (lags[label] or 0) > CUTOFF and lags[other] == 0

            return check

        standby1.execute("SELECT pg_wal_replay_pause()")
        assert wait_until(lagging("r1"), 30, interval=0.1), cached_lags(app)
        assert {served_by(pools, key=t) for t in range(8)} == {r2.port}

        standby1.execute("SELECT pg_wal_replay_resume()")
        standby2.execute("SELECT pg_wal_replay_pause()")
        assert wait_until(lagging("r2"), 30, interval=0.1), cached_lags(app)
        assert {served_by(pools, key=t) for t in range(8)} == {r1.port}
        standby2.execute("SELECT pg_wal_replay_resume()")


async def served_by_async(pools: AsyncReplicaPools) -> int:
    async with pools.connection() as conn:
        return (await (await conn.execute("SELECT inet_server_port()")).fetchone())[0]


def test_a_killed_replica_costs_no_request_and_is_reported_down(postgres, make_client):
    r1, r2 = start_replicas(postgres, make_client("publisher"), 2)
    app = make_client("orders-api")  # three failures mark an instance down, by default
    async_app = make_client("orders-async", feedback=OutlierDetection(consecutive_failures=1))
    settings = {"min_size": 1, "timeout": 1, "kwargs": superuser(postgres)}

    async def with_async_pools(kill):
        async with AsyncReplicaPools(async_app, SERVICE, **settings) as pools:
            assert {await served_by_async(pools) for _ in range(4)} == {r1.port, r2.port}
            kill()
            assert {await served_by_async(pools) for _ in range(8)} == {r2.port}
            assert "p1:r1" not in repr(pools)

    with ReplicaPools(app, SERVICE, **settings) as pools:
        assert {served_by(pools) for _ in range(4)} == {r1.port, r2.port}
        asyncio.run(with_async_pools(lambda: r1.stop("immediate")))
        # Every request succeeds: the dead replica's failures stay inside the bounded retries.
        assert {served_by(pools) for _ in range(8)} == {r2.port}
        assert [e.label for e in app.eligible_instances(SERVICE)] == ["r2"]  # marked down
        assert "p1:r1" not in repr(pools)  # its pool, and its reconnecting threads, are gone


def test_an_error_inside_the_block_rolls_back_is_raised_and_is_never_retried(postgres, make_client):
    publisher, app = make_client("publisher"), make_client("ledger-api")
    publisher.ensure_service("ledger-db", scheme="postgresql")
    publisher.register("ledger-db", "p1", postgres.host, postgres.port, label="primary")
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE entries (n int)")
    runs = 0
    with ReplicaPools(app, "ledger-db", min_size=1, kwargs=superuser(postgres)) as pools:
        for error in (ZeroDivisionError, psycopg.OperationalError):
            # The block's own error, as raised, not EndpointFailed.
            with pytest.raises(error), pools.connection() as conn:
                runs += 1
                conn.execute("INSERT INTO entries VALUES (1)")
                raise error("the application's own failure")
        with pools.connection() as conn:
            conn.execute("INSERT INTO entries VALUES (2)")  # committed on a clean exit
    assert runs == 2  # each block ran once: an error inside it is never a retry
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT n FROM entries").fetchall() == [(2,)]  # the rest rolled back
    assert [e.label for e in app.eligible_instances("ledger-db")] == [
        "primary"
    ]  # not reported down


def test_connect_reports_a_dead_endpoint_and_gives_up_after_the_retries(postgres, make_client):
    (r1,) = start_replicas(postgres, make_client("publisher"), 1)
    app = make_client("orders-api")
    with connect(app, SERVICE, connect_timeout=5, **superuser(postgres)) as conn:
        assert conn.execute("SELECT inet_server_port()").fetchone() == (r1.port,)

    async def open_async():
        async with await aconnect(app, SERVICE, **superuser(postgres)) as conn:
            return await (await conn.execute("SELECT inet_server_port()")).fetchone()

    assert asyncio.run(open_async()) == (r1.port,)
    r1.stop("immediate")
    with pytest.raises(EndpointFailed) as failure:  # three attempts, all on the only replica
        connect(app, SERVICE, connect_timeout=5, **superuser(postgres))
    assert isinstance(failure.value.__cause__, psycopg.OperationalError)
    assert postgres.password not in str(failure.value)
    # Its three failures ejected it: the only replica of its partition, so by default the
    # partition is in panic and lookups still return it, saying so.
    assert app.feedback.is_down(app.get_service(SERVICE))
    assert app.explain(SERVICE).panic


def primary_with_a_credential(primary, make_client, backend):
    """The primary registered by an auth manager that issued the app its first credential:
    (manager, app, registration)."""
    manager = make_client("auth-manager", announce=False)
    manager.ensure_service(SERVICE, scheme="postgresql")
    registration = manager.register(
        SERVICE, "p1", primary.host, primary.port, scheme="postgresql", label="primary"
    )
    app = make_client("orders-api", auth=AuthConfig(keys=ClientKeyring.generate()))
    app.get_service(SERVICE)
    manager.credentials.rotate(SERVICE, "orders-api", backend, timeout=20)
    assert wait_until(lambda: app.get_service(SERVICE).auth is not None, 10)
    return manager, app, registration


class RecordingBackend(PostgresBackend):
    """PostgresBackend that looks at the server's sessions when a version is revoked."""

    def __init__(self, server):
        super().__init__(server.dsn())
        self.server = server
        self.logged_in_at_revoke: set[str] = set()
        self.old_sessions_lasted: float | None = None

    def revoke(self, service, client, version):
        # Called once every client confirmed the new version: its pools have dropped the old
        # credential's connections by then, and each one's server process exits a moment
        # later. How long the last one lasted from here (None: still there after 5 s).
        old = self.role_name(service, client, version)

        def old_sessions_gone():
            self.logged_in_at_revoke = sessions(self.server)
            return old not in self.logged_in_at_revoke

        self.old_sessions_lasted = wait_until(old_sessions_gone, 5)
        super().revoke(service, client, version)


def test_after_a_rotation_no_connection_logs_in_with_the_revoked_credential(postgres, make_client):
    backend = RecordingBackend(postgres)
    manager, app, _ = primary_with_a_credential(postgres, make_client, backend)
    v1, v2 = (PostgresBackend.role_name(SERVICE, "orders-api", v) for v in (1, 2))

    def current_user(pools):
        with pools.connection() as conn:
            return conn.execute("SELECT current_user").fetchone()[0]

    async def current_user_async(pools):
        async with pools.connection() as conn:
            return (await (await conn.execute("SELECT current_user")).fetchone())[0]

    def count_v1():
        with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
            query = "SELECT count(*) FROM pg_stat_activity WHERE usename = %s"
            return conn.execute(query, (v1,)).fetchone()[0]

    async def rotate_under_both():
        settings = {"min_size": 2, "kwargs": {"dbname": "postgres"}}
        async with AsyncReplicaPools(app, SERVICE, **settings) as async_pools:
            with ReplicaPools(app, SERVICE, **settings) as pools:
                assert current_user(pools) == v1
                assert await current_user_async(async_pools) == v1
                # Both pools' idle connections logged in.
                assert await asyncio.to_thread(wait_until, lambda: count_v1() == 4, 10)
                result = await asyncio.to_thread(
                    manager.credentials.rotate, SERVICE, "orders-api", backend, timeout=20
                )
                assert result.revoked == {"orders-api": (1,)}
                # The pools dropped v1's idle connections before the client confirmed v2,
                # so that the manager found none of them when it revoked v1.
                assert v1 not in backend.logged_in_at_revoke
                # ...and their server processes had exited, or did within a moment (measured
                # 0.04-0.09 s): a pool closed late (1.5 s after the switch) fails here.
                lasted = backend.old_sessions_lasted
                assert lasted is not None and lasted < 0.5, lasted
                assert [current_user(pools) for _ in range(3)] == [v2] * 3
                assert [await current_user_async(async_pools) for _ in range(3)] == [v2] * 3
                assert v1 not in sessions(postgres) and v2 in sessions(postgres)

    asyncio.run(rotate_under_both())


def sessions(server) -> set[str]:
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        rows = conn.execute("SELECT usename FROM pg_stat_activity").fetchall()
    return {row[0] for row in rows if row[0]}


def postgres_examples() -> list[str]:
    text = DOC.read_text()
    section = text.split("\n## PostgreSQL\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_documented_examples_run(postgres, make_client, capsys):
    """docs/integrations.md's PostgreSQL examples, with ``client`` and ``tenant`` given."""
    backend = PostgresBackend(postgres.dsn(), dbname="postgres")
    manager, app, registration = primary_with_a_credential(postgres, make_client, backend)
    manager.update_metrics(registration, {"replication_lag": 0})
    assert wait_until(lambda: app.get_service(SERVICE).metrics, 10)
    examples = postgres_examples()
    assert len(examples) == 4  # ReplicaPools, connect, SQLAlchemy's creator=, asyncio
    for code in examples:
        exec(code, {"client": app, "tenant": "acme"})
    role = PostgresBackend.role_name(SERVICE, "orders-api", 1)
    assert capsys.readouterr().out.split() == [role] * 4
