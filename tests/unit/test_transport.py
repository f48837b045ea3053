"""poll_select keeps select.select's contract (no server), SSL sockets included."""

import errno
import os
import select
import socket
import ssl
import threading
import time

from sentinel.testing.helpers import wait_until
from sentinel.zk.certificates import make_local_pki
from sentinel.zk.transport import poll_select


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


def _both(*args):
    """poll_select's answer and select.select's on the same arguments, or their errors."""
    answers = []
    for function in (poll_select, select.select):
        try:
            answers.append(function(*args))
        except Exception as exc:  # the error itself is the answer compared
            answers.append((type(exc), getattr(exc, "errno", None)))
    return answers


def test_a_negative_timeout_is_a_value_error_as_in_select():
    a, b = socket.socketpair()
    with a, b:
        ours, theirs = _both([a], [], [], -1)
        assert ours == theirs == (ValueError, None)


def test_a_closed_descriptor_is_ebadf_as_in_select():
    a, b = socket.socketpair()
    fd = os.dup(a.fileno())
    os.close(fd)
    with a, b:
        ours, theirs = _both([fd], [], [], 0)
        assert ours == theirs == (OSError, errno.EBADF)


def test_an_object_without_fileno_is_a_type_error_as_in_select():
    ours, theirs = _both([object()], [], [], 0)
    assert ours == theirs == (TypeError, None)
    ours, theirs = _both([], ["not a socket"], [], 0)
    assert ours == theirs == (TypeError, None)


def test_a_closed_socket_object_is_a_value_error_as_in_select():
    a, b = socket.socketpair()
    a.close()
    with b:
        ours, theirs = _both([a], [], [], 0)
        assert ours == theirs == (ValueError, None)


def test_a_hung_up_socket_asked_only_for_writing_is_not_reported_readable():
    """The hang-up makes it readable for poll, but it was not asked for reading."""
    a, b = socket.socketpair()
    with a:
        b.close()
        ours, theirs = _both([], [a], [], 1)
        assert ours == theirs
        assert ours[0] == [] and ours[1] == [a]


def test_a_readable_socket_asked_only_for_writing_is_only_writable():
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"x")
        ours, theirs = _both([b], [a], [], 1)
        assert ours == theirs == ([], [a], [])


def test_each_list_comes_back_in_its_own_order_as_in_select():
    pairs = [socket.socketpair() for _ in range(3)]
    try:
        for _, writer in pairs:
            writer.sendall(b"x")
        readers = [reader for reader, _ in reversed(pairs)]
        ours, theirs = _both(readers, [], [], 1)
        assert ours == theirs == (readers, [], [])
    finally:
        for pair in pairs:
            for sock in pair:
                sock.close()


def test_urgent_data_is_exceptional_as_in_select():
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as client:
        peer, _ = server.accept()
        with peer:
            client.send(b"!", socket.MSG_OOB)
            assert wait_until(lambda: select.select([], [], [peer], 0)[2], timeout=5) is not None
            ours, theirs = _both([], [], [peer], 1)
            assert ours == theirs == ([], [], [peer])


def test_a_socket_whose_descriptor_was_closed_under_it_is_ebadf_as_in_select():
    """A plain socket asked one way takes the short path (kazoo's every call): its errors are
    still select's."""
    a, b = socket.socketpair()
    with b:
        os.close(a.fileno())  # the object still names the number
        for lists in (([a], [], []), ([], [a], [])):
            ours, theirs = _both(*lists, 0)
            assert ours == theirs == (OSError, errno.EBADF)
        a.detach()
