"""Connection behaviour: no server, a flapping connection, and kazoo errors as Sentinel's."""

import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooState

from sentinel import Sentinel
from sentinel.errors import ZooKeeperUnavailable, ZooKeeperUnreachable
from sentinel.testing.helpers import TcpProxy, wait_until
from tests.conftest import sentinel_in_process

pytestmark = pytest.mark.integration


@pytest.fixture
def silent_port() -> Iterator[socket.socket]:
    """A port of 127.0.0.1 held by a socket that is bound and nothing more: no other process
    can listen there while a test runs (a port found free and let go could be taken by another
    test's server meanwhile), and a connection to it is refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held


def raises_within_its_timeout(hosts: str) -> None:
    """A client of ``hosts`` given 1 s raises ZooKeeperUnavailable after that 1 s and not much
    more (measured 1.02-1.10 s: a timeout ignored, as kazoo's 15 s default, or doubled fails),
    never ZooKeeperUnreachable (a server that may still answer is waited for), and leaves no
    thread behind."""
    threads_before = threading.active_count()
    client = Sentinel(hosts=hosts, connect_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(ZooKeeperUnavailable, match=f"{hosts}.*within 1s") as raised:
        client.start()
    assert 1.0 <= time.monotonic() - started < 2.0
    assert not isinstance(raised.value, ZooKeeperUnreachable)
    assert wait_until(lambda: threading.active_count() <= threads_before, timeout=5) is not None


def unreachable_at_once(hosts: str) -> ZooKeeperUnreachable:
    """What a client of ``hosts`` given 15 s raises: ZooKeeperUnreachable well within 5 s (no
    wait for a timeout when nothing there can answer), leaving no thread behind."""
    threads_before = threading.active_count()
    client = Sentinel(hosts=hosts, connect_timeout=15.0)
    started = time.monotonic()
    with pytest.raises(ZooKeeperUnreachable) as raised:
        client.start()
    assert time.monotonic() - started < 5.0
    assert wait_until(lambda: threading.active_count() <= threads_before, timeout=5) is not None
    return raised.value


def test_a_refused_connection_fails_at_once_and_says_so(silent_port):
    """Nothing listens on the port (bound, not listening: refused): the start says so at
    once, typed, instead of waiting out its timeout with "no server answered"."""
    port = silent_port.getsockname()[1]
    error = unreachable_at_once(f"127.0.0.1:{port}")
    assert str(error) == (
        f"no ZooKeeper server at 127.0.0.1:{port} can be reached: "
        "connection refused (nothing listens there)"
    )
    assert error.reasons == {f"127.0.0.1:{port}": "connection refused (nothing listens there)"}


def test_a_name_that_does_not_resolve_fails_at_once_and_differs_from_a_refusal(silent_port):
    port = silent_port.getsockname()[1]
    error = unreachable_at_once("no-such-zookeeper.invalid:2181")
    assert str(error) == (
        "no ZooKeeper server at no-such-zookeeper.invalid:2181 can be reached: "
        "the name does not resolve"
    )
    both = unreachable_at_once(f"no-such-zookeeper.invalid:2181,127.0.0.1:{port}")
    assert both.reasons == {
        "no-such-zookeeper.invalid:2181": "the name does not resolve",
        f"127.0.0.1:{port}": "connection refused (nothing listens there)",
    }


def test_an_ensemble_where_some_servers_refuse_connects_to_the_one_that_answers(
    zookeeper, silent_port
):
    """kazoo tries the servers in a random order: each start below may meet the refusal and
    the unknown name first, and must still reach the server that answers."""
    hosts = (
        f"127.0.0.1:{silent_port.getsockname()[1]},no-such-zookeeper.invalid:2181,"
        f"{zookeeper.connect_string}"
    )
    for _ in range(5):
        with Sentinel(hosts=hosts, connect_timeout=15.0, prometheus_registry=None) as client:
            assert client.connection_state == "connected"


def test_a_server_that_accepts_and_never_answers_keeps_the_timeout_too(silent_port):
    """A frozen ZooKeeper (SIGSTOP, a long pause) still accepts connections, in the kernel,
    and answers nothing: kazoo's handshake read waits out the session timeout, and its
    ``stop()`` waited for that read, so a start given 1 s took 10. Beside a server that
    refuses, it is still waited for: it may answer."""
    silent_port.listen(16)
    raises_within_its_timeout(f"127.0.0.1:{silent_port.getsockname()[1]}")
    with socket.socket() as refusing:
        refusing.bind(("127.0.0.1", 0))
        port = refusing.getsockname()[1]
        raises_within_its_timeout(f"127.0.0.1:{port},127.0.0.1:{silent_port.getsockname()[1]}")


def test_a_name_lookup_that_may_pass_is_waited_for(monkeypatch):
    """No DNS server answered (EAI_AGAIN): the name may resolve at kazoo's next attempt, so
    the start waits its timeout rather than say the name does not resolve."""

    def no_answer(*args: object, **kwargs: object) -> object:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", no_answer)
    raises_within_its_timeout("zk1.example.test:2181")


def test_a_server_that_is_starting_is_waited_for_not_reported_refused(zookeeper):
    """A server that accepts connections and closes them (a starting ZooKeeper, a relay whose
    link is down) may serve at the next attempt: the start waits for it, its timeout."""
    host, port = zookeeper.connect_string.split(":")
    proxy = TcpProxy(host, int(port))
    try:
        proxy.cut()  # accepts, then closes each connection
        raises_within_its_timeout(proxy.address)
    finally:
        proxy.close()


def test_the_cli_says_refused_or_unknown_name_at_once(silent_port):
    """``sentinel ls --zk 127.0.0.1:1`` given 15 s: exit 3 (ZooKeeper unreachable) at once,
    and its message differs from a name that does not resolve."""
    port = silent_port.getsockname()[1]
    messages = []
    for hosts in (f"127.0.0.1:{port}", "no-such-zookeeper.invalid:2181"):
        started = time.monotonic()
        done = sentinel_in_process("ls", "--zk", hosts, "--timeout", "15")
        assert time.monotonic() - started < 5.0
        assert done.returncode == 3, done.stderr
        messages.append(done.stderr.strip())
    assert messages == [
        f"sentinel: error: no ZooKeeper server at 127.0.0.1:{port} can be reached: "
        "connection refused (nothing listens there)",
        "sentinel: error: no ZooKeeper server at no-such-zookeeper.invalid:2181 can be "
        "reached: the name does not resolve",
    ]


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
