"""Small HTTP backends in one process of their own, for the HAProxy and nginx tests: each a
:class:`~sentinel.testing.httpserver.LoopbackHTTPServer` on the loopback address it is given
(two on one IP and different ports, as instances sharing a host are), answering every request
with its name, so a client tallies which backend each request reached.

Run as ``python -m tests.peers.http_backends NAME=HOST[:PORT] ...`` (no port: a free one):
it prints one JSON line, ``{NAME: PORT}``, then serves until its standard input closes (its
test's process ended) or it is killed. In a
process of its own the backends never wait on the test's interpreter (the proxy's requests
and the test's own would compete for one GIL).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import sys
from collections import Counter
from contextlib import ExitStack
from types import TracebackType

from sentinel.testing.httpserver import LoopbackHTTPServer


class HttpBackends:
    """The backends' process: ``hosts`` maps each backend's name to the address it binds
    (``host`` or ``host:port``); :attr:`ports` maps each name to its port once started. A
    context manager."""

    def __init__(self, hosts: dict[str, str]) -> None:
        self.hosts = hosts
        self.ports: dict[str, int] = {}
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> HttpBackends:
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, *(f"{n}={h}" for n, h in self.hosts.items())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # http.server prints a traceback for each kept-alive connection HAProxy resets
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the HTTP backends exited ({self._process.wait()}) before serving")
        self.ports = json.loads(line)
        return self

    def stop(self) -> None:
        if self._process is not None:
            assert self._process.stdin is not None and self._process.stdout is not None
            # Killed: a graceful stop waits half a second per server (socketserver's poll).
            self._process.kill()
            self._process.wait(10)
            self._process.stdin.close()
            self._process.stdout.close()

    def __enter__(self) -> HttpBackends:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class Client:
    """Requests through a proxy's frontend on 127.0.0.1:``port``, on one kept-alive
    connection (a new one after a failure); :meth:`send` tallies which backend answered
    each."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.answered: Counter[str] = Counter()
        self.failed = 0
        self._connection: http.client.HTTPConnection | None = None

    def get(self) -> str | None:
        """One request: the name of the backend that answered, None if it failed (the
        proxy's 502 or 503, a reset, a timeout)."""
        if self._connection is None:
            self._connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            self._connection.request("GET", "/")
            response = self._connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            return None
        if response.status != 200:
            return None
        return json.loads(body)["name"]

    def send(self, count: int) -> Counter[str]:
        """``count`` requests; which backend answered how many (failures counted apart)."""
        answered: Counter[str] = Counter()
        for _ in range(count):
            name = self.get()
            if name is None:
                self.failed += 1
            else:
                answered[name] += 1
        self.answered.update(answered)
        return answered

    def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(OSError):
                self._connection.close()
            self._connection = None


def main(arguments: list[str]) -> None:
    with ExitStack() as running:
        ports = {}
        for argument in arguments:
            name, address = argument.split("=", 1)
            host, _, port = address.partition(":")
            server = LoopbackHTTPServer(name, keep_alive=True, host=host, port=int(port or 0))
            ports[name] = running.enter_context(server).port
        sys.stdout.write(json.dumps(ports) + "\n")
        sys.stdout.flush()
        sys.stdin.read()  # until the test closes it (or dies)


if __name__ == "__main__":
    main(sys.argv[1:])
