"""A write the connection interrupts may or may not have happened: retrying it must be safe."""

from __future__ import annotations

import pytest
from kazoo.exceptions import ConnectionLoss

from sentinel.errors import ConnectionInterrupted

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_a_deregistration_the_connection_interrupted_can_be_retried(
    make_client, raw_zk, monkeypatch
):
    client = make_client("publisher")
    registration = client.register("api", "p1", "10.0.0.1", 80, label="a")
    real_delete = client.session.zk.delete

    def lost(*args, **kwargs):  # the request never reached the server
        raise ConnectionLoss()

    monkeypatch.setattr(client.session.zk, "delete", lost)
    with pytest.raises(ConnectionInterrupted):
        client.deregister(registration)
    assert raw_zk.exists(registration.path) is not None
    monkeypatch.setattr(client.session.zk, "delete", real_delete)
    assert client.deregister(registration) is True, "the retry found nothing to remove"
    assert raw_zk.exists(registration.path) is None
    assert client.registrations == ()


def test_a_lost_session_id_mid_write_is_a_connection_loss(make_client, monkeypatch):
    """kazoo clears ``client_id`` when the connection drops, even between two requests of
    one write; the ephemeral-node keeper must treat that as the connection loss it is."""
    client = make_client("publisher")
    registration = client.register("api", "p1", "10.0.0.1", 80, label="a")
    monkeypatch.setattr(type(client.session.zk), "client_id", property(lambda _: None))
    with pytest.raises(ConnectionInterrupted):
        client.register("api", "p1", "10.0.0.1", 80, label="a")  # exists: compares owner
    monkeypatch.undo()
    assert client.deregister(registration) is True
