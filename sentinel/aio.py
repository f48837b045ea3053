"""Sentinel for asyncio: the client's blocking calls off the event loop, its events as an
async iterator.

:class:`AsyncSentinel` takes :class:`~sentinel.Sentinel`'s arguments and wraps one::

    async with AsyncSentinel(hosts="127.0.0.1:2181", client_id="billing-api") as client:
        await client.prefetch("orders-db")                 # first load: off the loop
        endpoint = client.get_service("orders-db", key=tenant)   # warm: a plain call
        async with client.events("orders-db") as events:
            async for event in events:
                ...

Everything that waits for ZooKeeper (start, close, registration, every write, a service's
first load) runs on a worker thread (:func:`asyncio.to_thread`) and is awaited; the lookups
(``get_service``, ``eligible_instances``, ``partition_of``, ``cached_instances``, ``report``)
are the sync client's own methods, called directly: on a warm cache they are dictionary
lookups. A lookup that finds its service not loaded, or a shard key not in the cached map,
reads ZooKeeper (Procedure 1's read-through, rate-limited and negatively cached) and blocks the
loop for that round trip: ``await client.prefetch(service)`` at start-up, or
``await client.aget_service(...)`` where keys are often new, keeps it off the loop. The
``a`` names the awaited twin of a plain method, as httpx's ``Response.read``/``aread``.

:meth:`AsyncSentinel.events` hands the cache's events (:mod:`sentinel.events`) to one event
loop through a bounded buffer: the cache's worker thread appends and, when the consumer waits,
wakes it with ``call_soon_threadsafe``; it never waits. When the consumer falls ``maxsize``
events behind, newer events are dropped and counted, and the consumer gets
:class:`EventsMissed` in their place: re-read what it follows (``client.cached_instances(service)``)
and carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from sentinel import validation as check
from sentinel.client import Sentinel
from sentinel.errors import ValidationError
from sentinel.events import ChangeEvent
from sentinel.publisher import Registration

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_MAX_EVENTS = 1000


@dataclass(frozen=True)
class EventsMissed:
    """``count`` events were dropped here because the consumer fell behind: what it follows
    may have changed in ways it was not told; read it again from the cache."""

    count: int


def to_loop(loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any) -> bool:
    """Run ``callback(*args)`` on ``loop`` soon, from any thread, without waiting; False
    when the loop is closed (and the callback dropped with it)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        return False
    return True


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # a cancelled consumer's future
        waiter.set_result(None)


class _Feed:
    """Events from the cache's worker thread to a consumer on one loop: at most ``maxsize``
    held, and :meth:`put` never waits (a full buffer drops and counts)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, maxsize: int) -> None:
        self._loop = loop
        self._maxsize = maxsize
        self._lock = threading.Lock()  # put() on the worker thread, get() on the loop
        self._events: deque[ChangeEvent | EventsMissed] = deque()
        self._missed = 0
        self._waiter: asyncio.Future[None] | None = None
        self._getting = False  # on the loop only
        self._closed = False

    def put(self, event: ChangeEvent) -> None:
        """The listener, on the cache's worker thread: buffer, or count as missed."""
        with self._lock:
            if self._closed:
                return
            if len(self._events) >= self._maxsize:
                self._missed += 1
                return
            if self._missed:  # the gap is marked where it happened
                self._events.append(EventsMissed(self._missed))
                self._missed = 0
            self._events.append(event)
            waiter, self._waiter = self._waiter, None
        # At most one wake-up per wait is ever queued on the loop, however many events come.
        if waiter is not None:
            to_loop(self._loop, _wake, waiter)

    async def get(self) -> ChangeEvent | EventsMissed:
        """The next event, waiting for one; StopAsyncIteration once closed."""
        if self._getting:
            raise RuntimeError("another task is already waiting for this stream's next event")
        self._getting = True
        try:
            while True:
                with self._lock:
                    if self._closed:
                        raise StopAsyncIteration
                    if self._events:
                        return self._events.popleft()
                    if self._missed:
                        missed, self._missed = self._missed, 0
                        return EventsMissed(missed)
                    waiter = self._waiter = self._loop.create_future()
                await waiter
        finally:
            self._getting = False

    def close(self) -> None:
        """Drop what is held and end the consumer's wait (on the loop)."""
        with self._lock:
            self._closed = True
            self._events.clear()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)


