"""The test relay's own promises: a cut link stays cut, even for a connection the relay was
setting up as it was cut, and a paused direction holds its bytes until let through."""

from __future__ import annotations

import socket
import threading

from sentinel.testing import helpers
from sentinel.testing.helpers import TcpProxy, wait_until


def test_a_connection_being_set_up_as_the_relay_is_cut_is_refused(monkeypatch):
    # The fault suite cuts three relays one after the other; a client cut from the first
    # reached the next while it was connecting upstream, and kept its session alive there.
    target = socket.create_server(("127.0.0.1", 0))
    connecting, release = threading.Event(), threading.Event()
    connect = socket.create_connection

    def held_connect(*args, **kwargs):
        connecting.set()
        release.wait(5)
        return connect(*args, **kwargs)

    monkeypatch.setattr(helpers.socket, "create_connection", held_connect)
    proxy = TcpProxy("127.0.0.1", target.getsockname()[1])
    try:
        client = connect(("127.0.0.1", proxy.port))
        assert connecting.wait(5)  # accepted while open, now connecting to the target
        proxy.cut()
        release.set()
        client.settimeout(5)
        assert client.recv(1) == b""  # closed, not relayed
    finally:
        proxy.close()
        target.close()


def test_a_paused_direction_holds_its_chunks_until_let_through_one_by_one():
    target = socket.create_server(("127.0.0.1", 0))
    proxy = TcpProxy("127.0.0.1", target.getsockname()[1])
    try:
        client = socket.create_connection(("127.0.0.1", proxy.port))
        server, _ = target.accept()
        server.settimeout(5)
        proxy.pause(to_client=False)
        client.sendall(b"one")
        assert wait_until(lambda: proxy.held() == 1)
        server.sendall(b"back")  # the other direction flows
        client.settimeout(5)
        assert client.recv(4) == b"back"
        proxy.let_through(1)
        assert server.recv(3) == b"one"
        client.sendall(b"two")
        assert wait_until(lambda: proxy.held() == 1)  # held again after the one let through
        proxy.resume()
        assert server.recv(3) == b"two"
    finally:
        proxy.close()
        target.close()
