"""A readiness check: what to probe (an HTTP URL, a TCP port, gRPC's standard health service
or a callable) and how often.

:class:`HealthCheck` is a small immutable value, built by :meth:`HealthCheck.http`,
:meth:`HealthCheck.tcp`, :meth:`HealthCheck.grpc` or :meth:`HealthCheck.call`, and validated
when built (a bad value is a :class:`~sentinel.errors.ValidationError`, before anything
runs). :meth:`HealthCheck.probe` runs it once against an instance. The publisher
(``Sentinel.register(..., health=...)``) and the metric collector (the ``health`` source) run
the same checks; :mod:`sentinel.health.scheduler` decides when, and
:mod:`sentinel.health.damping` what a run of results means.

An HTTP check sends one ``GET`` and reads the status line only, at most
:data:`MAX_STATUS_LINE` bytes, within the timeout (each read is given what is left of it): a
server that never answers, drips bytes, answers garbage or a body of any size costs the check
one socket for ``timeout`` seconds at most, and nothing of the body is read. 2xx passes,
anything else (redirects included: a login page is not readiness) fails. A gRPC check asks
the instance's ``grpc.health.v1.Health/Check`` (``grpcio-health-checking``, the ``grpc``
extra) over plain HTTP/2 on a channel of its own, closed after the run: ``SERVING`` passes,
any other answer or status fails.
"""

from __future__ import annotations

import re
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict, Unpack

from sentinel import validation as check
from sentinel.errors import SentinelError, ValidationError
from sentinel.registry.layout import validate_host

# Defaults, and why (docs/health.md#readiness-checks): a check every 5 s bounded by 2 s finds a
# dead dependency within 15 s (3 failures) and puts an instance back after 10 s of health
# (2 passes), at most one status write per 10 s per instance under any noise.
DEFAULT_INTERVAL = 5.0
DEFAULT_TIMEOUT = 2.0
DEFAULT_FAILURES_BEFORE_DOWN = 3
DEFAULT_SUCCESSES_BEFORE_UP = 2
# Bounds of the settings: below 50 ms a check is a load test of its own endpoint; thresholds
# past 100 would leave an instance up (or down) for minutes after it changed.
MIN_INTERVAL = 0.05
MAX_INTERVAL = 3600.0
MAX_THRESHOLD = 100
MAX_URL = 2048
# An HTTP status line is ~20 bytes; the first line of anything that is not one within this
# many bytes is a failure, not a reason to read on.
MAX_STATUS_LINE = 1024
# A gRPC service's full name (``package.Service``) is far shorter; the name is in every
# failure's log line.
MAX_GRPC_SERVICE = 256
KINDS = ("http", "tcp", "grpc", "call")


class Schedule(TypedDict, total=False):
    """The settings every check takes, as keywords of :meth:`HealthCheck.http`,
    :meth:`HealthCheck.tcp`, :meth:`HealthCheck.grpc` and :meth:`HealthCheck.call` (defaults:
    :class:`HealthCheck`'s)."""

    interval: float
    timeout: float
    failures_before_down: int
    successes_before_up: int


class CheckFailed(SentinelError):
    """One run of a check failed; the message says why (shown in logs, never a secret)."""


