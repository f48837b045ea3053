"""poll_select keeps select.select's contract (no server), SSL sockets included."""

import socket
import ssl
import threading
import time

from sentinel.certificates import make_local_pki
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


def test_an_ssl_socket_with_decrypted_bytes_pending_is_readable_at_once(tmp_path):
    """Two replies in one TLS record: after reading the first, the kernel has nothing to
    report, but the second is waiting in the SSL socket; kazoo's loop must not sleep on it."""
    pki = make_local_pki(tmp_path)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(pki.server_keystore)
    a, b = socket.socketpair()
    with a, b:
        client = (
            pki.client_config()
            .ssl_context()
            .wrap_socket(a, server_hostname="localhost", do_handshake_on_connect=False)
        )
        server = server_context.wrap_socket(b, server_side=True, do_handshake_on_connect=False)
        handshake = threading.Thread(target=server.do_handshake)
        handshake.start()
        client.do_handshake()
        handshake.join()
        server.sendall(b"first" + b"second")  # one write, one record
        assert client.recv(5) == b"first"
        assert client.pending() > 0
        started = time.monotonic()
        assert poll_select([client, server], [], [], 5.0) == ([client], [], [])
        assert time.monotonic() - started < 1.0
        assert client.recv(6) == b"second"
        assert poll_select([client], [], [], 0.01) == ([], [], [])
