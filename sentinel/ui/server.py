"""Serving the dashboard with uvicorn: in the foreground (``sentinel ui``) or on a thread of
its own beside the host agent (``sentinel agent --ui PORT``).

The listening socket is bound here before anything else starts, so that a port another
process holds is :class:`~sentinel.errors.AddressInUse` (exit 4, as the agent's own sockets)
before a ZooKeeper session is opened, and port 0 can be served and reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import signal
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette

from sentinel.errors import AddressInUse, ValidationError
from sentinel.ui.live import ChangeFeed

#: Seconds open streams are given to end when the server stops (they never end by themselves).
SHUTDOWN_GRACE = 1
#: The signals that stop ``sentinel ui``.
HANDLED = (signal.SIGINT, signal.SIGTERM)
#: Connections uvicorn serves at once; one more is answered 503 by uvicorn itself.
MAX_CONNECTIONS = 8192


def listen(address: str, port: int) -> socket.socket:
    """A socket listening on ``address:port`` (port 0: any free one).

    Raises ValidationError for an address that is not an IP address of this host, and
    AddressInUse when another process listens there.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ValidationError(
            f"--address {address!r} is not an IP address (127.0.0.1, ::1, 0.0.0.0...)"
        ) from None
    sock = socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUse(
                f"{address}:{port}: another process listens there (choose another --port)"
            ) from None
        raise ValidationError(f"cannot listen on {address}:{port}: {exc.strerror}") from None
    return sock


def url(sock: socket.socket) -> str:
    """``http://ADDRESS:PORT/`` of a listening socket."""
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


class _Server(uvicorn.Server):
    """uvicorn's server, ending the live streams first when it stops: they never end by
    themselves, and would otherwise be cancelled (and logged) after the grace period."""

    def __init__(self, config: uvicorn.Config, feed: ChangeFeed) -> None:
        super().__init__(config)
        self._feed = feed

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._feed.close_all()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM stop the server, and ``sentinel ui`` then exits 0 as the other
        daemons do (uvicorn's own raises the signal again once stopped: exit -15)."""
        if threading.current_thread() is not threading.main_thread():
            yield  # beside the agent: the agent's own handlers stop it
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class DashboardServer:
    """uvicorn serving ``app`` on ``sock``: :meth:`run` in the foreground (SIGINT and SIGTERM
    stop it) or :meth:`start` on a thread, then :meth:`stop`."""

    def __init__(self, app: Starlette, sock: socket.socket) -> None:
        self.sock = sock
        self.server = _Server(
            uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=SHUTDOWN_GRACE,
                limit_concurrency=MAX_CONNECTIONS,
                server_header=False,
            ),
            app.state.feed,
        )
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Serve until SIGINT or SIGTERM."""
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self, timeout: float = 10.0) -> DashboardServer:
        """Serve on a thread of its own; returns once it accepts connections."""
        self._thread = threading.Thread(target=self.run, name="sentinel-ui", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        # uvicorn sets a flag, no event: polled, bounded by the timeout and the thread's life.
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ValidationError("the dashboard's server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and wait for the thread."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self.sock.close()