@dataclass(frozen=True)
class HealthCheck:
    """A readiness check and its schedule: build it with :meth:`http`, :meth:`tcp`,
    :meth:`grpc` or :meth:`call`.

    ``interval`` seconds between the starts of two runs, each bounded by ``timeout`` seconds
    (at most the interval); the instance goes down after ``failures_before_down`` failures in a
    row and back up after ``successes_before_up`` passes in a row (Consul's
    ``failures_before_critical`` and ``success_before_passing``).
    """

    kind: str
    url: str | None = None
    host: str | None = None
    port: int | None = None
    function: Callable[[], bool | None] | None = None
    service: str | None = None  # a gRPC check's health service name ("": the whole server)
    interval: float = DEFAULT_INTERVAL
    timeout: float = DEFAULT_TIMEOUT
    failures_before_down: int = DEFAULT_FAILURES_BEFORE_DOWN
    successes_before_up: int = DEFAULT_SUCCESSES_BEFORE_UP

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValidationError(f"health check kind {self.kind!r} is not one of {KINDS}")
        check.number("interval", self.interval, least=MIN_INTERVAL, most=MAX_INTERVAL)
        check.number("timeout", self.timeout, above=0, most=self.interval)
        for name in ("failures_before_down", "successes_before_up"):
            value = check.integer(name, getattr(self, name), least=1)
            if value > MAX_THRESHOLD:
                raise ValidationError(f"{name} must be {MAX_THRESHOLD} or less, got {value!r}")
        if self.kind == "http":
            _check_url(self.url)
        if self.kind in ("tcp", "grpc") and self.port is not None:
            _check_port(self.port)
        if self.kind == "grpc":
            _check_grpc_service(self.service)
        if self.host is not None:
            validate_host(self.host)
        if self.kind == "call" and not callable(self.function):
            raise ValidationError(
                f"a call check needs a callable, not {type(self.function).__name__}"
            )

    @classmethod
    def http(cls, url: str = "/", **schedule: Unpack[Schedule]) -> HealthCheck:
        """``GET url``: passes on a 2xx status. A path (``"/ready"``) is asked of the instance
        itself (``http://<host>:<port>/ready``); a full ``http://`` or ``https://`` URL is
        asked as it is. ``schedule``: ``interval``, ``timeout``, ``failures_before_down``,
        ``successes_before_up`` (:class:`Schedule`)."""
        return cls("http", url=url, **schedule)

    @classmethod
    def tcp(
        cls, port: int | None = None, *, host: str | None = None, **schedule: Unpack[Schedule]
    ) -> HealthCheck:
        """Passes when a TCP connection to ``host:port`` opens (default: the instance's own
        host and port); the connection is closed at once, nothing is sent."""
        return cls("tcp", host=host, port=port, **schedule)

    @classmethod
    def grpc(
        cls,
        service: str = "",
        *,
        port: int | None = None,
        host: str | None = None,
        **schedule: Unpack[Schedule],
    ) -> HealthCheck:
        """Passes when the instance's standard gRPC health service
        (``grpc.health.v1.Health/Check``) answers ``SERVING`` for ``service`` (``""``: the
        server as a whole, as gRPC defines it); any other answer (``NOT_SERVING``,
        ``SERVICE_UNKNOWN``) or a call that fails (no server, no health service, the timeout)
        fails it. Plain HTTP/2 to ``host:port`` (default: the instance's own). Needs the
        ``grpc`` extra (``grpcio-health-checking``): a ValidationError here without it."""
        return cls("grpc", service=service, host=host, port=port, **schedule)

    @classmethod
    def call(cls, function: Callable[[], bool | None], **schedule: Unpack[Schedule]) -> HealthCheck:
        """``function()``: passes when it returns True or None, fails when it raises or
        returns anything else. It runs on a check thread; one that overruns ``timeout``
        counts as a failure and is not called again until it has returned."""
        return cls("call", function=function, **schedule)

    @property
    def source(self) -> str:
        """What ``sentinel ls`` shows as the instance's health source: ``check:http`` etc."""
        return f"check:{self.kind}"

    def probe(self, host: str, port: int, timeout: float | None = None) -> Callable[[], None]:
        """One run of this check against the instance at ``host:port``: a callable that
        returns when it passes and raises :class:`CheckFailed` (or anything else) when not.
        HTTP and TCP runs end within ``timeout`` seconds (default: the check's own)."""
        seconds = self.timeout if timeout is None else timeout
        if self.kind == "http":
            assert self.url is not None
            url = _absolute(self.url, host, port)
            return lambda: _http(url, seconds)
        if self.kind == "tcp":
            target = (self.host or host, self.port or port)
            return lambda: _tcp(target, seconds)
        if self.kind == "grpc":
            assert self.service is not None
            address = _authority(self.host or host, self.port or port)
            service = self.service
            return lambda: _grpc(address, service, seconds)
        function = self.function
        assert function is not None

        def call() -> None:
            result = function()
            if result is not None and result is not True:
                raise CheckFailed(f"returned {type(result).__name__}, not True or None")

        return call


def _check_port(port: object) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValidationError(f"port must be an integer in 1-65535, got {port!r}")