class EventStream:
    """The events of one service (or of all, ``service=None``) as an async iterator; see
    :meth:`AsyncSentinel.events`.

    Its listener is added when the stream is made and removed by :meth:`aclose` (``async
    with`` calls it), when the client closes, or when the stream is garbage collected.
    """

    def __init__(self, client: AsyncSentinel, service: str | None, maxsize: int) -> None:
        if maxsize < 1:
            raise ValidationError(f"maxsize must be at least 1, not {maxsize}")
        self.service = service
        self._client = client
        # The cache holds only the feed, never the stream: a stream dropped without aclose()
        # (a break out of a bare ``async for``) is collected and its finalizer unlistens.
        self._feed = _Feed(asyncio.get_running_loop(), maxsize)
        self._unlisten = weakref.finalize(self, client.sync.listen(service, self._feed.put))
        self._followed = service is None

    def __repr__(self) -> str:
        return f"<EventStream service={self.service!r} open={self._unlisten.alive}>"

    async def __aenter__(self) -> EventStream:
        await self._follow()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> ChangeEvent | EventsMissed:
        if not self._followed:
            await self._follow()
        return await self._feed.get()

    async def _follow(self) -> None:
        """Load the service (off the loop) so that the cache watches it: only services the
        client follows have events."""
        if self._followed or self.service is None or not self._unlisten.alive:
            return
        try:
            await self._client.prefetch(self.service)
        except Exception:
            if not self._unlisten.alive:  # closed meanwhile (with the client): the end
                return
            await self.aclose()  # a service it cannot follow (ServiceNotFound) ends it
            raise
        self._followed = True

    async def aclose(self) -> None:
        """Remove the listener and end the iteration; idempotent."""
        self._unlisten()
        self._feed.close()


def _off_loop(
    method: Callable[Concatenate[Sentinel, P], R],
) -> Callable[Concatenate[AsyncSentinel, P], Coroutine[Any, Any, R]]:
    """``Sentinel.<method>`` as a coroutine method of :class:`AsyncSentinel`, run on a worker
    thread; its signature (overloads too) is the sync method's, for type checkers."""

    async def call(self: AsyncSentinel, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(method, self.sync, *args, **kwargs)

    functools.update_wrapper(call, method)
    call.__qualname__ = f"AsyncSentinel.{method.__name__}"
    call.__doc__ = f"Awaitable ``Sentinel.{method.__name__}``, run off the event loop.\n\n" + (
        method.__doc__ or ""
    )
    return call


def _takes_arguments_of(
    source: Callable[P, object],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, P], None]]:
    """Give the decorated ``__init__`` ``source``'s parameters, for type checkers (it passes
    them on unchanged)."""

    def typed(init: Callable[..., None]) -> Callable[Concatenate[Any, P], None]:
        return init

    return typed


