"""Calls made from a change listener, which runs on the cache's worker thread.

Every public call of :class:`Sentinel` made there either works or raises a clear
:class:`~sentinel.errors.SentinelError` at once: none waits for the worker that is running it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from sentinel import Sentinel
from sentinel.events import InstancesChanged
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper, four_letter_word

pytestmark = pytest.mark.integration

# What "at once" means for a call made from a listener (a stall waited for the 10 s load
# timeout before the fix).
AT_ONCE = 1.0


class FromListener:
    """Runs ``call(client)`` in ``client``'s listener on the next change of service
    ``trigger``, and keeps what it returned or raised and how long it took."""

    def __init__(self, client: Sentinel, call: Callable[[Sentinel], Any]) -> None:
        self.client = client
        self.call = call
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.thread: threading.Thread | None = None

    def __call__(self, event: object) -> None:
        if self.done.is_set() or not isinstance(event, InstancesChanged):
            return
        self.thread = threading.current_thread()
        started = time.monotonic()
        try:
            self.result = self.call(self.client)
        except BaseException as exc:  # kept for the test to judge
            self.error = exc
        self.seconds = time.monotonic() - started
        self.done.set()


def call_from_listener(
    publisher: Sentinel, client: Sentinel, call: Callable[[Sentinel], Any]
) -> FromListener:
    """Make a change ``client`` hears, run ``call`` in its listener, and wait for it."""
    publisher.register_service("trigger", "p1", "10.9.0.1", 80, label="a")
    client.get_service("trigger")
    probe = FromListener(client, call)
    client.listen("trigger", probe)
    publisher.register_service("trigger", "p1", "10.9.0.2", 80, label="b")
    assert probe.done.wait(30), "the listener did not finish within 30 s"
    assert probe.thread is not threading.current_thread()
    return probe


def sessions_on_server(zookeeper: LocalZooKeeper) -> str:
    """Every connection the servers hold, with its session id (``cons``)."""
    return "".join(
        four_letter_word("127.0.0.1", member.client_port, "cons", timeout=5)
        for member in zookeeper.members
    )


def test_close_from_a_listener_ends_the_session_and_its_registrations(
    zookeeper, make_client, raw_zk
):
    publisher = make_client("publisher")
    client = make_client("closer")
    client.register_service("own", "p1", "10.9.1.1", 5432, label="mine")
    session = f"sid=0x{client.session_id:x},"
    assert session in sessions_on_server(zookeeper)

    probe = call_from_listener(publisher, client, lambda c: c.close())

    assert probe.error is None, repr(probe.error)
    assert probe.seconds < AT_ONCE
    assert client.connection_state == "closed"
    assert wait_until(lambda: session not in sessions_on_server(zookeeper), 5) is not None, (
        "the session is still open on the server"
    )
    assert raw_zk.get_children("/services/own") == []
    client.close()  # a second close is harmless
    assert client.connection_state == "closed"


def test_a_first_lookup_from_a_listener_loads_the_service_at_once(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.register_service("other", "p1", "10.9.2.1", 5432, label="x")

    probe = call_from_listener(publisher, client, lambda c: c.get_service("other"))

    assert probe.error is None, repr(probe.error)
    assert probe.seconds < AT_ONCE
    assert probe.result.host == "10.9.2.1"
    # Loaded as any lookup loads it: cached and followed from now on.
    publisher.register_service("other", "p1", "10.9.2.2", 5432, label="y")
    assert wait_until(lambda: len(client.instances("other")) == 2) is not None
