"""The ``prometheus`` source against hostile servers: one deadline for the whole scrape (a
server dripping bytes cannot hold a worker past it) and no redirects."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from sentinel.collector.prometheus import PrometheusSource, Selector
from sentinel.errors import SourceError, SourceTimeout
from tests.unit.test_collector_config import endpoint

EXPOSITION = b"# TYPE lag gauge\nlag 2.5\n"


class RawServer:
    """A TCP server on 127.0.0.1 that answers each connection with ``answer(conn)``."""

    def __init__(self, answer: Callable[[socket.socket, threading.Event], None]) -> None:
        self.answer = answer
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)  # the request
                with contextlib.suppress(OSError):  # the client hung up
                    self.answer(conn, self.stop)

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close does not)
        self.listener.close()
        self.thread.join(timeout=10)


@pytest.fixture
def serve() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def make(answer: Callable[[socket.socket, threading.Event], None]) -> RawServer:
        servers.append(RawServer(answer))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def scrape(port: int, timeout: float) -> dict[str, float]:
    source = PrometheusSource({"lag": Selector("lag")}, port=port)
    return source.collect(dataclasses.replace(endpoint(), host="127.0.0.1"), timeout)


def _drip(head: bytes, body: bytes) -> Callable[[socket.socket, threading.Event], None]:
    def answer(conn: socket.socket, stop: threading.Event) -> None:
        for byte in head + body:
            if stop.wait(0.1):
                return
            conn.sendall(bytes([byte]))

    return answer


def _whole(head: bytes, body: bytes = b"") -> Callable[[socket.socket, threading.Event], None]:
    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head + body)

    return answer


def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)


def test_a_good_server_is_scraped(serve):
    server = serve(_whole(_ok(EXPOSITION), EXPOSITION))
    assert scrape(server.port, timeout=5) == {"lag": 2.5}


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_dripping_server_cannot_hold_a_scrape_past_its_deadline(serve, where):
    """A byte every 0.1 s: every socket read succeeds within a 1 s timeout, but the scrape as
    a whole must end at 1 s (the issue measured 6 s held by such a server)."""
    body = EXPOSITION * 20
    if where == "body":
        head = _ok(body)
        server = serve(lambda conn, stop: (conn.sendall(head), _drip(b"", body)(conn, stop)))
    else:
        server = serve(_drip(_ok(body), body))
    started = time.monotonic()
    with pytest.raises(SourceTimeout, match="did not answer within 1s"):
        scrape(server.port, timeout=1)
    assert time.monotonic() - started < 1.8


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_a_source_error_and_is_not_followed(serve, status):
    followed = serve(_whole(_ok(EXPOSITION), EXPOSITION))
    location = f"http://127.0.0.1:{followed.port}/metrics".encode()
    redirect = b"HTTP/1.1 %d Moved\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % (
        status,
        location,
    )
    server = serve(_whole(redirect))
    with pytest.raises(SourceError, match=f"answered {status} .*redirects are not followed"):
        scrape(server.port, timeout=5)


def test_other_statuses_and_refused_connections_are_source_errors(serve):
    server = serve(_whole(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n"))
    with pytest.raises(SourceError, match="answered 503 Busy"):
        scrape(server.port, timeout=5)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(SourceError, match="cannot scrape"):
        scrape(port, timeout=5)