class AsyncSentinel:
    """A :class:`~sentinel.Sentinel` for asyncio code: same arguments, awaited writes.

    ``async with AsyncSentinel(...) as client`` starts it (off the loop) and closes it. The
    sync client is :attr:`sync`; give it to the integrations (``AsyncReplicaPools(client.sync,
    ...)``, ``AsyncSentinelTransport(client.sync)``) and use it for what is not mirrored here
    (``listen``, ``feedback``, ``ejections``, ``connection_state``, ...).

    Plain calls (the sync client's methods; no I/O on a warm cache): ``get_service``,
    ``eligible_instances``, ``partition_of``, ``cached_instances``, ``report``.

    Awaited, run on a worker thread: :meth:`start`, :meth:`close`, ``prefetch``,
    ``aget_service`` and ``aget_eligible_instances`` (the lookups, for a cold cache or an
    uncached key), ``explain``, ``read_service``, the
    publisher's ``ensure_service``, ``set_failover``, ``register``, ``update_registration``,
    :meth:`deregister` (its wait on the loop), ``update_metrics``, and every method of the role
    objects ``shard_maps`` (the shard manager's writes) and ``credentials`` (the
    authentication manager's).
    """

    @_takes_arguments_of(Sentinel)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sync = Sentinel(*args, **kwargs)
        self.get_service = self.sync.get_service
        self.eligible_instances = self.sync.eligible_instances
        self.partition_of = self.sync.partition_of
        self.cached_instances = self.sync.cached_instances
        self.report = self.sync.report
        #: ``Sentinel.shard_maps``, awaited: ``await client.shard_maps.create(...)``.
        self.shard_maps = OffLoop(self.sync.shard_maps)
        #: ``Sentinel.credentials``, awaited: ``await client.credentials.publish(...)``.
        self.credentials = OffLoop(self.sync.credentials)
        self._streams: weakref.WeakSet[EventStream] = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"<AsyncSentinel {self.sync!r}>"

    async def __aenter__(self) -> AsyncSentinel:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> AsyncSentinel:
        """Connect (:meth:`Sentinel.start`) off the loop.

        A thread cannot be interrupted: when the awaiting task is cancelled (a timeout around
        the start), the cancellation waits for the start to end and the client is closed
        before it is raised, so a start that did not return leaves no session behind.
        """
        starting = asyncio.ensure_future(asyncio.to_thread(self.sync.start))
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            # Shielded: cancelled again meanwhile, the task still closes once the start ends.
            await asyncio.shield(self._close_after(starting))
            raise
        return self

    async def _close_after(self, starting: asyncio.Future[Sentinel]) -> None:
        with contextlib.suppress(Exception):  # a failed start left nothing to close
            await starting
        await self.close()

    async def close(self) -> None:
        """End every open :meth:`events` stream, then the session (off the loop)."""
        for stream in list(self._streams):
            await stream.aclose()
        await asyncio.to_thread(self.sync.close)

    def events(self, service: str | None, maxsize: int = DEFAULT_MAX_EVENTS) -> EventStream:
        """The cache's events for ``service`` (None: every service) as an async iterator.

        Call it on the loop that consumes it. The listener is added at once; the service is
        loaded (off the loop) when the stream is entered or first iterated, since only
        followed services have events. Events come in the cache's order. At most ``maxsize``
        wait for the consumer; beyond that they are dropped and counted, and the consumer gets
        one :class:`EventsMissed` where they were: the cache's worker thread never waits for
        it. ``async with client.events(s) as events: async for event in events: ...`` removes
        the listener on exit.
        """
        stream = EventStream(self, service, maxsize)
        self._streams.add(stream)
        return stream

    async def deregister(self, registration: Registration, *, wait: float = 0.0) -> bool:
        """:meth:`Sentinel.deregister` without a thread held while it waits: the node is
        removed off the loop, then ``wait`` seconds are slept on the loop."""
        wait = check.number("wait", wait, least=0)
        removed = await asyncio.to_thread(self.sync.deregister, registration)
        await asyncio.sleep(wait)
        return removed

    async def update_registration(self, registration: Registration, **changes: Any) -> Registration:
        """Awaitable :meth:`Sentinel.update_registration`, run off the event loop."""
        # Written out: its ``**changes`` could take a ``self``, which a ParamSpec refuses.
        return await asyncio.to_thread(self.sync.update_registration, registration, **changes)

    prefetch = _off_loop(Sentinel.prefetch)
    aget_service = _off_loop(Sentinel.get_service)
    aget_eligible_instances = _off_loop(Sentinel.eligible_instances)
    explain = _off_loop(Sentinel.explain)
    read_service = _off_loop(Sentinel.read_service)
    ensure_service = _off_loop(Sentinel.ensure_service)
    set_failover = _off_loop(Sentinel.set_failover)
    register = _off_loop(Sentinel.register)
    update_metrics = _off_loop(Sentinel.update_metrics)


class OffLoop:
    """A role object of the sync client (``shard_maps``, ``credentials``) whose methods are
    coroutine functions, each run on a worker thread: ``await client.shard_maps.create(...)``."""

    def __init__(self, role: object) -> None:
        self._role = role

    def __getattr__(self, name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        method = getattr(self._role, name)

        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return call

    def __repr__(self) -> str:
        return f"<awaitable {self._role.__class__.__name__}>"


__all__ = ["AsyncSentinel", "EventStream", "EventsMissed", "OffLoop", "to_loop"]
