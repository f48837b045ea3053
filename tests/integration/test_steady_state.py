"""What a client keeps of a service it no longer follows (issue 53): nothing that grows with
every service it ever followed, and nothing it writes again after a session expiry."""

from __future__ import annotations

import pytest

from sentinel.registry.layout import client_path
from sentinel.registry.retire import retire_service
from sentinel.testing.helpers import expire_session, wait_until

pytestmark = pytest.mark.integration


def test_a_retired_service_leaves_no_clients_entry_behind_not_even_after_an_expiry(
    make_client, raw_zk
):
    writer = make_client("writer")
    gone = writer.register("gone", "p0", "10.0.0.1", 80, label="a")
    writer.register("kept", "p0", "10.0.0.2", 80, label="b")
    reader = make_client("reader")
    reader.get_service("gone")
    reader.get_service("kept")
    assert raw_zk.exists(client_path("gone", "reader"))

    writer.deregister(gone)
    retire_service(raw_zk, "gone", force=True)  # its /clients entries go with it
    nodes = reader.session.nodes
    assert wait_until(lambda: "gone" not in reader.session.cache.snapshots) is not None
    assert wait_until(lambda: nodes.kept(client_path("gone", "reader")) is None) is not None, (
        "the reader still keeps its entry of the retired service"
    )

    expire_session(reader)  # the new session writes again what the reader keeps
    assert wait_until(lambda: raw_zk.exists(client_path("kept", "reader")), 20) is not None
    assert raw_zk.exists("/clients/gone") is None
    assert nodes.kept(client_path("kept", "reader")) is not None
