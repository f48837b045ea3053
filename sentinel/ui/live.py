"""Server-sent events: one subscription to the client's changes, fanned out to every page.

The cache's listener (:meth:`ChangeFeed.on_change`, on the cache's worker thread) only
numbers the change and hands it to the event loop, once per change whatever the number of
viewers; on the loop, :meth:`ChangeFeed._fan_out` puts it in each open stream's bounded
queue. A viewer that does not read its stream fast enough (its queue full) is dropped: its
stream ends, and its browser's EventSource opens a new one when it can, where the page
re-reads itself once. At most ``max_streams`` streams are open at once; one more is refused
with 503 and a ``Retry-After``, and nothing else in the process is affected.

Each event is ``{"version": N, "service": NAME or null, "kind": ..., "at": UNIX TIME}``: the
page asks the server for its own new content (from the cache) when the change is one it
shows. ZooKeeper is never read for a viewer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge

from sentinel.events import ChangeEvent, ConnectionChanged

VIEWERS = Gauge("sentinel_ui_viewers", "Dashboard pages holding a live stream open now")
EVENTS_SENT = Counter(
    "sentinel_ui_events_sent", "Change events written to the dashboard's live streams"
)
STREAMS_REFUSED = Counter(
    "sentinel_ui_streams_refused",
    "Live streams refused (the cap on open streams) or dropped (a viewer too slow to read)",
    ["reason"],
)

#: Events a stream holds for its viewer before the viewer counts as too slow.
QUEUE_SIZE = 64
#: Seconds of silence after which a stream sends a comment (proxies close idle streams).
HEARTBEAT = 15.0
#: What a dropped stream's queue holds last.
_DROPPED = object()


@dataclass(eq=False)
class Stream:
    """One viewer's open stream: its bounded queue of events."""

    queue: asyncio.Queue[object] = field(default_factory=lambda: asyncio.Queue(QUEUE_SIZE))


class ChangeFeed:
    """The change fan-out of one process (see the module's docstring)."""

    def __init__(self, max_streams: int) -> None:
        self.max_streams = max_streams
        self.version = 0
        self.updated_at = time.time()
        self._lock = threading.Lock()  # numbers changes from the cache's and the source's threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: set[Stream] = set()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver to streams on ``loop`` (the server's, once it runs)."""
        self._loop = loop

    @property
    def open_streams(self) -> int:
        """Streams open now."""
        return len(self._streams)

    def on_change(self, event: ChangeEvent) -> None:
        """The cache's listener (its worker thread): never blocks."""
        service = getattr(event, "service", None)
        kind = type(event).__name__
        if isinstance(event, ConnectionChanged):
            kind = f"connection {event.state}"
        self.publish(service, kind)

    def publish(self, service: str | None, kind: str) -> None:
        """Number a change and hand it to the loop (any thread; never blocks)."""
        with self._lock:
            self.version += 1
            self.updated_at = time.time()
            message = json.dumps(
                {"version": self.version, "service": service, "kind": kind, "at": self.updated_at}
            )
            version = self.version
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody to tell
                loop.call_soon_threadsafe(self._fan_out, version, message)

    def _fan_out(self, version: int, message: str) -> None:
        """On the loop: the change into every stream's queue; a full one is dropped."""
        item = f"id: {version}\nevent: change\ndata: {message}\n\n"
        for stream in list(self._streams):
            try:
                stream.queue.put_nowait(item)
            except asyncio.QueueFull:
                self._drop(stream)

    def _drop(self, stream: Stream) -> None:
        self._streams.discard(stream)
        STREAMS_REFUSED.labels("slow").inc()
        while not stream.queue.empty():  # room for the marker that ends its stream
            stream.queue.get_nowait()
        stream.queue.put_nowait(_DROPPED)

    def open(self) -> Stream | None:
        """A new stream, or None when ``max_streams`` are open (on the loop)."""
        if len(self._streams) >= self.max_streams:
            STREAMS_REFUSED.labels("cap").inc()
            return None
        stream = Stream()
        self._streams.add(stream)
        VIEWERS.inc()
        return stream

    def close_all(self) -> None:
        """End every stream (the server is stopping)."""
        for stream in list(self._streams):
            self._streams.discard(stream)
            while not stream.queue.empty():
                stream.queue.get_nowait()
            stream.queue.put_nowait(_DROPPED)

    async def events(self, stream: Stream) -> AsyncIterator[str]:
        """What ``stream``'s response writes: a first event with the current version, then
        each change, and a comment after each HEARTBEAT of silence, until it is dropped or
        its viewer goes (the response cancels this generator)."""
        try:
            yield f"retry: 2000\nid: {self.version}\nevent: hello\ndata: {self.version}\n\n"
            while True:
                try:
                    item = await asyncio.wait_for(stream.queue.get(), HEARTBEAT)
                except TimeoutError:
                    yield ": heartbeat\n\n"
                    continue
                if item is _DROPPED:
                    return
                EVENTS_SENT.inc()
                yield str(item)
        finally:
            if stream in self._streams:
                self._streams.discard(stream)
            VIEWERS.dec()
