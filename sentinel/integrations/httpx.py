"""httpx transports that resolve ``http://<service>.sentinel/...`` through a Sentinel client.

Install with the ``http`` extra (from a checkout: ``pip install -e '.[http]'``)::

    transport = SentinelTransport(sentinel, balancer=PowerOfTwoChoices(feedback=sentinel.feedback))
    with httpx.Client(transport=transport) as http:
        http.get("http://billing.sentinel/invoices", extensions={"sentinel_key": "acme"})

A request whose host ends in the suffix (``.sentinel``) names a service: the transport asks
``get_service(service, key, policy, balancer)`` for an endpoint, sends the request there (path and
query kept, ``Host`` set to the endpoint) through the wrapped transport, and reports the outcome
and the time to the response's headers with ``Sentinel.report``, so a load-aware balancer reading
``sentinel.feedback`` follows real latency and failing instances are marked down. The shard key
comes from the request extension ``sentinel_key``, else from a header (``X-Sentinel-Key`` by
default, never forwarded). Requests to any other host pass through to the wrapped transport
unchanged.

A connection that cannot be made (:class:`httpx.ConnectError`, :class:`httpx.ConnectTimeout`)
is reported as a failure; an idempotent request (GET, HEAD, OPTIONS, PUT, DELETE) is then sent to
another eligible endpoint (the policy's pick among them all once each has failed), at most
``retries`` more times, and the last connect error is raised when none is left
(:class:`sentinel.integrations.retry.Route`, the retry of every integration). Other methods
are never re-sent: the caller decides whether a POST may be repeated. Errors after the
connection was made (a read timeout) are reported and raised as they are, since the server may
have acted on the request. Resolution errors (:class:`~sentinel.errors.ResolutionError`) are
raised as ``get_service`` raises them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx

from sentinel.errors import ValidationError
from sentinel.integrations.retry import Route

if TYPE_CHECKING:
    from sentinel.client import Sentinel
    from sentinel.registry.endpoint import Endpoint
    from sentinel.strategies import Balancer, Endpoints, SelectionPolicy

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
KEY_EXTENSION = "sentinel_key"
# Nothing was sent on these: another endpoint may take the request.
_CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout)


def routed_url(url: httpx.URL, endpoint: Endpoint) -> httpx.URL:
    """``url`` with the scheme, host and port of ``endpoint``; path, query and fragment kept."""
    if not _PARSED_FORMS:
        return url.copy_with(scheme=endpoint.scheme, host=endpoint.host, port=endpoint.port)
    # httpx's own copy_with() prints the URL and parses it again, checking every character
    # (most of the routing's cost: docs/benchmarks.md). Both parts were parsed by httpx
    # already (the endpoint's once per URI), so their parsed forms are combined as they are;
    # tests/unit/test_httpx_url.py compares the result with copy_with's.
    origin = _origin(endpoint.uri)
    routed = httpx.URL.__new__(httpx.URL)
    routed._uri_reference = url._uri_reference._replace(
        scheme=origin.scheme, host=origin.host, port=origin.port
    )
    return routed


@functools.lru_cache(maxsize=1024)
def _origin(uri: str) -> Any:
    return httpx.URL(uri)._uri_reference


def _has_parsed_forms() -> bool:
    """Whether this httpx keeps a URL's parsed form where :func:`routed_url` reads it (0.28:
    ``URL._uri_reference``, a named tuple); else routed_url uses the public ``copy_with``."""
    reference = getattr(httpx.URL("http://a.b:1/p?q#f"), "_uri_reference", None)
    return callable(getattr(reference, "_replace", None)) and all(
        hasattr(reference, field) for field in ("scheme", "host", "port")
    )


_PARSED_FORMS = _has_parsed_forms()


_T = TypeVar("_T", httpx.BaseTransport, httpx.AsyncBaseTransport)


class _Router(Generic[_T]):
    """What the sync and async transports share: which requests are routed, and how."""

    _default_transport: Callable[[], _T]

    def __init__(
        self,
        client: Sentinel,
        transport: _T | None = None,
        *,
        suffix: str = ".sentinel",
        key_header: str = "X-Sentinel-Key",
        policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | None = None,
        balancer: Balancer | None = None,
        retries: int = 2,
        server_errors_fail: bool = True,
    ) -> None:
        if not suffix.startswith(".") or retries < 0:
            raise ValidationError("suffix must start with '.' and retries must be >= 0")
        self.client = client
        self.transport: _T = transport if transport is not None else self._default_transport()
        self.suffix = suffix.lower()
        self.key_header = key_header
        # The headers a routed request does not carry over: its own Host is set for it.
        self.dropped_headers = frozenset({b"host", key_header.lower().encode("ascii")})
        self.policy = policy
        self.balancer = balancer
        self.retries = retries
        self.server_errors_fail = server_errors_fail

    def _call(self, request: httpx.Request) -> _Call | None:
        """The routing of ``request``; None when its host is not a service's."""
        host = request.url.host
        if not host.endswith(self.suffix):
            return None
        return _Call(self, request, host[: -len(self.suffix)])


