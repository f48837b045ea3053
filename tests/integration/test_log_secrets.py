"""kazoo's logs at every level, captured while clients with an identity connect: no password."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest

from sentinel import Sentinel
from sentinel.auth.acl import IDENTITY_ENV
from tests.conftest import SENTINEL

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-pw"


def test_kazoo_logs_of_a_client_with_an_identity_never_carry_its_passwords(
    zookeeper, namespace, caplog
):
    caplog.set_level(1, logger="kazoo")  # below DEBUG: kazoo's BLATHER too
    with Sentinel(
        zookeeper.connect_string,
        "secretive",
        namespace,
        identity=f"user:{PASSWORD}",
        prometheus_registry=None,
    ) as client:
        client.ensure_service("api", scheme="http")
        _, session_password = client._zk.client_id  # joins the session: a secret too
    auth_records = [r for r in caplog.records if "Auth(" in r.getMessage()]
    assert auth_records, "kazoo logged no Auth request: the test would prove nothing"
    assert "auth='user:***'" in auth_records[0].getMessage()
    assert PASSWORD not in caplog.text
    assert session_password.hex() not in caplog.text
    assert repr(session_password)[2:-1] not in caplog.text
    assert all(PASSWORD not in f"{r.msg} {r.args}" for r in caplog.records)


def test_sentinel_vv_ls_never_prints_the_identitys_password(zookeeper, namespace):
    subprocess.run(
        [SENTINEL, "init", "--zk", zookeeper.connect_string, "--namespace", namespace], check=True
    )
    result = subprocess.run(
        [SENTINEL, "-vv", "ls", "--zk", zookeeper.connect_string, "--namespace", namespace],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, IDENTITY_ENV: f"publisher:{PASSWORD}"},
    )
    assert result.returncode == 0, result.stderr
    assert "scheme='digest', auth='publisher:***'" in result.stderr
    assert PASSWORD not in result.stderr + result.stdout
    assert logging.getLevelName(logging.DEBUG) in result.stderr