def _check_grpc_service(service: object) -> None:
    if not isinstance(service, str):
        raise ValidationError(f"a gRPC health service name is a string, not {service!r}")
    if len(service) > MAX_GRPC_SERVICE or not service.isascii() or not service.isprintable():
        raise ValidationError(
            f"gRPC health service name {service[:64]!r} must be printable ASCII, at most "
            f"{MAX_GRPC_SERVICE} characters"
        )
    try:
        import grpc_health.v1.health_pb2  # noqa: F401 (the check's own dependency, asked once)
    except ImportError as exc:
        raise ValidationError(
            f"a gRPC check needs the grpc extra ({exc.name} is missing): "
            "pip install -e '.[grpc]' in a checkout"
        ) from None


def _check_url(url: object) -> None:
    if not isinstance(url, str) or not url:
        raise ValidationError(f"url must be a non-empty string, not {type(url).__name__}")
    if len(url) > MAX_URL:
        raise ValidationError(f"url is {len(url)} characters long; at most {MAX_URL}")
    # The URL is in the check's repr and in every failure's log line: no place for a password,
    # and no message below may repeat a URL that holds one.
    authority = re.split(r"[/?#]", url.partition("//")[2], maxsplit=1)[0]
    if not url.startswith("/") and "@" in authority:
        raise ValidationError("a check's url must not hold credentials (user:password@)")
    # Sent as the request line: a space or control character would let a URL write headers.
    if not url.isascii() or not url.isprintable() or " " in url:
        raise ValidationError(
            f"url {url!r} must be printable ASCII without spaces (percent-encode the rest)"
        )
    if url.startswith("/"):
        return
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (urllib validates the port when it is read)
    except ValueError as exc:
        raise ValidationError(f"url {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError(
            f"url {url!r} must be a path ('/ready') or an http:// or https:// URL with a host"
        )


def _absolute(url: str, host: str, port: int) -> str:
    if not url.startswith("/"):
        return url
    return f"http://{_authority(host, port)}{url}"


def _authority(host: str, port: int) -> str:
    """``host:port``, an IPv6 address bracketed."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def _tcp(target: tuple[str, int], timeout: float) -> None:
    try:
        socket.create_connection(target, timeout=timeout).close()
    except OSError as exc:
        raise CheckFailed(f"cannot connect to {target[0]}:{target[1]}: {exc}") from None


def _grpc(address: str, service: str, timeout: float) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    what = f"grpc.health.v1 Check of {service!r} at {address}"
    with grpc.insecure_channel(address) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as exc:
            details = f": {exc.details()}" if exc.details() else ""
            raise CheckFailed(f"{what}: {exc.code().name}{details}") from None
    if answer.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
        raise CheckFailed(f"{what}: {status}")


def _http(url: str, timeout: float) -> None:
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname
    assert host is not None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise CheckFailed(f"cannot connect to {host}:{port}: {exc}") from None
    try:
        if parts.scheme == "https":
            sock.settimeout(_left(deadline))
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        netloc = parts.netloc
        request = (
            f"GET {target} HTTP/1.1\r\nHost: {netloc}\r\nUser-Agent: sentinel-health\r\n"
            "Accept: */*\r\nConnection: close\r\n\r\n"
        )
        sock.settimeout(_left(deadline))
        sock.sendall(request.encode("ascii"))
        line = _status_line(sock, deadline)
    except (OSError, ssl.SSLError) as exc:
        raise CheckFailed(f"GET {url}: {exc or type(exc).__name__}") from None
    finally:
        sock.close()  # the body, of whatever size, is never read
    version, _, rest = line.partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/") or len(code) != 3 or not code.isdigit():
        raise CheckFailed(f"GET {url}: not an HTTP status line: {line[:64]!r}")
    if not code.startswith(b"2"):
        raise CheckFailed(f"GET {url}: status {code.decode()}")


def _status_line(sock: socket.socket, deadline: float) -> bytes:
    """The first line the server sends, read within ``deadline`` and MAX_STATUS_LINE bytes."""
    received = b""
    while b"\n" not in received:
        if len(received) >= MAX_STATUS_LINE:
            raise CheckFailed(f"no status line in the first {MAX_STATUS_LINE} bytes")
        sock.settimeout(_left(deadline))
        chunk = sock.recv(MAX_STATUS_LINE - len(received))
        if not chunk:
            raise CheckFailed("the connection closed before a status line")
        received += chunk
    return received.partition(b"\n")[0].rstrip(b"\r")


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left
