"""What :class:`~sentinel.integrations.grpc.SentinelChannel` and
:class:`~sentinel.integrations.grpc.AsyncSentinelChannel` share: the options, each call's
resolution and report, the pool of ``grpcio`` channels by endpoint address, and the following
of the cache (the package's documentation says how they behave)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import grpc
import grpc.aio

from sentinel import validation as check
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
