"""Small servers on loopback, for tests and benchmarks of the HTTP integration and of health
checks: an HTTP server that answers JSON, and a raw TCP server for endpoints that misbehave."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType


@contextmanager
def raw_server(serve: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP server on ``127.0.0.1`` (a free port, yielded) that hands each accepted
    connection to ``serve`` on a thread of its own: an endpoint that hangs, answers garbage or
    never stops sending, as ``serve`` decides. Stops accepting on exit."""
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the server stops
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, name="raw-server", daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        # shutdown first: a close alone leaves the socket listening while accept() blocks on it
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()


class _Server(ThreadingHTTPServer):
    # socketserver's listen backlog is 5: a burst of concurrent connections would see SYNs
    # dropped and retried a second later, which is the test's machine, not the code, failing.
    request_queue_size = 128
    daemon_threads = True


class LoopbackHTTPServer:
    """An HTTP server on loopback that answers every request with JSON: its
    ``name``, the request's ``method``, ``path`` and ``headers`` (names in lower case).

    ``delay`` seconds pass before each answer (a slow instance); ``status`` is the answer's
    status code, the same JSON body with any (set it while serving: an instance whose
    dependency fails answers 503). With ``keep_alive`` it speaks
    HTTP/1.1 and keeps connections open; without, each connection carries one request, so
    :meth:`stop` refuses every later one at once. ``host`` and ``port`` are the address it
    binds (``port`` 0: a free one): another loopback address (``127.0.0.2``) gives an instance
    an IP of its own, on the port another has. Use it as a context manager, or call
    :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        name: str,
        delay: float = 0.0,
        keep_alive: bool = False,
        status: int = 200,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.name = name
        self.delay = delay
        self.status = status
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
            # Headers and body are two writes: with Nagle's algorithm the body waits for the
            # client's delayed ACK, 40 ms per request on a kept-alive connection.
            disable_nagle_algorithm = True

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if server.delay:
                    time.sleep(server.delay)  # the slowness being simulated, not a wait
                body = json.dumps(
                    {
                        "name": server.name,
                        "method": self.command,
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                    }
                ).encode()
                self.send_response(server.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: tests and benchmarks send thousands of requests."""

        self._server = _Server((host, port), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"http-{name}", daemon=True
        )

    def start(self) -> LoopbackHTTPServer:
        """Serve in a thread of its own; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket: new connections are refused."""
        if self._thread.ident is not None:  # shutdown() waits forever on a server never run
            self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> LoopbackHTTPServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = ["LoopbackHTTPServer"]
