"""The PostgreSQL launcher: a primary, a streaming replica, and where the binaries come from."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from sentinel.errors import PostgresNotInstalled
from sentinel.testing.helpers import wait_until
from sentinel.testing.postgres import LocalPostgres, find_bindir

pytestmark = pytest.mark.integration


def test_replica_streams_the_primarys_writes_and_refuses_its_own(postgres: LocalPostgres) -> None:
    replica = postgres.add_replica()
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE tenants (name text)")
        conn.execute("INSERT INTO tenants VALUES ('acme')")
    with psycopg.connect(replica.dsn(), autocommit=True) as conn:

        def replicated() -> bool:
            try:
                return conn.execute("SELECT count(*) FROM tenants").fetchone() == (1,)
            except psycopg.errors.UndefinedTable:
                return False

        assert wait_until(replicated, timeout=30) is not None, "the row never reached the replica"
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO tenants VALUES ('globex')")


def test_password_is_required_over_tcp(postgres: LocalPostgres) -> None:
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(postgres.dsn(password="wrong"))


def test_stop_removes_the_data_directory() -> None:
    try:
        server = LocalPostgres().start()
    except PostgresNotInstalled as exc:
        pytest.skip(f"PostgreSQL is not installed here and could not be: {exc}")
    server.stop()
    assert not server.base_dir.exists()


def test_bindir_from_the_environment_first(tmp_path: Path) -> None:
    for tool in ("initdb", "pg_ctl", "pg_basebackup"):
        (tmp_path / tool).write_text("#!/bin/sh\n")
    assert find_bindir({"SENTINEL_PG_BINDIR": str(tmp_path)}) == tmp_path


def test_missing_binaries_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sentinel.testing.postgres.DEBIAN_ROOT", Path("/nonexistent"))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(PostgresNotInstalled, match="apt-get install postgresql"):
        find_bindir({})
