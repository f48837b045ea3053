"""The demo's choice of databases, and the SQLite kind playing every part the demo asks of it
(the PostgreSQL kind plays them in test_cli's demo run, on real servers)."""

import sqlite3

import pytest

from sentinel.demo.databases import PostgresDatabases, SqliteDatabases, choose
from sentinel.demo.world import replication_lag
from sentinel.errors import PostgresNotInstalled
from sentinel.testing import postgres

LABELS = ["replica-a", "replica-b"]


def test_without_postgresql_the_demo_says_it_uses_sqlite(tmp_path, monkeypatch):
    def missing():
        raise PostgresNotInstalled("no PostgreSQL server binaries found")

    monkeypatch.setattr(postgres, "find_bindir", missing)
    chosen, why = choose(tmp_path, LABELS, None)
    assert isinstance(chosen, SqliteDatabases)
    assert why == "PostgreSQL is not installed here, so the databases are SQLite files"
    with pytest.raises(PostgresNotInstalled):  # asked for by name: no quiet fallback
        choose(tmp_path, LABELS, "postgresql")


def test_postgresql_is_the_default_when_installed_and_sqlite_can_be_asked_for(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(postgres, "find_bindir", lambda: tmp_path)
    chosen, why = choose(tmp_path, LABELS, None)
    assert isinstance(chosen, PostgresDatabases) and chosen.scheme == "postgresql"
    assert why == f"PostgreSQL servers ({tmp_path})"
    chosen, why = choose(tmp_path, LABELS, "sqlite")
    assert isinstance(chosen, SqliteDatabases) and chosen.scheme == "sqlite"


def test_sqlite_databases_replicate_pause_and_die(tmp_path):
    db = SqliteDatabases(tmp_path, LABELS)
    db.start(["p1", "p2"])
    try:
        db.wait_ready()
        db.write("p1", [("acme", 5), ("acme", 7), ("globex", 1)])
        replicas = {f"{r.partition}:{r.label}": r for r in db.replicas()}
        assert sorted(replicas) == ["p1:replica-a", "p1:replica-b", "p2:replica-a", "p2:replica-b"]
        assert len({r.port for r in replicas.values()}) == 4
        paused, running = replicas["p1:replica-a"], replicas["p1:replica-b"]

        db.pause("p1", "replica-a")
        db.write("p1", [("acme", 100)])
        assert db.primary_totals("p1", ["acme", "globex"]) == {"acme": (3, 112), "globex": (1, 1)}
        # write() returns once the running replica has the orders; the paused one lags.
        assert replication_lag(running.properties["path"], running.properties["primary"]) == 0
        assert replication_lag(paused.properties["path"], paused.properties["primary"]) > 0

        db.destroy("p2", "replica-a")
        with pytest.raises(sqlite3.Error):
            replication_lag(
                replicas["p2:replica-a"].properties["path"], db.partitions["p2"].primary
            )
    finally:
        db.stop()
    source, env = db.collector_source()
    assert 'type = "python"' in source and env == {}
    assert db.credentials().path == tmp_path / "logins.json"
