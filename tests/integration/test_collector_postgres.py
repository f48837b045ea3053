"""The ``postgres`` source against a real primary and streaming replica (Debian's packages).

The replica's replay is paused with ``pg_wal_replay_pause()`` while the primary keeps writing:
the published lag must grow, and fall back to 0 once replay resumes.
"""

import json

import psycopg
import pytest

from sentinel.collector import MetricCollector, parse_config
from sentinel.testing.helpers import wait_until

pytestmark = pytest.mark.integration

PASSWORD_VARIABLE = "SENTINEL_TEST_PG_PASSWORD"


def lag_of(raw_zk, name):
    path = f"/metrics/billing-db/{name}"
    if raw_zk.exists(path) is None:
        return None
    return json.loads(raw_zk.get(path)[0])["metrics"]["replication_lag"]


def test_replica_lag_grows_while_replay_is_paused_and_falls_after(
    postgres, make_client, raw_zk, monkeypatch
):
    replica = postgres.add_replica()
    with psycopg.connect(postgres.dsn(), autocommit=True) as primary:
        primary.execute("CREATE TABLE ledger (n int)")
        primary.execute("INSERT INTO ledger VALUES (0)")
    with psycopg.connect(replica.dsn(), autocommit=True) as standby:

        def replicated():
            try:
                return standby.execute("SELECT count(*) FROM ledger").fetchone() == (1,)
            except psycopg.errors.UndefinedTable:
                return False

        assert wait_until(replicated, 30), "the replica never caught up"

    publisher = make_client("publisher")
    publisher.ensure_service("billing-db", scheme="postgresql")
    publisher.register("billing-db", "p1", replica.host, replica.port, label="replica")
    publisher.register("billing-db", "p1", postgres.host, postgres.port, label="primary")
    monkeypatch.setenv(PASSWORD_VARIABLE, postgres.password)  # the source reads it, never logs it
    config = parse_config(
        {
            "cluster": "pg",
            "services": [
                {
                    "service": "billing-db",
                    "interval": "700ms",
                    "jitter": "0ms",
                    "timeout": "700ms",  # a fresh connection each time, on a busy machine
                    "source": {"type": "postgres", "password_env": PASSWORD_VARIABLE},
                }
            ],
        }
    )
    with (
        MetricCollector(make_client("collector"), config),
        psycopg.connect(postgres.dsn(), autocommit=True) as primary,
        psycopg.connect(replica.dsn(), autocommit=True) as standby,
    ):
        # Idle and caught up: 0, however old the last replayed transaction is.
        assert wait_until(lambda: lag_of(raw_zk, "p1:replica") == 0, 20)
        assert wait_until(lambda: lag_of(raw_zk, "p1:primary") == 0, 20)

        standby.execute("SELECT pg_wal_replay_pause()")
        seen = []

        def growing():
            primary.execute("INSERT INTO ledger VALUES (1)")  # WAL the replica cannot replay
            lag = lag_of(raw_zk, "p1:replica")
            if lag and (not seen or lag != seen[-1]):
                seen.append(lag)
            return len(seen) >= 3 and seen[-1] > 1.0

        assert wait_until(growing, 30, interval=0.1), seen
        assert seen == sorted(seen), f"the lag did not grow steadily while paused: {seen}"

        standby.execute("SELECT pg_wal_replay_resume()")
        assert wait_until(lambda: lag_of(raw_zk, "p1:replica") == 0, 20)
        assert lag_of(raw_zk, "p1:primary") == 0
