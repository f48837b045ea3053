"""Small HTTP backends in one process of their own, for the HAProxy tests: each a
:class:`~sentinel.testing.httpserver.LoopbackHTTPServer` on the loopback address it is given
(two on one IP and different ports, as instances sharing a host are), answering every request
with its name, so a client tallies which backend each request reached.

Run as ``python -m tests.peers.http_backends NAME=HOST ...``: it prints one JSON line,
``{NAME: PORT}``, then serves until its standard input closes. In a process of its own the
backends never wait on the test's interpreter (HAProxy's requests and the test's own compete
for one GIL otherwise).
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import ExitStack
from types import TracebackType

from sentinel.testing.httpserver import LoopbackHTTPServer


class HttpBackends:
    """The backends' process: ``hosts`` maps each backend's name to the address it binds;
    :attr:`ports` maps each name to its port once started. A context manager."""

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
            self._process.stdin.close()  # its signal to stop
            self._process.wait(10)
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


def main(arguments: list[str]) -> None:
    with ExitStack() as running:
        ports = {}
        for argument in arguments:
            name, host = argument.split("=", 1)
            server = LoopbackHTTPServer(name, keep_alive=True, host=host)
            ports[name] = running.enter_context(server).port
        sys.stdout.write(json.dumps(ports) + "\n")
        sys.stdout.flush()
        sys.stdin.read()  # until the test closes it (or dies)


if __name__ == "__main__":
    main(sys.argv[1:])
