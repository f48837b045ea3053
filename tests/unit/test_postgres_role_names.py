"""PostgreSQL role names of ``PostgresBackend``: one per exact (service, client, version)."""

from __future__ import annotations

import re

import pytest

from sentinel.auth.backends import PostgresBackend

role_name = PostgresBackend.role_name
# Pairs that read the same once lower-cased with '_' for other characters: a_b_c.
LOOK_ALIKES = [("c", "a-b"), ("b-c", "a"), ("C", "A.b")]


def test_pairs_that_read_the_same_get_different_roles():
    names = {role_name(service, client, 1) for service, client in LOOK_ALIKES}
    assert len(names) == 3
    assert all(name.startswith("a_b_c_") and name.endswith("_v1") for name in names)
    assert {PostgresBackend.legacy_role_name(s, c, 1) for s, c in LOOK_ALIKES} == {"a_b_c_v1"}


def test_names_are_deterministic_readable_and_per_version():
    name = role_name("orders-db", "orders-api", 7)
    assert name == role_name("orders-db", "orders-api", 7)
    assert re.fullmatch(r"orders_api_orders_db_[0-9a-f]{16}_v7", name)
    assert role_name("orders-db", "orders-api", 8) == name[: -len("7")] + "8"


@pytest.mark.parametrize("version", [1, 12, 999_999_999])
def test_long_names_fit_in_63_bytes_and_stay_distinct(version):
    base = "x" * 120
    pairs = [
        (base, base),
        (base + "a", base),  # differ only past the cut
        (base, base + "a"),
        (base.upper(), base),
        ("s", "c" * 128),
        ("s" * 128, "c"),
    ]
    names = [role_name(service, client, version) for service, client in pairs]
    assert all(len(name.encode()) <= 63 for name in names)
    assert all(re.fullmatch(r"[a-z0-9_]+", name) for name in names)
    assert len(set(names)) == len(pairs)
    assert all(name.endswith(f"_v{version}") for name in names)
