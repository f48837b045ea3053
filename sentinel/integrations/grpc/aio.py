"""The asyncio channel, :class:`AsyncSentinelChannel`: a ``grpc.aio.Channel`` on ``grpc.aio``
channels (gRPC keeps its own two apart, ``_channel.py`` and ``aio/_channel.py``)."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

import grpc
import grpc.aio

from sentinel.aio import to_loop
from sentinel.errors import ValidationError
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
