"""Helpers for tests and fault drills against a real ZooKeeper (as ``kazoo.testing`` does)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable

from kazoo.client import KazooClient

from sentinel.client import Sentinel


def expire_session(client: Sentinel, timeout: float = 10.0) -> int:
    """Expire ``client``'s ZooKeeper session the way a long pause would; return its old id.

    A second connection joins the same session (same id and password) and closes it, which
    ends the session on the server. ``client`` then finds its session expired, as after a
    long garbage-collection pause or a partition, and connects again with a new one.
    """
    session_id, password = client._zk.client_id
    intruder = KazooClient(hosts=client.hosts, client_id=(session_id, password), timeout=timeout)
    intruder.start(timeout=timeout)
    intruder.stop()
    intruder.close()
    return session_id


def wait_until(
    condition: Callable[[], object],
    timeout: float = 10.0,
    *,
    interval: float = 0.01,
    ignore: tuple[type[BaseException], ...] = (),
) -> float | None:
    """Poll ``condition`` until it is truthy; return the seconds that took, None on timeout.

    Exceptions of the ``ignore`` types count as "not yet" (for example
    :class:`~sentinel.errors.ConnectionInterrupted` while a client reconnects).
    """
    start = time.monotonic()
    while True:
        with contextlib.suppress(*ignore):
            if condition():
                return time.monotonic() - start
        if time.monotonic() - start > timeout:
            return None
        time.sleep(interval)


class TcpProxy:
    """A loopback TCP relay between clients and a real server, whose link can be cut.

    It models a network partition between one client and ZooKeeper while the server goes on
    serving everyone else: :meth:`cut` drops every relayed connection and refuses new ones
    until :meth:`restore`. Connect clients to :attr:`address`.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    @property
    def address(self) -> str:
        """``host:port`` to connect to."""
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            if not self._open.is_set():
                downstream.close()
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                downstream.close()
                continue
            with self._lock:
                self._connections.update((downstream, upstream))
            for source, sink in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._connections.difference_update((source, sink))

    def cut(self) -> None:
        """Drop every connection and refuse new ones."""
        self._open.clear()
        with self._lock:
            connections = list(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        """Accept connections again."""
        self._open.set()

    def close(self) -> None:
        """Stop relaying."""
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
