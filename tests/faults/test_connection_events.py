"""Listeners hear of a lost connection while it is lost, whatever the cache's worker was doing.

Listeners run on the cache's worker, in order with the changes they describe. A task the worker
takes up after the connection dropped (here a first load, queued behind a slow listener) must
not wait there for the connection to come back: the ``suspended`` event queued behind it would
reach the listeners only once the link is back, when it no longer tells them anything. In both
watch modes.
"""

from __future__ import annotations

import threading
import time

import pytest

from sentinel.errors import ZooKeeperUnavailable
from sentinel.events import ConnectionChanged, InstancesChanged
from sentinel.testing.helpers import wait_until
from tests.faults.conftest import relayed_reader
from tests.integration.nodes import instance

pytestmark = [pytest.mark.integration, pytest.mark.faults]


@pytest.mark.parametrize("persistent", [False, True], ids=["one-shot", "persistent"])
def test_a_listener_hears_the_connection_lost_while_it_is_lost(
    make_client, raw_zk, proxy, persistent
):
    writer, reader = relayed_reader(make_client, raw_zk, proxy, persistent, [instance("a")])
    writer.ensure_service("other")
    entered, hold = threading.Event(), threading.Event()
    heard: list[str] = []

    def slow(event: object) -> None:  # holds the worker until the link is cut
        if isinstance(event, InstancesChanged) and not entered.is_set():
            entered.set()
            hold.wait(30)

    reader.listen("api", slow)
    reader.listen(
        None, lambda e: heard.append(e.state) if isinstance(e, ConnectionChanged) else None
    )
    writer.register("api", "p1", "10.0.0.2", 80, label="b")
    assert entered.wait(10), "the listener never heard the registration"

    loaded: list[object] = []  # a first load, queued behind the listener
    loading = threading.Thread(target=lambda: loaded.append(_load(reader, "other")))
    loading.start()
    proxy.cut()
    assert wait_until(lambda: reader.connection_state == "suspended")
    hold.set()  # the worker now takes up the load, with the link down

    assert wait_until(lambda: "suspended" in heard, timeout=5), (
        f"heard {heard} while cut off: the suspension waits behind the worker's load"
    )
    assert reader.connection_state == "suspended"  # still cut off when it was heard
    proxy.restore()
    assert wait_until(lambda: heard[-1:] == ["connected"], timeout=20), heard
    loading.join(30)
    # The load the lost connection stopped ran again once connected: its reader, still
    # waiting, got the service.
    assert loaded and not isinstance(loaded[0], Exception), loaded
    assert reader.connection_state == "connected"
    assert "other" in reader.session.cache.snapshots


def _load(reader, service: str) -> object:
    """What a first lookup of ``service`` got: its snapshot, or the error it raised."""
    started = time.monotonic()
    try:
        reader.prefetch(service)
    except ZooKeeperUnavailable as exc:
        return exc
    return time.monotonic() - started
