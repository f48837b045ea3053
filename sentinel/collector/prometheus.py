"""The ``prometheus`` source: scrape an instance's exposition endpoint, keep chosen samples.

Configuration::

    [services.source]
    type = "prometheus"
    path = "/metrics"             # default
    port = 9187                   # default: the instance's own port
    scheme = "http"               # default
    [services.source.metrics]     # published name = sample selector
    replication_lag = "pg_replication_lag_seconds"
    queue = 'mail_queue_messages{queue="active"}'

A selector is a sample name with optional labels; it must match exactly one sample (labels
not named in the selector may take any value), so a selector that suddenly matches two series
fails loudly instead of publishing an arbitrary one.

One scrape has one deadline, the collection's timeout, for all of it: connecting, the TLS
handshake, the request, the headers and the whole body (every socket operation waits at most
until the deadline, so a server that drips a byte at a time cannot hold a worker past it).
Redirects are not followed: a 3xx, like any status but 200, fails the collection, since the
address of an instance's metrics is configuration, not something a server may move.
"""

from __future__ import annotations

import http.client
import io
import re
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import parse_labels, text_string_to_metric_families

from sentinel.collector.options import Options
from sentinel.errors import SourceError, SourceTimeout
from sentinel.registry.endpoint import Endpoint, format_uri

MAX_EXPOSITION_BYTES = 16 * 1024 * 1024
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\Z", re.DOTALL)


@dataclass(frozen=True)
class Selector:
    """A sample name and the labels a sample must carry."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Selector:
        """Parse ``name`` or ``name{label="value",...}``; ValueError if malformed."""
        match = _SELECTOR.match(text.strip())
        if not match:
            raise ValueError(f"{text!r} is not a sample selector such as 'name{{label=\"v\"}}'")
        labels = parse_labels(match.group(2)) if match.group(2) else {}
        return cls(match.group(1), tuple(sorted(labels.items())))

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        """Whether a sample is selected."""
        return name == self.name and all(labels.get(k) == v for k, v in self.labels)


class PrometheusSource:
    """Scrapes ``scheme://host:port/path`` of each instance."""

    type = "prometheus"

    def __init__(
        self,
        metrics: Mapping[str, Selector],
        path: str = "/metrics",
        port: int | None = None,
        scheme: str = "http",
    ) -> None:
        self.metrics = dict(metrics)
        self.path = path
        self.port = port
        self.scheme = scheme

    @classmethod
    def from_options(cls, options: Options) -> PrometheusSource:
        """Read the ``[source]`` table."""
        table = options.table_of("metrics")
        selectors = {}
        for name, text in table.table.items():
            if not isinstance(text, str):
                raise table.error(name, f"expected a sample selector string, got {text!r}")
            try:
                selectors[name] = Selector.parse(text)
            except ValueError as exc:
                raise table.error(name, str(exc)) from None
        if not selectors:
            raise options.error("metrics", "name at least one metric to publish")
        path = options.string("path", "/metrics")
        if not path.startswith("/"):
            raise options.error("path", f"{path!r} must start with '/'")
        port = options.number("port", None, minimum=1)
        scheme = options.string("scheme", "http")
        if scheme not in ("http", "https"):
            raise options.error("scheme", f"{scheme!r} is not http or https")
        return cls(selectors, path, None if port is None else int(port), scheme)

    def url(self, endpoint: Endpoint) -> str:
        """Where ``endpoint``'s metrics are exposed."""
        return format_uri(self.scheme, endpoint.host, self.port or endpoint.port) + self.path

    def collect(self, endpoint: Endpoint, timeout: float) -> dict[str, float]:
        """Scrape once and pick the selected samples."""
        url = self.url(endpoint)
        text = self._fetch(endpoint, url, timeout).decode("utf-8", "replace")
        try:
            samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        except ValueError as exc:
            raise SourceError(f"{url} is not Prometheus text exposition: {exc}") from None
        values = {}
        for metric, selector in self.metrics.items():
            found = [s.value for s in samples if selector.matches(s.name, s.labels)]
            if len(found) != 1:
                raise SourceError(
                    f"{url}: selector for {metric!r} matched {len(found)} samples, not 1"
                )
            values[metric] = found[0]
        return values

    def _fetch(self, endpoint: Endpoint, url: str, timeout: float) -> bytes:
        """GET the exposition within one deadline of ``timeout`` seconds for the whole scrape."""
        host, port = endpoint.host.strip("[]"), self.port or endpoint.port
        context = ssl.create_default_context() if self.scheme == "https" else None
        connection = _DeadlineConnection(host, port, time.monotonic() + timeout, context)
        try:
            connection.request("GET", self.path, headers={"Accept": "text/plain"})
            response = connection.getresponse()
            body = response.read(MAX_EXPOSITION_BYTES + 1)
        except TimeoutError:
            raise SourceTimeout(f"{url} did not answer within {timeout:g}s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise SourceError(f"cannot scrape {url}: {exc}") from None
        finally:
            connection.close()
        if 300 <= response.status < 400:
            raise SourceError(
                f"{url} answered {response.status} (redirect to "
                f"{response.getheader('Location')!r}); redirects are not followed"
            )
        if response.status != 200:
            raise SourceError(f"{url} answered {response.status} {response.reason}")
        if len(body) > MAX_EXPOSITION_BYTES:
            raise SourceError(f"{url} sent more than {MAX_EXPOSITION_BYTES} bytes")
        return body


def _remaining(deadline: float) -> float:
    """Seconds left before ``deadline``; TimeoutError once it has passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("the scrape's deadline passed")
    return remaining


class _DeadlineSocket:
    """What :class:`http.client.HTTPConnection` uses of a socket, every operation bound by one
    deadline, so a server that sends a byte now and then cannot stretch the scrape past it.

    Like a real socket, it is closed when both it and the response reading from it are.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self._users = 1

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(_remaining(self._deadline))
        self._sock.sendall(data)

    def recv_into(self, buffer: Any) -> int:
        self._sock.settimeout(_remaining(self._deadline))
        return self._sock.recv_into(buffer)

    def makefile(self, mode: str = "rb", *args: object, **kwargs: object) -> io.BufferedReader:
        self._users += 1
        return io.BufferedReader(_Reader(self))

    def close(self) -> None:
        self._users -= 1
        if self._users == 0:
            self._sock.close()


class _Reader(io.RawIOBase):
    """The response's side of a :class:`_DeadlineSocket`."""

    def __init__(self, sock: _DeadlineSocket) -> None:
        self._sock: _DeadlineSocket | None = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        assert self._sock is not None
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        super().close()


class _DeadlineConnection(http.client.HTTPConnection):
    """An HTTP (or, with ``context``, HTTPS) connection whose connect, TLS handshake, request
    and response share one deadline. It never follows redirects (http.client does not)."""

    def __init__(
        self, host: str, port: int, deadline: float, context: ssl.SSLContext | None
    ) -> None:
        super().__init__(host, port, timeout=max(deadline - time.monotonic(), 0.001))
        self._deadline = deadline
        self._context = context

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), _remaining(self._deadline))
        try:
            if self._context is not None:
                sock.settimeout(_remaining(self._deadline))
                sock = self._context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = _DeadlineSocket(sock, self._deadline)  # type: ignore[assignment]
