"""poll_select keeps select.select's contract (no server)."""

import socket
import time

from sentinel.transport import poll_select


def test_readable_writable_and_timeout():
    a, b = socket.socketpair()
    with a, b:
        assert poll_select([a], [], [], 0.01) == ([], [], [])
        started = time.monotonic()
        poll_select([a], [], [], 0.05)
        assert time.monotonic() - started >= 0.04
        b.sendall(b"x")
        assert poll_select([a, b], [b], [], 1) == ([a], [b], [])
        assert poll_select([a.fileno()], [], [], 1) == ([a.fileno()], [], [])


def test_a_hung_up_peer_is_reported_readable():
    a, b = socket.socketpair()
    with a:
        b.close()
        assert poll_select([a], [], [], 1)[0] == [a]
        assert a.recv(1) == b""


def test_one_object_in_both_lists_is_reported_in_each():
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"x")
        readable, writable, _ = poll_select([a], [a], [], 1)
        assert readable == [a] and writable == [a]
