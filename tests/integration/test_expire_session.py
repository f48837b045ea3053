"""``expire_session``'s intruder: a raw ZooKeeper connection that joins a session and closes it
(no kazoo client), as the fault tests and the chaos run use it."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from sentinel.events import ConnectionChanged
from sentinel.testing.helpers import close_session, expire_session, wait_until
from sentinel.testing.zookeeper import free_ports

pytestmark = pytest.mark.integration


def test_the_client_finds_its_session_expired_and_gets_a_new_one(make_client, zookeeper):
    client = make_client("victim")
    lost = threading.Event()
    client.listen(
        None, lambda e: isinstance(e, ConnectionChanged) and e.state == "lost" and lost.set()
    )
    old = client.session_id
    assert expire_session(client) == old
    assert lost.wait(10), "the client never heard its session was lost"
    assert wait_until(lambda: client.session_id not in (None, old), 10)
    # The old session is gone on the server: joining it again is answered "expired" at once.
    started = time.monotonic()
    close_session(zookeeper.connect_string, old, b"\0" * 16, timeout=5)
    assert time.monotonic() - started < 5


def test_no_server_is_a_timeout_error_naming_the_session_within_the_bound():
    (port,) = free_ports(1)  # nothing listens there
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"session 0x1234 within 1s .*refused"):
        close_session(f"127.0.0.1:{port}", 0x1234, b"\0" * 16, timeout=1)
    assert 1 <= time.monotonic() - started < 3


def test_a_server_that_does_not_answer_is_left_at_the_bound(zookeeper):
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        host = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="within 1s"):
            close_session(host, 0x1234, b"\0" * 16, timeout=1)
        assert time.monotonic() - started < 3
