"""A ``grpc.Channel`` that resolves every call through a Sentinel client, for gRPC Python
without the host agent's xDS.

Install with the ``grpc`` extra (from a checkout: ``pip install -e '.[grpc]'``)::

    with SentinelChannel(sentinel, "billing") as channel:
        stub = billing_pb2_grpc.InvoicesStub(channel)  # any generated stub takes it
        stub.Get(request, metadata=[("x-sentinel-key", "acme")])

gRPC Python has no pluggable name resolver, so the channel does the resolving itself: each call
asks ``get_service(service, key, policy, balancer)`` for an endpoint (a warm-cache lookup, no
I/O) and is made on a plain ``grpcio`` channel to that endpoint. The shard key is the call's
metadata ``x-sentinel-key`` (not forwarded), else the channel's ``key``. One ``grpcio`` channel
is kept per endpoint address and reused across changes (a weight, a status, a metric); the
channel of an instance that left the registry is closed once its calls in flight have ended,
on a thread of this channel's own, never on the cache's. At most ``max_channels`` are kept;
past that the least recently opened idle ones are closed.

Each outcome is reported as the httpx transport reports it
(:class:`sentinel.integrations.retry.Route`): an answer, whatever its status but those of
``failure_codes``, with the call's latency when it has one response (a stream's time is the
caller's reading); a status of
``failure_codes`` (by default :data:`FAILURE_CODES`, the statuses Envoy counts as 5xx:
``UNAVAILABLE``, the connection failures among them, ``DEADLINE_EXCEEDED``, ``UNKNOWN``,
``INTERNAL``, ``DATA_LOSS``, ``UNIMPLEMENTED``) as a failure, so that an instance that keeps
failing is ejected from lookups, within the caps of ``docs/health.md``. A call the caller
cancelled is not reported.

A call with no eligible instance raises the :class:`~sentinel.errors.ResolutionError` that
``get_service`` raises (:class:`~sentinel.errors.NoInstanceAvailable`,
:class:`~sentinel.errors.ServiceNotFound`, ...), not a ``grpc.RpcError``: no server was asked,
so there is no gRPC status to give, and an ``UNAVAILABLE`` made up here would look like a
server's answer to code that retries on it, while a missing service or partition is a mistake
no retry mends. The httpx transport does the same.

:class:`AsyncSentinelChannel` is the same on ``grpc.aio`` channels, for stubs used with
``await``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

import grpc
import grpc.aio

from sentinel import validation as check
from sentinel.aio import to_loop
from sentinel.errors import ClientClosed, NoInstanceAvailable, ValidationError
from sentinel.events import ChangeEvent, InstancesChanged, ServiceSpecChanged
from sentinel.integrations.retry import Route

if TYPE_CHECKING:
    from sentinel.client import Sentinel
    from sentinel.registry.endpoint import Endpoint
    from sentinel.strategies import Balancer, Endpoints, SelectionPolicy

log = logging.getLogger(__name__)

#: The call metadata that carries the shard key (gRPC metadata names are lower case).
KEY_METADATA = "x-sentinel-key"
FAILURE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,  # 503
        grpc.StatusCode.DEADLINE_EXCEEDED,  # 504
        grpc.StatusCode.UNKNOWN,  # 500: a server's unhandled exception, in grpcio
        grpc.StatusCode.INTERNAL,  # 500
        grpc.StatusCode.DATA_LOSS,  # 500
        grpc.StatusCode.UNIMPLEMENTED,  # 501
    }
)
"""The statuses reported as failures of the instance by default: those Envoy maps to a 5xx
(and so counts in its outlier detection's ``consecutive_5xx``): it could not be reached, did
not answer in time, or failed in itself. Any other status is the server's answer. The cap on
ejection and the panic keep a service served when every instance fails alike
(``docs/decisions/transports-count-server-errors.md``)."""

#: The multicallables kept per endpoint (one per method and (de)serializers); past this many
#: they are made again, so that a caller making new serializers per call cannot grow them.
MAX_METHODS = 1024
#: Endpoint schemes dialled with TLS.
SECURE_SCHEMES = frozenset({"https", "grpcs"})

#: Call metadata, as gRPC takes it: (name, value) pairs.
Metadata = Sequence[tuple[str, str | bytes]]


def target(endpoint: Endpoint) -> str:
    """The ``grpcio`` target of ``endpoint``: ``host:port``, an IPv6 literal in brackets."""
    host = endpoint.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{endpoint.port}"


class _Subchannel:
    """One ``grpcio`` channel to one endpoint address, the calls in flight on it, and the
    multicallables made on it (under the owning channel's lock but ``callables``)."""

    __slots__ = ("active", "callables", "channel", "retired", "uri")

    def __init__(self, uri: str, channel: grpc.Channel) -> None:
        self.uri = uri
        self.channel = channel
        self.active = 0
        self.retired = False
        # method's identity (kind, name, (de)serializers) -> its grpcio multicallable here
        self.callables: dict[tuple[object, ...], Any] = {}

    def callable(self, method: _Method) -> Any:
        """The ``grpcio`` multicallable of ``method`` on this channel, made once per method:
        a stub made per call (a new multicallable each time) reuses it."""
        callables = self.callables
        made = callables.get(method.identity)
        if made is None:
            if len(callables) >= MAX_METHODS:  # new serializers on every call: start again
                callables.clear()
            made = callables[method.identity] = method.make(self.channel)
        return made


class _Method:
    """What the four multicallables share: the method, its (de)serializers, and the channel
    whose calls they route."""

    __slots__ = ("_channel", "_request_serializer", "_response_deserializer", "identity", "name")
    #: The ``grpc.Channel`` method that makes this kind of multicallable.
    kind: str

    def __init__(
        self,
        channel: _Routing,
        method: str,
        request_serializer: Callable[[Any], bytes] | None,
        response_deserializer: Callable[[bytes], Any] | None,
    ) -> None:
        self._channel = channel
        self.name = method
        self._request_serializer = request_serializer
        self._response_deserializer = response_deserializer
        #: What makes two multicallables the same method on a ``grpcio`` channel.
        self.identity: tuple[object, ...] = (
            self.kind,
            method,
            request_serializer,
            response_deserializer,
        )
        try:
            hash(self.identity)
        except TypeError:  # an unhashable serializer: this multicallable's own, then
            self.identity = (self.kind, method, self)

    def make(self, channel: grpc.Channel) -> Any:
        """This method's multicallable on a ``grpcio`` channel."""
        return getattr(channel, self.kind)(
            self.name, self._request_serializer, self._response_deserializer
        )


def _blocking(
    channel: SentinelChannel,
    method: _Method,
    request: Any,
    timeout: float | None,
    metadata: Metadata | None,
    credentials: grpc.CallCredentials | None,
    wait_for_ready: bool | None,
    compression: grpc.Compression | None,
    how: str,
    may_retry: bool,
) -> Any:
    """A blocking call (``__call__`` or ``with_call`` of a unary-response method), made
    again elsewhere after ``UNAVAILABLE`` when ``may_retry`` and ``retries`` allow."""
    route, metadata = channel._route(metadata)
    if timeout is None:
        timeout = channel.timeout
    while True:
        subchannel = channel._acquire(route.endpoint)
        route.sent()
        try:
            result = getattr(subchannel.callable(method), how)(
                request, timeout, metadata, credentials, wait_for_ready, compression
            )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            if channel._outcome(route, code, method.name, timed=True, may_retry=may_retry):
                continue
            raise
        finally:
            channel._release(subchannel)
        route.succeeded()
        return result


def _started(
    channel: SentinelChannel,
    method: _Method,
    request: Any,
    timeout: float | None,
    metadata: Metadata | None,
    credentials: grpc.CallCredentials | None,
    wait_for_ready: bool | None,
    compression: grpc.Compression | None,
    how: str,
) -> Any:
    """A call handed to the caller before it ends (a stream, a future): its outcome is
    reported when it ends, and it is never made again."""
    route, metadata = channel._route(metadata)
    if timeout is None:
        timeout = channel.timeout
    subchannel = channel._acquire(route.endpoint)
    route.sent()
    try:
        call = getattr(subchannel.callable(method), how)(
            request, timeout, metadata, credentials, wait_for_ready, compression
        )
    except BaseException:
        channel._release(subchannel)
        raise
    name, timed = method.name, how == "future"  # a stream's time is the caller's reading

    def ended(done: Any) -> None:
        try:
            channel._outcome(route, done.code(), name, timed=timed, may_retry=False)
        finally:
            channel._release(subchannel)

    call.add_done_callback(ended)
    return call


class _UnaryResponse(_Method):
    """The calls of a method with one response (``request`` is an iterator of requests for a
    client-streaming one): blocking, ``with_call`` and ``future``."""

    __slots__ = ()
    #: Whether a call that ended ``UNAVAILABLE`` may be made again (its request can be sent
    #: again: not an iterator already consumed).
    may_retry: bool

    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        """Make the call on the endpoint resolved for it; returns the response."""
        return _blocking(
            self._channel,
            self,
            request,
            timeout,
            metadata,
            credentials,
            wait_for_ready,
            compression,
            "__call__",
            self.may_retry,
        )

    def with_call(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> tuple[Any, grpc.Call]:
        """Make the call; returns the response and the ``grpc.Call``."""
        return _blocking(
            self._channel,
            self,
            request,
            timeout,
            metadata,
            credentials,
            wait_for_ready,
            compression,
            "with_call",
            self.may_retry,
        )

    def future(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        """Start the call; returns its ``grpc.Future`` (never made again on a failure)."""
        return _started(
            self._channel,
            self,
            request,
            timeout,
            metadata,
            credentials,
            wait_for_ready,
            compression,
            "future",
        )


class _StreamResponse(_Method):
    """The call of a method with a stream of responses (``request`` is an iterator of
    requests for a bidirectional one)."""

    __slots__ = ()

    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Iterator[Any]:
        """Start the call; returns the iterator of responses (also a ``grpc.Call``)."""
        return _started(
            self._channel,
            self,
            request,
            timeout,
            metadata,
            credentials,
            wait_for_ready,
            compression,
            "__call__",
        )


class _UnaryUnary(_UnaryResponse, grpc.UnaryUnaryMultiCallable):
    """A unary-unary method of a :class:`SentinelChannel`."""

    __slots__ = ()
    kind = "unary_unary"
    may_retry = True


class _StreamUnary(_UnaryResponse, grpc.StreamUnaryMultiCallable):
    """A stream-unary method of a :class:`SentinelChannel`: never made again, its requests
    having been consumed."""

    __slots__ = ()
    kind = "stream_unary"
    may_retry = False


class _UnaryStream(_StreamResponse, grpc.UnaryStreamMultiCallable):
    """A unary-stream method of a :class:`SentinelChannel`."""

    __slots__ = ()
    kind = "unary_stream"


class _StreamStream(_StreamResponse, grpc.StreamStreamMultiCallable):
    """A stream-stream method of a :class:`SentinelChannel`."""

    __slots__ = ()
    kind = "stream_stream"


def _astarted(
    channel: AsyncSentinelChannel,
    method: _Method,
    request: Any,
    timeout: float | None,
    metadata: Metadata | None,
    credentials: grpc.CallCredentials | None,
    wait_for_ready: bool | None,
    compression: grpc.Compression | None,
    timed: bool,
) -> Any:
    """Start an asyncio call on the endpoint resolved for it; its outcome is reported by a
    task when it ends (``timed``: with its latency)."""
    route, metadata = channel._route(metadata)
    if timeout is None:
        timeout = channel.timeout
    subchannel = channel._acquire(route.endpoint)
    route.sent()
    try:
        call = subchannel.callable(method)(
            request,
            timeout=timeout,
            metadata=metadata,
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )
    except BaseException:
        channel._release(subchannel)
        raise

    async def ended() -> None:
        try:
            code = await call.code()
            channel._outcome(route, code, method.name, timed=timed, may_retry=False)
        finally:
            channel._release(subchannel)

    channel._keep(ended())
    return call


class _AsyncMethod(_Method):
    """An asyncio method of an :class:`AsyncSentinelChannel` (``request`` is an iterator of
    requests for a client-streaming one)."""

    __slots__ = ()
    #: Whether the call's latency is reported: it has one response.
    timed: bool

    def __call__(
        self,
        request: Any = None,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        """Start the call on the endpoint resolved for it; returns the ``grpc.aio`` call
        (await it for the response, or iterate it for a stream)."""
        return _astarted(
            self._channel,
            self,
            request,
            timeout,
            metadata,
            credentials,
            wait_for_ready,
            compression,
            self.timed,
        )


class _AsyncUnaryUnary(_AsyncMethod, grpc.aio.UnaryUnaryMultiCallable):
    """A unary-unary method of an :class:`AsyncSentinelChannel`."""

    __slots__ = ()
    kind = "unary_unary"
    timed = True


class _AsyncStreamUnary(_AsyncMethod, grpc.aio.StreamUnaryMultiCallable):
    """A stream-unary method of an :class:`AsyncSentinelChannel`."""

    __slots__ = ()
    kind = "stream_unary"
    timed = True


class _AsyncUnaryStream(_AsyncMethod, grpc.aio.UnaryStreamMultiCallable):
    """A unary-stream method of an :class:`AsyncSentinelChannel`."""

    __slots__ = ()
    kind = "unary_stream"
    timed = False


class _AsyncStreamStream(_AsyncMethod, grpc.aio.StreamStreamMultiCallable):
    """A stream-stream method of an :class:`AsyncSentinelChannel`."""

    __slots__ = ()
    kind = "stream_stream"
    timed = False


class _Routing:
    """What the sync and async channels share: the options, the per-call resolution, the
    pool of ``grpcio`` channels by endpoint address and the following of the cache."""

    def __init__(
        self,
        client: Sentinel,
        service: str,
        *,
        key: object = None,
        policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | str | None = None,
        balancer: Balancer | str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        compression: grpc.Compression | None = None,
        timeout: float | None = None,
        key_metadata: str = KEY_METADATA,
        failure_codes: frozenset[grpc.StatusCode] = FAILURE_CODES,
        retries: int = 0,
        max_channels: int = 256,
    ) -> None:
        check.integer("retries", retries, least=0)
        check.integer("max_channels", max_channels, least=1)
        if timeout is not None:
            check.number("timeout", timeout, above=0)
        if (
            not isinstance(key_metadata, str)
            or key_metadata != key_metadata.lower()
            or not key_metadata
        ):
            raise ValidationError(f"key_metadata must be a lower-case name, not {key_metadata!r}")
        self.client = client
        self.service = service
        self.key = key
        self.policy = policy
        self.balancer = balancer
        self.credentials = credentials
        self.options = tuple(options)
        self.compression = compression
        self.timeout = timeout
        self.key_metadata = key_metadata
        self.failure_codes = frozenset(failure_codes)
        self.retries = retries
        self.max_channels = max_channels
        self._lock = threading.Lock()  # events arrive on the cache's thread, calls elsewhere
        self._pool: dict[str, _Subchannel] = {}  # endpoint URI -> its channel, oldest first
        self._closed = False
        self._bind()
        self._unlisten = client.listen(service, self._on_event)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.service!r}, channels={len(self._pool)})"

    def _open_eligible(self) -> None:
        """Open a channel to every eligible endpoint of the channel's ``key`` (none when
        none is eligible now; a missing service raises what ``get_service`` raises)."""
        try:
            endpoints = self.client.eligible_instances(self.service, self.key, self.policy)
        except NoInstanceAvailable:
            return
        for endpoint in endpoints:
            self._release(self._acquire(endpoint))

    def _subchannels(self) -> list[_Subchannel]:
        """The channels open now."""
        with self._lock:
            return list(self._pool.values())

    # --- the four kinds of method (``_kinds``: each one's multicallable class) --------------

    _kinds: ClassVar[dict[str, type[_Method]]]

    def unary_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A unary-unary multicallable for ``method`` (``/package.Service/Method``)."""
        return self._kinds["unary_unary"](self, method, request_serializer, response_deserializer)

    def unary_stream(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A unary-stream multicallable for ``method``."""
        return self._kinds["unary_stream"](self, method, request_serializer, response_deserializer)

    def stream_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A stream-unary multicallable for ``method``."""
        return self._kinds["stream_unary"](self, method, request_serializer, response_deserializer)

    def stream_stream(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A stream-stream multicallable for ``method``."""
        return self._kinds["stream_stream"](self, method, request_serializer, response_deserializer)

    # --- what each kind of channel does its own way ---------------------------------------

    def _bind(self) -> None:
        """Set up what the hooks need, before the first event can arrive."""
        raise NotImplementedError

    def _dial(self, address: str, credentials: grpc.ChannelCredentials | None) -> Any:
        """A new ``grpcio`` channel to ``address`` (TLS with ``credentials``)."""
        raise NotImplementedError

    def _opened(self, subchannel: _Subchannel) -> None:
        """``subchannel`` was just opened (outside the lock)."""

    def _discard(self, subchannel: _Subchannel) -> None:
        """Close ``subchannel`` soon, without waiting here: it may be the cache's thread."""
        raise NotImplementedError

    # --- the pool -------------------------------------------------------------------------

    @property
    def open_channels(self) -> int:
        """The ``grpcio`` channels this channel keeps open now (those closing not counted)."""
        return len(self._pool)

    def _route(self, metadata: Metadata | None) -> tuple[Route, Metadata | None]:
        """Resolve a call: its route, and the metadata to send (without the shard key)."""
        key = self.key
        if metadata:
            name = self.key_metadata
            kept = [item for item in metadata if item[0] != name]
            if len(kept) != len(metadata):
                key = next(value for header, value in metadata if header == name)
                metadata = kept
        return Route(
            self.client, self.service, key, self.policy, self.balancer, self.retries
        ), metadata

    def _acquire(self, endpoint: Endpoint) -> _Subchannel:
        """The channel to ``endpoint``'s address, opened if needed, with one more call on it."""
        uri = endpoint.uri
        idle: list[_Subchannel] = []
        with self._lock:
            if self._closed:
                raise ClientClosed(f"the channel to {self.service} is closed")
            subchannel = self._pool.get(uri)
            opened = subchannel is None
            if subchannel is None:
                subchannel = self._open(endpoint, idle)
            subchannel.active += 1
        # Outside the lock: closing and watching call into gRPC and the subscribers.
        self._close_later(idle)
        if opened:
            self._opened(subchannel)
        return subchannel

    def _open(self, endpoint: Endpoint, idle: list[_Subchannel]) -> _Subchannel:
        """Open a channel to ``endpoint`` (under the lock; gRPC dials later, on its own
        threads); past ``max_channels``, the oldest idle one is retired into ``idle``."""
        pool = self._pool
        if len(pool) >= self.max_channels:
            oldest = next((uri for uri, old in pool.items() if old.active == 0), None)
            if oldest is not None:
                self._retire(pool.pop(oldest), idle)
        credentials = self.credentials
        if credentials is None and endpoint.scheme in SECURE_SCHEMES:
            credentials = grpc.ssl_channel_credentials()
        channel = self._dial(target(endpoint), credentials)
        subchannel = pool[endpoint.uri] = _Subchannel(endpoint.uri, channel)
        log.debug("%s: channel opened to %s", self.service, endpoint.uri)
        return subchannel

    def _release(self, subchannel: _Subchannel) -> None:
        """One call on ``subchannel`` ended: close it if it was retired and is idle now."""
        with self._lock:
            subchannel.active -= 1
            idle = subchannel.retired and subchannel.active == 0
        if idle:
            self._close_later([subchannel])

    @staticmethod
    def _retire(subchannel: _Subchannel, idle: list[_Subchannel]) -> None:
        """Take ``subchannel``, removed from the pool, out of use (under the lock): into
        ``idle`` to close now when no call is on it, else closed when its last call ends."""
        subchannel.retired = True
        if subchannel.active == 0:
            idle.append(subchannel)

    def _close_later(self, subchannels: list[_Subchannel]) -> None:
        """Have ``subchannels`` closed, without waiting here (never under the lock)."""
        for subchannel in subchannels:
            self._discard(subchannel)

    def _on_event(self, event: ChangeEvent) -> None:
        # On the cache's worker thread: dictionary work under the lock, closing on _closer.
        if isinstance(event, InstancesChanged):
            gone = {e.uri for e in event.removed}
            gone.update(old.uri for old, new in event.updated if old.uri != new.uri)
        elif isinstance(event, ServiceSpecChanged) and event.new is None:
            gone = set(self._pool)
        else:
            return
        idle: list[_Subchannel] = []
        with self._lock:
            for uri in gone:
                subchannel = self._pool.pop(uri, None)
                if subchannel is not None:
                    self._retire(subchannel, idle)
        self._close_later(idle)

    def _outcome(
        self, route: Route, code: grpc.StatusCode, what: str, *, timed: bool, may_retry: bool
    ) -> bool:
        """Report how a call on ``route.endpoint`` ended with ``code`` (``timed``: with its
        latency); returns whether to make it again elsewhere (``may_retry`` and it ended
        ``UNAVAILABLE``, within ``retries``)."""
        if code not in self.failure_codes:
            if code is not grpc.StatusCode.CANCELLED:  # the caller's doing, not the instance's
                route.succeeded(timed=timed)
            return False
        return route.failed(what, code.name, may_retry and code is grpc.StatusCode.UNAVAILABLE)


class SentinelChannel(_Routing, grpc.Channel):
    """A ``grpc.Channel`` to ``service`` whose calls each go to the endpoint Sentinel resolves
    (see the module's documentation). Give it to any generated stub.

    ``client`` is a started :class:`~sentinel.Sentinel`. ``key`` is the shard key of calls
    without the metadata ``key_metadata`` (``x-sentinel-key``); ``policy`` and ``balancer`` go to
    every lookup (None: the service's defaults, round robin).

    ``credentials`` (a :func:`grpc.ssl_channel_credentials`) dial every endpoint with TLS;
    without them, endpoints whose scheme is ``https`` or ``grpcs`` are dialled with TLS and the
    system's roots, the others in plaintext. A caller who gives credentials never has a call
    sent in the clear, whatever a registry entry's scheme says. ``options`` go to every
    ``grpcio`` channel (``grpc.ssl_target_name_override`` when certificates name another host
    than the one registered), ``compression`` too. ``timeout`` is the deadline, in seconds,
    of calls made without one (None: none, as in gRPC; a server that never answers then holds
    the call for ever).

    ``failure_codes`` are the statuses reported as the instance's failures. ``retries`` (0 by
    default) makes a unary call that ended ``UNAVAILABLE`` again on another eligible endpoint,
    at most that many times: ``UNAVAILABLE`` does not say whether the server acted on the call
    (a server may answer it itself), so only give it for idempotent methods. Streaming calls
    and futures are never made again: their outcome is known only after they were handed over.

    ``max_channels`` bounds the ``grpcio`` channels kept open (the least recently opened idle
    one is closed past it). :meth:`close` closes them all, ending their calls in flight, as
    ``grpc.Channel.close`` does; so does leaving a ``with`` block. Invalid arguments raise
    :class:`~sentinel.errors.ValidationError`.
    """

    _kinds: ClassVar[dict[str, type[_Method]]] = {
        "unary_unary": _UnaryUnary,
        "unary_stream": _UnaryStream,
        "stream_unary": _StreamUnary,
        "stream_stream": _StreamStream,
    }

    def _bind(self) -> None:
        # Closing a channel is handed to this one thread: never on the cache's worker thread
        # (a departure) nor on gRPC's (the last call on a retired channel ended).
        self._closer = ThreadPoolExecutor(1, thread_name_prefix=f"sentinel-grpc-{self.service}")
        self._connectivity = _Connectivity(self.service)

    def _dial(self, address: str, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
        if credentials is None:
            return grpc.insecure_channel(address, self.options, self.compression)
        return grpc.secure_channel(address, credentials, self.options, self.compression)

    def _opened(self, subchannel: _Subchannel) -> None:
        self._connectivity.opened(subchannel)

    def _discard(self, subchannel: _Subchannel) -> None:
        self._connectivity.closed(subchannel)
        with contextlib.suppress(RuntimeError):  # shut down: close() closed them all
            self._closer.submit(_close, self.service, subchannel)

    # --- grpc.Channel -----------------------------------------------------------------------

    def subscribe(
        self, callback: Callable[[grpc.ChannelConnectivity], None], try_to_connect: bool = False
    ) -> None:
        """Call ``callback(state)`` with the connectivity of the channel as a whole, and
        again whenever it changes: ``READY`` when any endpoint's channel is, else
        ``CONNECTING``, ``TRANSIENT_FAILURE`` or ``IDLE`` in that order (``IDLE`` with no
        channel open). ``try_to_connect`` opens a channel to every eligible endpoint of the
        channel's ``key`` and connects them (none when none is eligible now; a missing
        service raises what ``get_service`` raises). Callbacks run on gRPC's threads."""
        if try_to_connect:
            self._open_eligible()
        self._connectivity.subscribe(callback, self._subchannels(), try_to_connect)

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        """Stop calling ``callback``."""
        self._connectivity.unsubscribe(callback)

    def close(self) -> None:
        """Stop following the cache and close every ``grpcio`` channel, ending the calls in
        flight (as ``grpc.Channel.close``); later calls raise
        :class:`~sentinel.errors.ClientClosed`. Idempotent."""
        self._unlisten()
        with self._lock:
            self._closed = True
            subchannels = list(self._pool.values())
            self._pool.clear()
        for subchannel in subchannels:
            subchannel.retired = True
            subchannel.channel.close()
        self._closer.shutdown(wait=True)

    def __enter__(self) -> SentinelChannel:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _close(service: str, subchannel: _Subchannel) -> None:
    """Close one channel (on the closer thread): its failure is logged, never lost."""
    try:
        subchannel.channel.close()
    except Exception:
        log.exception("%s: closing the channel to %s failed", service, subchannel.uri)
    else:
        log.debug("%s: channel to %s closed", service, subchannel.uri)


_BEST_FIRST = (
    grpc.ChannelConnectivity.READY,
    grpc.ChannelConnectivity.CONNECTING,
    grpc.ChannelConnectivity.TRANSIENT_FAILURE,
)


def overall(states: Iterable[grpc.ChannelConnectivity]) -> grpc.ChannelConnectivity:
    """The connectivity of several ``grpcio`` channels as one: ``READY`` when any is, else
    ``CONNECTING``, else ``TRANSIENT_FAILURE``, else ``IDLE`` (none open counts as idle)."""
    present = set(states)
    return next((state for state in _BEST_FIRST if state in present), grpc.ChannelConnectivity.IDLE)


class _Connectivity:
    """The connectivity of a :class:`SentinelChannel` as a whole, for ``subscribe``: the
    ``grpcio`` channels are watched only while someone subscribed (each watch is a thread)."""

    def __init__(self, service: str) -> None:
        self._service = service
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[grpc.ChannelConnectivity], None]] = []
        self._states: dict[str, grpc.ChannelConnectivity] = {}
        self._watchers: dict[str, tuple[grpc.Channel, Callable[..., None]]] = {}
        self._last: grpc.ChannelConnectivity | None = None

    def subscribe(
        self,
        callback: Callable[[grpc.ChannelConnectivity], None],
        subchannels: list[_Subchannel],
        try_to_connect: bool,
    ) -> None:
        """Add ``callback`` and watch ``subchannels`` (the channels open now)."""
        with self._lock:
            self._callbacks.append(callback)
            last = self._last
        for subchannel in subchannels:
            self._watch(subchannel, try_to_connect)
        if not subchannels:
            callback(grpc.ChannelConnectivity.IDLE)
        elif last is not None:  # the watches report changes only: say where it stands
            callback(last)

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)
            if self._callbacks:
                return
            watchers = list(self._watchers.values())
            self._watchers.clear()
            self._states.clear()
            self._last = None
        for channel, watcher in watchers:
            channel.unsubscribe(watcher)

    def opened(self, subchannel: _Subchannel) -> None:
        if self._callbacks:
            self._watch(subchannel, False)

    def closed(self, subchannel: _Subchannel) -> None:
        with self._lock:
            held = self._watchers.pop(subchannel.uri, None)
            self._states.pop(subchannel.uri, None)
        if held is not None:
            held[0].unsubscribe(held[1])
            self._changed()

    def _watch(self, subchannel: _Subchannel, try_to_connect: bool) -> None:
        uri = subchannel.uri

        def watcher(state: grpc.ChannelConnectivity) -> None:
            with self._lock:
                if uri not in self._watchers:
                    return
                self._states[uri] = state
            self._changed()

        with self._lock:
            if uri in self._watchers:
                return
            self._watchers[uri] = (subchannel.channel, watcher)
        subchannel.channel.subscribe(watcher, try_to_connect)

    def _state(self) -> grpc.ChannelConnectivity:
        return overall(self._states.values())

    def _changed(self) -> None:
        with self._lock:
            state = self._state()
            if state is self._last:
                return
            self._last = state
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(state)
            except Exception:
                log.exception("%s: a connectivity callback failed", self._service)


class AsyncSentinelChannel(_Routing, grpc.aio.Channel):
    """The asyncio twin of :class:`SentinelChannel`, a ``grpc.aio.Channel`` for stubs used
    with ``await``: the same parameters and behaviour, on ``grpc.aio`` channels.

    Create it on the event loop that uses it (the ``grpc.aio`` channels it opens belong to
    that loop), else :class:`~sentinel.errors.ValidationError`; close it with
    ``await channel.close()`` or ``async with``. Each call is handed over as it starts, so
    none is made again: ``retries`` must be 0. Its outcome is reported when it ends, by a
    task that awaits its status. Channels of instances that left are closed on the loop,
    scheduled from the cache's thread without waiting for it.

    ``get_service`` does not block on a warm cache, but a service's first lookup reads
    ZooKeeper: call ``sentinel.prefetch(service)`` at start-up to keep it off the event loop.
    """

    _kinds: ClassVar[dict[str, type[_Method]]] = {
        "unary_unary": _AsyncUnaryUnary,
        "unary_stream": _AsyncUnaryStream,
        "stream_unary": _AsyncStreamUnary,
        "stream_stream": _AsyncStreamStream,
    }

    def _bind(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise ValidationError(
                "AsyncSentinelChannel must be created on the event loop that uses it"
            ) from None
        if self.retries:
            raise ValidationError("AsyncSentinelChannel makes no call again: retries must be 0")
        self._tasks: set[asyncio.Task[None]] = set()
        self._pool_changed = asyncio.Event()  # for wait_for_state_change: opened or closed

    def _dial(self, address: str, credentials: grpc.ChannelCredentials | None) -> Any:
        if credentials is None:
            return grpc.aio.insecure_channel(address, self.options, self.compression)
        return grpc.aio.secure_channel(address, credentials, self.options, self.compression)

    def _opened(self, subchannel: _Subchannel) -> None:
        self._pool_changed.set()  # _acquire runs on the loop

    def _discard(self, subchannel: _Subchannel) -> None:
        if not to_loop(self._loop, self._close_on_loop, subchannel):
            log.debug("%s: loop closed; channel to %s dropped", self.service, subchannel.uri)

    def _close_on_loop(self, subchannel: _Subchannel) -> None:
        self._pool_changed.set()
        self._keep(_aclose(self.service, subchannel))

    def _keep(self, coroutine: Any) -> None:
        """Run ``coroutine`` as a task of the loop, held until it ends."""
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- grpc.aio.Channel -------------------------------------------------------------------

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        """The connectivity of the channel as a whole (:func:`overall` of its ``grpcio``
        channels'); ``try_to_connect`` opens and connects a channel to every eligible
        endpoint of the channel's ``key``."""
        if try_to_connect:
            self._open_eligible()
        return overall(s.channel.get_state(try_to_connect) for s in self._subchannels())

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        """Return once :meth:`get_state` is no longer ``last_observed_state``."""
        while self.get_state() is last_observed_state:
            self._pool_changed.clear()
            waits = [
                asyncio.ensure_future(s.channel.wait_for_state_change(s.channel.get_state()))
                for s in self._subchannels()
            ]
            waits.append(asyncio.ensure_future(self._pool_changed.wait()))
            _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for waiting in pending:
                waiting.cancel()

    async def channel_ready(self) -> None:
        """Return once the channel as a whole is ``READY``, connecting every eligible
        endpoint."""
        state = self.get_state(try_to_connect=True)
        while state is not grpc.ChannelConnectivity.READY:
            await self.wait_for_state_change(state)
            state = self.get_state(try_to_connect=True)

    async def close(self, grace: float | None = None) -> None:
        """Stop following the cache and close every ``grpcio`` channel (calls in flight get
        ``grace`` seconds, None: none, as ``grpc.aio.Channel.close``); later calls raise
        :class:`~sentinel.errors.ClientClosed`."""
        self._unlisten()
        with self._lock:
            self._closed = True
            subchannels = list(self._pool.values())
            self._pool.clear()
        for subchannel in subchannels:
            subchannel.retired = True
        await asyncio.gather(*(s.channel.close(grace) for s in subchannels))
        if self._tasks:  # the reports of the calls just ended, and closings under way
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> AsyncSentinelChannel:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


async def _aclose(service: str, subchannel: _Subchannel) -> None:
    """Close one ``grpc.aio`` channel (a task of its loop): its failure is logged."""
    try:
        await subchannel.channel.close()
    except Exception:
        log.exception("%s: closing the channel to %s failed", service, subchannel.uri)


__all__ = ["FAILURE_CODES", "AsyncSentinelChannel", "SentinelChannel", "overall", "target"]
