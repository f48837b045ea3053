"""Connection behaviour: no server, a flapping connection, and kazoo errors as Sentinel's."""

import logging
import threading
import time

import pytest
from kazoo.client import KazooState

from sentinel import Sentinel
from sentinel.errors import ZooKeeperUnavailable
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper, free_ports

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


@pytest.mark.slow
def test_a_flapping_connection_keeps_the_session_and_writes_nothing(caplog):
    """Pausing the server past the client's read timeout (not the session timeout) drops the
    connection; kazoo reconnects with the same session, so nothing may be re-registered.

    kazoo notices a silent server after two thirds of the session timeout; the server expires
    the session at the timeout (rounded up to its tick). With 6 s that left about 2 s for the
    client to notice and the test to resume the server, and a fresh-clone run on two loaded
    cores once needed more (the session expired: a new id). 12 s leaves 4 s.
    """
    with LocalZooKeeper() as zk:
        client = Sentinel(hosts=zk.connect_string, client_id="flappy", session_timeout=12.0)
        client.start()
        try:
            states: list[str] = []
            client._zk.add_listener(states.append)
            registration = client.register("api", "p1", "h", 80)
            _, before = client._zk.get(registration.path)
            session = client.session_id
            with caplog.at_level(logging.INFO, logger="sentinel.zk.ephemeral"):
                for _flap in range(2):
                    zk.members[0].pause()
                    assert wait_until(lambda: KazooState.SUSPENDED in states, timeout=15), (
                        "the connection never dropped, so this test proved nothing"
                    )
                    zk.members[0].resume()
                    assert wait_until(lambda: states[-1] == KazooState.CONNECTED, timeout=10)
                    states.clear()
                _, after = client._zk.get(registration.path)
            assert client.session_id == session
            assert (after.czxid, after.mzxid, after.ephemeralOwner) == (
                before.czxid,
                before.mzxid,
                session,
            )
            assert "re-created" not in caplog.text
        finally:
            client.close()
