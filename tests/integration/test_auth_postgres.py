"""Procedure 2 against a real PostgreSQL server: new login role works, the old one is refused."""

from __future__ import annotations

import psycopg
import pytest

from sentinel.auth import ClientKeyring
from sentinel.auth.backends import PostgresBackend
from sentinel.auth.config import AuthConfig
from sentinel.testing.helpers import wait_until
from sentinel.testing.postgres import LocalPostgres

pytestmark = pytest.mark.integration
SERVICE = "orders-db"


def login(server: LocalPostgres, credential) -> str:
    dsn = server.dsn(user=credential["user"], password=credential["password"])
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        return conn.execute("SELECT current_user").fetchone()[0]


def test_rotation_creates_a_login_role_and_drops_the_old_one(postgres, make_client):
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        conn.execute("CREATE ROLE orders_readers NOLOGIN")
    backend = PostgresBackend(postgres.dsn(), member_of="orders_readers")
    manager = make_client("auth-manager", announce=False)
    manager.ensure_service(SERVICE, scheme="postgresql")
    manager.register(
        SERVICE, "p1", postgres.host, postgres.port, scheme="postgresql", label="primary"
    )
    app = make_client("orders-api", auth=AuthConfig(keys=ClientKeyring.generate()))
    app.get_service(SERVICE)

    first = manager.credentials.rotate(SERVICE, "orders-api", backend, timeout=20)
    assert first.versions == {"orders-api": 1}
    assert wait_until(lambda: app.get_service(SERVICE).auth is not None) is not None
    old = dict(app.get_service(SERVICE).auth)
    assert old["user"] == PostgresBackend.role_name(SERVICE, "orders-api", 1)
    assert old["user"].startswith("orders_api_orders_db_") and old["user"].endswith("_v1")
    assert login(postgres, old) == old["user"]
    # Its session is ended at revocation, not left running on a revoked credential.
    held = psycopg.connect(postgres.dsn(user=old["user"], password=old["password"]))

    second = manager.credentials.rotate(SERVICE, "orders-api", backend, timeout=20)
    assert second.revoked == {"orders-api": (1,)}
    new = dict(app.get_service(SERVICE).auth)  # confirmed, so the cache has it already
    assert new["user"] == PostgresBackend.role_name(SERVICE, "orders-api", 2)
    assert login(postgres, new) == new["user"]
    with pytest.raises(psycopg.OperationalError):
        login(postgres, old)
    with pytest.raises(psycopg.OperationalError):
        held.execute("SELECT 1")
    held.close()
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        member = conn.execute(
            "SELECT pg_has_role(%s, 'orders_readers', 'MEMBER')", (new["user"],)
        ).fetchone()
    assert member == (True,)
    assert "password" not in repr(backend) and postgres.password not in repr(backend)


def test_pairs_whose_names_read_the_same_each_keep_their_own_login(postgres):
    backend = PostgresBackend(postgres.dsn())
    pairs = [("c", "a-b"), ("b-c", "a"), ("C", "A.b")]  # each once named a_b_c_v1
    first = {pair: backend.create(*pair, 1) for pair in pairs}
    assert len({credential["user"] for credential in first.values()}) == 3
    for credential in first.values():
        assert login(postgres, credential) == credential["user"]

    rotated = pairs[0]  # Procedure 2 through the backend: create the next version, revoke v1
    second = backend.create(*rotated, 2)
    backend.revoke(*rotated, 1)
    assert login(postgres, second) == second["user"]
    with pytest.raises(psycopg.OperationalError):
        login(postgres, first[rotated])
    for pair in pairs[1:]:
        assert login(postgres, first[pair]) == first[pair]["user"]  # password not reset
    backend.revoke(*pairs[1], 1)
    assert login(postgres, first[pairs[2]]) == first[pairs[2]]["user"]  # role not dropped


def test_revoking_drops_a_version_created_under_the_old_name(postgres):
    legacy = PostgresBackend.legacy_role_name(SERVICE, "orders-api", 3)
    assert legacy == "orders_api_orders_db_v3"
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {legacy} LOGIN PASSWORD 'before-the-upgrade'")
    old = {"user": legacy, "password": "before-the-upgrade"}
    assert login(postgres, old) == legacy
    PostgresBackend(postgres.dsn()).revoke(SERVICE, "orders-api", 3)
    with pytest.raises(psycopg.OperationalError):
        login(postgres, old)
