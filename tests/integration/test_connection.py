"""Connection behaviour: no server, a flapping connection, and kazoo errors as Sentinel's."""

import logging
import threading
import time

import pytest
from kazoo.client import KazooState

from sentinel import Sentinel
from sentinel.errors import ZooKeeperUnavailable
from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.testing.zookeeper import free_ports

pytestmark = pytest.mark.integration


def test_no_server_within_the_timeout_raises_and_leaves_no_threads():
    (port,) = free_ports(1)
    threads_before = threading.active_count()
    client = Sentinel(hosts=f"127.0.0.1:{port}", connect_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(ZooKeeperUnavailable, match=f"127.0.0.1:{port}.*within 1s"):
        client.start()
    # It waits out the timeout it was given, and not much more (measured 1.02-1.10 s): a
    # timeout ignored (kazoo's 15 s default) or doubled fails.
    assert 1.0 <= time.monotonic() - started < 2.0
    assert wait_until(lambda: threading.active_count() <= threads_before, timeout=5) is not None


def test_a_flapping_connection_keeps_the_session_and_writes_nothing(zookeeper, namespace, caplog):
    """A link that goes silent past the client's read timeout (not the session timeout), and
    one that drops: kazoo reconnects with the same session each time, so nothing may be
    re-registered.

    kazoo notices a silent link after two thirds of the session timeout, and the server
    expires the session at the timeout: 12 s leaves 4 s to notice and restore the link. The
    link is stalled by a relay, not by freezing the server (SIGSTOP): a frozen JVM, thawed on
    loaded cores, took longer than that margin to answer the reconnection twice in
    fresh-clone runs, and the session expired (a new id).
    """
    host, port = zookeeper.connect_string.split(":")
    proxy = TcpProxy(host, int(port))
    client = Sentinel(
        hosts=proxy.address, client_id="flappy", namespace=namespace, session_timeout=12.0
    )
    client.start()
    try:
        states: list[str] = []
        client.session.zk.add_listener(states.append)
        timeline: list[tuple[str, float]] = []  # shown if the session does not hold
        started = time.monotonic()

        def mark(what: str) -> None:
            timeline.append((what, round(time.monotonic() - started, 2)))

        registration = client.register("api", "p1", "h", 80)
        _, before = client.session.zk.get(registration.path)
        session = client.session_id
        flaps = ((proxy.pause, proxy.resume), (proxy.cut, proxy.restore))
        with caplog.at_level(logging.INFO, logger="sentinel.zk.ephemeral"):
            for fail, restore in flaps:
                mark(fail.__name__)
                fail()
                assert wait_until(lambda: KazooState.SUSPENDED in states, timeout=15), (
                    "the connection never dropped, so this test proved nothing"
                )
                mark("suspended")
                restore()
                assert wait_until(lambda: states[-1] == KazooState.CONNECTED, timeout=10)
                mark(f"connected, session 0x{client.session_id:x}")
                states.clear()
            _, after = client.session.zk.get(registration.path)
        assert client.session_id == session, (f"session 0x{session:x}", timeline)
        assert (after.czxid, after.mzxid, after.ephemeralOwner) == (
            before.czxid,
            before.mzxid,
            session,
        )
        assert "re-created" not in caplog.text
    finally:
        client.close()
        proxy.close()
