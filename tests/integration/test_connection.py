"""Connection behaviour: no server, a flapping connection, and kazoo errors as Sentinel's."""

import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooState

from sentinel import Sentinel
from sentinel.errors import ZooKeeperUnavailable
from sentinel.testing.helpers import TcpProxy, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def silent_port() -> Iterator[socket.socket]:
    """A port of 127.0.0.1 held by a socket that is bound and nothing more: no other process
    can listen there while a test runs (a port found free and let go could be taken by another
    test's server meanwhile), and a connection to it is refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held


def raises_within_its_timeout(port: int) -> None:
    """A client of ``port`` given 1 s raises ZooKeeperUnavailable after that 1 s and not much
    more (measured 1.02-1.10 s: a timeout ignored, as kazoo's 15 s default, or doubled fails),
    and leaves no thread behind."""
    threads_before = threading.active_count()
    client = Sentinel(hosts=f"127.0.0.1:{port}", connect_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(ZooKeeperUnavailable, match=f"127.0.0.1:{port}.*within 1s"):
        client.start()
    assert 1.0 <= time.monotonic() - started < 2.0
    assert wait_until(lambda: threading.active_count() <= threads_before, timeout=5) is not None


def test_no_server_within_the_timeout_raises_and_leaves_no_threads(silent_port):
    raises_within_its_timeout(silent_port.getsockname()[1])


def test_a_server_that_accepts_and_never_answers_keeps_the_timeout_too(silent_port):
    """A frozen ZooKeeper (SIGSTOP, a long pause) still accepts connections, in the kernel,
    and answers nothing: kazoo's handshake read waits out the session timeout, and its
    ``stop()`` waited for that read, so a start given 1 s took 10."""
    silent_port.listen(16)
    raises_within_its_timeout(silent_port.getsockname()[1])


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
