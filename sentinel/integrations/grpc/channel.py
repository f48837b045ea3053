"""The sync channel, :class:`SentinelChannel`: a ``grpc.Channel`` on ``grpcio`` channels, its
four kinds of multicallables and its connectivity."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

import grpc
import grpc.aio

from sentinel.integrations.grpc.routing import (
    Metadata,
    _Method,
    _Routing,
    _Subchannel,
    overall,
)

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


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
