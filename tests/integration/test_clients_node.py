"""``/clients/<service>`` created by an identity that may not: Sentinel's AccessDenied naming
the node, the right it takes and who may repair it, never kazoo's bare NoAuthError, and no
secret in the message."""

from __future__ import annotations

import warnings

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from sentinel.auth import acl as acls
from sentinel.errors import AccessDenied
from sentinel.registry.layout import CLIENTS
from sentinel.testing.zookeeper import LocalZooKeeper

pytestmark = pytest.mark.integration

ADMIN = "admin:admin-secret"
APP = "ledger-app:app-secret"


def test_a_session_that_may_not_create_a_clients_node_is_told_what_it_needs(
    zookeeper: LocalZooKeeper, namespace: str
):
    sessions = []

    def session(identity: str) -> KazooClient:
        zk = KazooClient(
            f"{zookeeper.connect_string}{namespace}", **acls.client_arguments(identity)
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No chroot path exists")
            zk.start(timeout=10)
        sessions.append(zk)
        return zk

    try:
        admin, app = session(ADMIN), session(APP)
        admin.ensure_path("/")
        # as `sentinel init --secure` leaves it: the admin's, everyone may read it
        admin.create(CLIENTS, acl=[acls.owner_acl(ADMIN), acls.WORLD_READ])

        # ZooKeeper shows the app the admin's id as "admin:x" and /clients' data names nobody
        with pytest.raises(AccessDenied) as unknown:
            acls.ensure_clients_node(app, "ledger")
        assert f"{CLIENTS}/ledger is missing" in str(unknown.value)
        assert "sentinel init --secure" in str(unknown.value)

        acls.publish_admins(admin)  # now the app knows the admins, but may not create there
        with pytest.raises(AccessDenied) as refused:
            acls.ensure_clients_node(app, "ledger")
        message = str(refused.value)
        assert f"creating {CLIENTS}/ledger" in message
        assert f"READ and CREATE rights on {CLIENTS}" in message
        assert isinstance(refused.value.__cause__, NoAuthError)

        for secret in ("admin-secret", "app-secret"):
            assert secret not in str(unknown.value) + message + repr(refused.value)
        assert app.exists(f"{CLIENTS}/ledger") is None

        acls.ensure_clients_node(admin, "ledger")  # an identity with the right creates it
        assert app.get_acls(f"{CLIENTS}/ledger")[0][-1] == acls.WORLD_READ_CREATE
        acls.ensure_clients_node(app, "ledger")  # and then it is there for everyone
    finally:
        for zk in sessions:
            zk.stop()
            zk.close()