class _Call(Route):
    """One routed request: a :class:`~sentinel.integrations.retry.Route` and the request."""

    __slots__ = ("_request", "_router")

    def __init__(self, router: _Router[Any], request: httpx.Request, service: str) -> None:
        self._router = router
        self._request = request
        key = request.extensions.get(KEY_EXTENSION)
        super().__init__(
            router.client,
            service,
            request.headers.get(router.key_header) if key is None else key,
            router.policy,
            router.balancer,
            router.retries,
        )

    def request(self) -> httpx.Request:
        """The request to send to ``endpoint``: its scheme, host and port, the path, query,
        body and headers of the original but the shard key's, and ``Host`` set to it."""
        request = self._request
        url = routed_url(request.url, self.endpoint)
        # One pass over the raw headers: Headers.pop() of a missing name costs an exception.
        dropped = self._router.dropped_headers
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in dropped]
        headers.append((b"Host", url.netloc))
        routed = httpx.Request(
            request.method,
            url,
            headers=headers,
            stream=request.stream,
            extensions=request.extensions,
        )
        self.sent()
        return routed

    def answered(self, response: httpx.Response) -> httpx.Response:
        """Report the endpoint's response and latency; returns ``response``."""
        self.succeeded(not (self._router.server_errors_fail and response.status_code >= 500))
        return response

    def transport_failed(self, exc: httpx.TransportError) -> bool:
        """Report the failure and, when the request may go to another endpoint (a connect
        error of an idempotent request), resolve it as ``endpoint``; returns whether to send
        the request again."""
        method = self._request.method
        return self.failed(
            method,
            type(exc).__name__,
            isinstance(exc, _CONNECT_ERRORS) and method in IDEMPOTENT_METHODS,
        )


class SentinelTransport(_Router[httpx.BaseTransport], httpx.BaseTransport):
    """An httpx transport that sends ``http://<service><suffix>/...`` to an endpoint of the
    service (see the module's documentation) and every other request to ``transport``.

    ``client`` is a started :class:`~sentinel.Sentinel`; ``policy`` and ``balancer`` are
    passed to each ``get_service`` (None: the service's defaults). ``retries`` bounds the extra
    attempts of an idempotent request after connect errors. ``server_errors_fail`` (True by
    default) reports 5xx responses as failures, as Envoy's ``consecutive_5xx`` counts them:
    an instance answering 5xx is ejected, and the cap on ejection and the panic keep a service
    served when every instance answers 5xx (``docs/health.md``); False counts transport errors
    only.
    ``transport`` (default ``httpx.HTTPTransport()``) sends every request and is closed with
    this one.
    """

    _default_transport = httpx.HTTPTransport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``: routed through Sentinel when its host names a service."""
        call = self._call(request)
        if call is None:
            return self.transport.handle_request(request)
        while True:
            try:
                response = self.transport.handle_request(call.request())
            except httpx.TransportError as exc:
                if call.transport_failed(exc):
                    continue
                raise
            return call.answered(response)

    def close(self) -> None:
        """Close the wrapped transport."""
        self.transport.close()


class AsyncSentinelTransport(_Router[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport):
    """The asyncio twin of :class:`SentinelTransport`, for ``httpx.AsyncClient``: the same
    parameters, ``transport`` defaulting to ``httpx.AsyncHTTPTransport()``.

    ``get_service`` does not block on a warm cache, but a service's first lookup reads
    ZooKeeper: call ``sentinel.prefetch(service)`` at start-up to keep it off the event loop.
    """

    _default_transport = httpx.AsyncHTTPTransport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``: routed through Sentinel when its host names a service."""
        call = self._call(request)
        if call is None:
            return await self.transport.handle_async_request(request)
        while True:
            try:
                response = await self.transport.handle_async_request(call.request())
            except httpx.TransportError as exc:
                if call.transport_failed(exc):
                    continue
                raise
            return call.answered(response)

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self.transport.aclose()


__all__ = ["AsyncSentinelTransport", "SentinelTransport", "routed_url"]
