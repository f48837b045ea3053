"""ZooKeeper 3.6+ watches for kazoo: persistent and recursive watches kept across reconnects.

kazoo 2.11 speaks ZooKeeper's 3.4 protocol: its watches are one-shot, and on every connection
loss it drops them all (``KazooClient._reset_watchers`` on SUSPENDED), so a client re-reads
everything it follows after each reconnect. The Java client instead re-registers its watches
with the last zxid it saw (``SetWatches``), and the server fires only for nodes that changed.
This module brings the Java client's behaviour to kazoo, as a plug-in that depends only on
kazoo and the standard library (and on :mod:`sentinel.zk.wire`, the requests' codecs, and
:mod:`sentinel.zk.kazoo_internals`, the one module that touches kazoo's private names and
checks at :func:`install` that they are what it expects; when they are not, the client stays
plain kazoo, as in fallback mode below, with one warning):

* ``addWatch`` (opcode 106): PERSISTENT and PERSISTENT_RECURSIVE watches, which stay until
  removed; a recursive one reports every create, change and delete below its path;
* ``SetWatches2`` (opcode 105) sent on reconnection within the session, before any other
  request: kazoo's one-shot data, exist and child watches and the persistent ones, with the
  last zxid seen, in packets under 128 KB as the Java client splits them; watches are then
  kept through SUSPENDED and dropped only when the session ends (LOST);
* ``removeWatches`` (opcode 18) and multi-read (opcode 22: many getData/getChildren in one
  request, with an error per path);
* watchers called on the connection thread as their event is read, which may send the changed
  node's read right there (:meth:`PersistentWatches.read_now`), ahead of queued requests;
* a request written to the socket by the thread that makes it, once the connection is up and
  nothing is queued ahead of it, instead of being queued for the connection thread to wake
  and send: a round trip started after a quiet spell no longer waits for that wake-up. One
  lock orders every write with the xid it carries and its place among the awaited replies;
  TLS connections keep kazoo's queue (an SSL socket must not be written by one thread while
  another reads it);
* threads that do not wait for a connection (:meth:`PersistentWatches.waiting_for_connection`):
  their requests fail at once with ``ConnectionLoss`` while there is none, where kazoo would
  keep them for the next one.

Against a server older than 3.6 (detected at connection with an empty multi-read, which such a
server answers UNIMPLEMENTED) or when forced (``force_fallback=True``), the extension stands
aside: kazoo's watches behave exactly as stock (requests are still written by their
callers' threads), :attr:`PersistentWatches.supported` is False, and
:meth:`~PersistentWatches.add_watch` raises :class:`~kazoo.exceptions.UnimplementedError`, so
callers use kazoo's one-shot watches.

What the server reports after a reconnect within the session: for one-shot watches, every node
that changed since the last zxid (``NodeDataChanged``, ``NodeDeleted``, ``NodeCreated``,
``NodeChildrenChanged``). Persistent watches are re-registered as they are: ZooKeeper's
``DataTree.setWatches`` does not compare them with the zxid, so changes made below them while
the connection was down are not reported; events from the reconnect on are. When the session
ends, every persistent watcher receives one :class:`~kazoo.protocol.states.WatchedEvent` of type
``NONE`` (as kazoo's one-shot watchers do): its watch is gone and what it followed must be read
again.

Usage::

    watches = install(client)
    if watches.supported:
        watches.add_watch("/services/api", on_event, AddWatchMode.PERSISTENT_RECURSIVE)
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError, UnimplementedError
from kazoo.protocol.paths import join, normpath
from kazoo.protocol.serialization import Exists, GetChildren, GetData, Watch
from kazoo.protocol.states import (
    EVENT_TYPE_MAP,
    Callback,
    EventType,
    KeeperState,
    WatchedEvent,
    ZnodeStat,
)

from sentinel.zk import kazoo_internals
from sentinel.zk.kazoo_internals import HookedConnection, Internals
from sentinel.zk.wire import (
    SET_WATCHES_XID,
    AddWatch,
    AddWatchMode,
    MultiRead,
    RemoveWatches,
    SetWatches2,
    Watcher,
    WatcherType,
    batches,
)

log = logging.getLogger(__name__)

# What docs/zookeeper.md shows a kazoo user; the rest is the client's own.
__all__ = ["AddWatchMode", "WatcherType", "install"]


@dataclass(frozen=True)
class ReadResults:
    """What :meth:`PersistentWatches.get_many` read, by the path asked for: the data and stat,
    or the children, or the error of that one path (e.g. :class:`~kazoo.exceptions.NoNodeError`)."""

    data: dict[str, tuple[bytes, ZnodeStat] | KazooException]
    children: dict[str, list[str] | KazooException]


def _ancestors(path: str) -> Iterator[str]:
    """``path`` and every path above it, up to ``/``."""
    yield path
    while path != "/":
        path = path.rsplit("/", 1)[0] or "/"
        yield path


class _Then:
    """What kazoo's connection completes for a :meth:`PersistentWatches.read_now`: the async
    result, then the caller's ``then`` on the completing thread."""

    __slots__ = ("_result", "_then")

    def __init__(self, result: Any, then: Callable[[], None]) -> None:
        self._result = result
        self._then = then

    def set(self, value: Any = None) -> None:
        self._result.set(value)
        self._then()

    def set_exception(self, exception: BaseException) -> None:
        self._result.set_exception(exception)
        self._then()


class _Waiting:
    """The block of :meth:`PersistentWatches.waiting_for_connection`: a plain object, not a
    generator, as the cache's worker enters two per change it applies."""

    __slots__ = ("_local", "_previous", "_wait")

    def __init__(self, local: threading.local, wait: bool) -> None:
        self._local = local
        self._wait = wait
        self._previous = True

    def __enter__(self) -> None:
        self._previous = getattr(self._local, "wait", True)
        self._local.wait = self._wait

    def __exit__(self, *_: object) -> None:
        self._local.wait = self._previous


class PersistentWatches:
    """The extension installed on one :class:`~kazoo.client.KazooClient` (see :func:`install`).

    Watchers are called on kazoo's event thread with a
    :class:`~kazoo.protocol.states.WatchedEvent` whose path is relative to the client's chroot,
    as kazoo's own watchers are, and must not block it; those added with
    ``on_connection_thread=True`` on the connection thread itself (see :meth:`add_watch`).
    """

    def __init__(
        self, client: KazooClient, internals: Internals, *, force_fallback: bool = False
    ) -> None:
        self._client = client
        self._internals = internals
        self._supported: bool | None = False if force_fallback else None
        self._told = threading.Event()  # set once _supported is known
        if force_fallback:
            self._told.set()
        self._lock = threading.Lock()
        # server paths (chroot included) -> watchers, as kazoo keys its one-shot watchers
        self._persistent: dict[str, list[Watcher]] = {}
        self._recursive: dict[str, list[Watcher]] = {}
        self._absent: set[str] = set()  # kazoo data watches set by exists() on no node
        self._known: dict[str, Callable[[], Iterable[str]]] = {}  # add_watch(known=...)
        self._absolute: set[str] = set()  # watched paths given from the server's root
        self._on_connection_thread: set[Watcher] = set()  # add_watch(on_connection_thread=True)
        # one-shot watches a reconnection set for ``known`` paths, until they fire or are removed
        self._resync_data: set[str] = set()
        self._resync_children: set[str] = set()
        self._local = threading.local()  # whether the thread waits for a connection

    @property
    def supported(self) -> bool:
        """True when the server has the 3.6 opcodes; False in fallback or while not connected.

        The connection learns it before any request of the caller's; asked before that (just
        after ``start()``), it waits for the answer.
        """
        return self._probe()

    def wait_supported(self, timeout: float) -> bool | None:
        """:attr:`supported`, waiting up to ``timeout`` seconds for a connection to tell
        (a client still connecting); None when none has by then."""
        self._probe()
        if self._supported is None:
            self._told.wait(timeout)
        return self._supported

    @property
    def fallback(self) -> bool:
        """True when kazoo's stock one-shot behaviour is in force (old server, or forced)."""
        return self._supported is False

    # --- public operations -------------------------------------------------------------

    def add_watch(
        self,
        path: str,
        watcher: Watcher,
        mode: AddWatchMode,
        *,
        known: Callable[[], Iterable[str]] | None = None,
        absolute: bool = False,
        on_connection_thread: bool = False,
        wait: bool = True,
    ) -> Any:
        """Watch ``path`` until :meth:`remove_watches`, calling ``watcher`` for every event.

        PERSISTENT: created/deleted/data-changed events of ``path`` and children-changed of
        its children, as an ``exists`` + ``get`` + ``get_children`` watch would give once.
        PERSISTENT_RECURSIVE: created/deleted/data-changed events of ``path`` and every node
        below it (no children-changed events). Raises
        :class:`~kazoo.exceptions.UnimplementedError` in fallback mode.

        ZooKeeper does not tell what changed below a persistent watch while the connection was
        down. ``known``, if given, returns the paths at or below ``path`` that the caller holds
        (read at each reconnection within the session, on the connection thread: no I/O);
        they go into the reconnection's ``SetWatches2`` as one-shot watches with the last
        zxid, so the server reports the ones changed or deleted meanwhile (data changed,
        deleted) and the parents whose children changed (children-changed, for creations),
        all to ``watcher``; the ones that did not fire are removed again before any other
        request, so the server goes back to holding one watch.

        ``absolute``: ``path`` (and what ``known`` returns) is given from the server's root, not
        from the client's chroot: a registry another library keeps outside this client's
        namespace (Curator's base path) is followed on the same session. Its events carry
        paths from the server's root too. kazoo's own watches cannot do this: it keys them by
        the path its callbacks see, where ``/services`` outside the chroot and inside it would
        be one key; these tables are keyed by the server's path.

        ``on_connection_thread``: ``watcher`` is called on the connection thread as the event
        is read, not handed to kazoo's callback thread (one thread wake-up less per event), and
        may send the changed node's read at once with :meth:`read_now`. It must not block and
        must not wait for a reply (that thread reads the replies); an exception it raises is
        logged.

        ``wait=False``: return kazoo's async result of the request instead of waiting for it,
        so many are in flight together; a read sent after it on this session is answered after
        the watch is in place (a session's requests are answered in order).
        """
        if not self._probe():
            raise UnimplementedError("the server does not support addWatch (ZooKeeper < 3.6)")
        server_path = path if absolute else self._server_path(path)
        request = AddWatch(
            server_path, AddWatchMode(mode), watcher, known, absolute, on_connection_thread
        )
        result = self._request(request)
        return result if not wait else result.get()

    def read_now(self, path: str, then: Callable[[], None], *, absolute: bool = False) -> Any:
        """From a watcher called on the connection thread (``add_watch(...,
        on_connection_thread=True)``): send a read of ``path``'s data (no watch) right after the
        event being delivered, and return kazoo's async result of it, whose ``get()`` gives
        ``(data, stat)``. ``then()`` is called on the thread that completes it (the
        connection thread, with the reply or the connection's loss) and must not block: the
        caller's worker can sleep until the reply is in, not wake to wait for it.
        None when called anywhere else (another thread, or an event a reconnection's
        re-registration reported): read the usual way then.

        The read is sent after the event arrived, so its reply shows the node at least as new
        as the change the event reports.
        """
        result = self._client.handler.async_result()
        server_path = path if absolute else self._server_path(path)
        if not self._internals.read_after(GetData(server_path, None), _Then(result, then)):
            return None
        return result

    def after_message(self, run: Callable[[], None]) -> bool:
        """From a watcher called on the connection thread, or a :meth:`read_now`'s ``then``:
        call ``run()`` (which must not block) once the event or reply being handled is done,
        just before the thread waits for the next one and lets go of the interpreter; False
        (nothing done) anywhere else. A thread ``run`` wakes finds the interpreter free."""
        return self._internals.after_message(run)

    def remove_watches(
        self, path: str, watcher_type: WatcherType, *, absolute: bool = False, wait: bool = True
    ) -> None:
        """Remove the watches of ``watcher_type`` on ``path`` (kazoo's one-shot ones included
        for DATA, CHILDREN and ANY) on the server and here: no event for them is dispatched
        from now on. Raises :class:`~kazoo.exceptions.NoWatcherError` if the server had none.
        ``wait=False``: here at once, and the server's removal sent without waiting for its
        answer (a failure, the watch fired meanwhile or the session gone, is nobody's concern:
        either way the server holds no such watch of this session's for long); in fallback mode
        here only, as the server may predate ``removeWatches``: its watch fires once more, to
        no watcher.

        ZooKeeper before 3.9 removes persistent watches only with ANY (ZOOKEEPER-4472; it
        answers PERSISTENT and PERSISTENT_RECURSIVE with an error and closes the connection),
        so those two are sent as ANY: every watch on ``path`` goes, here as on the server.
        ``absolute`` as for :meth:`add_watch`.
        """
        if WatcherType(watcher_type) in (WatcherType.PERSISTENT, WatcherType.PERSISTENT_RECURSIVE):
            watcher_type = WatcherType.ANY
        server_path = path if absolute else self._server_path(path)
        self._internals.forget_one_shot(
            server_path,
            data=watcher_type != WatcherType.CHILDREN,
            children=watcher_type != WatcherType.DATA,
        )
        if watcher_type != WatcherType.CHILDREN:
            self._absent.discard(server_path)
        if watcher_type == WatcherType.ANY:
            with self._lock:
                for table in (self._persistent, self._recursive):
                    self._on_connection_thread.difference_update(table.pop(server_path, ()))
                self._known.pop(server_path, None)
                self._absolute.discard(server_path)
        request = RemoveWatches(server_path, WatcherType(watcher_type))
        if wait:
            self._call(request)
        elif not self.fallback:
            self._internals.call(request, self._client.handler.async_result())

    def get_many(
        self, data: Iterable[str] = (), children: Iterable[str] = (), *, absolute: bool = False
    ) -> ReadResults:
        """Read the data of the ``data`` paths and the children of the ``children`` paths in one
        request (multi-read), with an error per path rather than for the whole; no watches.

        In fallback mode the reads are pipelined requests, with the same results. The reply
        must fit the server's jute.maxbuffer (1 MB by default): batch large reads.
        ``absolute``: the paths are given from the server's root (see :meth:`add_watch`).
        """
        data, children = list(data), list(children)
        server = str if absolute else self._server_path
        operations = tuple(GetData(server(path), None) for path in data) + tuple(
            GetChildren(server(path), None) for path in children
        )
        if not self._probe():
            return self._get_many_pipelined(data, children, operations)
        results = self._call(MultiRead(operations)) if operations else []
        return ReadResults(
            dict(zip(data, results[: len(data)], strict=True)),
            dict(zip(children, results[len(data) :], strict=True)),
        )

    # --- the hooks kazoo's connection calls -------------------------------------------

    def _primed(self, connection: HookedConnection, resumed: bool, timeout: float) -> None:
        """On the connection thread, right after connect and auth: learn whether the server
        has the 3.6 opcodes, and re-register the session's watches on a resumed session."""
        if self._supported is None:
            self._supported = connection.exchange([MultiRead(())], timeout, SET_WATCHES_XID) == [0]
            self._told.set()
            log.debug("ZooKeeper 3.6 watches %s", "on" if self._supported else "unavailable")
        if not (resumed and self._supported):
            return
        lists = self._watch_lists()
        self._resync_data, self._resync_children = self._resync_paths(lists)
        lists[0] += sorted(self._resync_data)
        lists[2] += sorted(self._resync_children)
        packets = [SetWatches2(self._client.last_zxid, *batch) for batch in batches(lists)]
        failures = [code for code in connection.exchange(packets, timeout, SET_WATCHES_XID) if code]
        if failures:
            # No watch this session had can be trusted now: fail over as on a lost session.
            log.warning("SetWatches2 refused (%s): dropping the session's watches", failures)
            self._drop_all(KeeperState.CONNECTED)
            return
        # The server fired the changed ones while it handled SetWatches2, before its reply;
        # the rest would stay on the server until they fire: remove them.
        with self._lock:
            held = set(self._persistent) | set(self._recursive)
        removals = [RemoveWatches(p, WatcherType.DATA) for p in self._resync_data] + [
            RemoveWatches(p, WatcherType.CHILDREN)
            for p in self._resync_children
            if p not in held  # removing a child watch there could take the persistent one
        ]
        if removals:
            # NoWatcher after a race is fine
            connection.exchange(removals, timeout, SET_WATCHES_XID)
        self._resync_data, self._resync_children = set(), set()

    def _resync_paths(self, lists: list[list[str]]) -> tuple[set[str], set[str]]:
        """The one-shot data and child watches that let the server report what changed below
        persistent watches with ``known`` paths: every known node, and every parent of one at
        or below the watch (and the watch's path itself when known), that no other watch of
        the connection covers already."""
        with self._lock:
            providers = list(self._known.items())
            persistent = set(self._persistent) | set(self._recursive)
            absolute = set(self._absolute)
        data: set[str] = set()
        children: set[str] = set()
        for root, known in providers:
            server = str if root in absolute else self._server_path
            try:
                paths = {server(path) for path in known()}
            except Exception:  # a caller's bug must not take the connection thread down
                log.exception("known paths of the watch on %s failed: no re-sync", root)
                continue
            below = root.rstrip("/") + "/"
            data |= paths
            children |= {
                parent
                for parent in (path.rsplit("/", 1)[0] or "/" for path in paths)
                if parent == root or parent.startswith(below)
            }
            if root in paths:
                children.add(root)
        data -= set(lists[0]) | set(lists[1]) | persistent
        children -= set(lists[2])
        return data, children

    def _watch_lists(self) -> list[list[str]]:
        data_paths, child_paths = self._internals.one_shot_paths()
        self._absent.intersection_update(data_paths)
        with self._lock:
            persistent, recursive = list(self._persistent), list(self._recursive)
        return [
            [path for path in data_paths if path not in self._absent],
            [path for path in data_paths if path in self._absent],
            child_paths,
            persistent,
            recursive,
        ]

    def _replied(self, request: Any, code: int) -> None:
        """A reply is about to complete ``request``: register before the caller wakes, and
        before the connection thread reads any event the watch causes."""
        if isinstance(request, AddWatch) and not code:
            table = self._persistent if request.mode == AddWatchMode.PERSISTENT else self._recursive
            with self._lock:
                table.setdefault(request.path, []).append(request.callback)
                if request.known is not None:
                    self._known[request.path] = request.known
                if request.absolute:
                    self._absolute.add(request.path)
                if request.on_connection_thread:
                    self._on_connection_thread.add(request.callback)
        elif isinstance(request, Exists) and request.watcher is not None:
            if code == NoNodeError.code:
                self._absent.add(request.path)
            elif not code:
                self._absent.discard(request.path)
        elif isinstance(request, GetData) and request.watcher is not None and not code:
            self._absent.discard(request.path)

    def _dispatch(self, watch: Watch) -> None:
        """Hand an event to the persistent watchers it concerns (kazoo's own code then serves
        the one-shot ones); the server sends one event per connection for all of them."""
        if watch.type not in EVENT_TYPE_MAP or self._internals.stopped():
            return
        kind = EVENT_TYPE_MAP[watch.type]
        # Watchers of paths given from the chroot see the path from it; the others, from the
        # server's root (add_watch(absolute=True)).
        chrooted: list[Watcher] = []
        absolute: list[Watcher] = []
        with self._lock:
            watched = [(watch.path, self._persistent.get(watch.path, ()))]
            # children-changed events reach recursive watchers only from a re-sync's watches
            if kind != EventType.CHILD or watch.path in self._resync_children:
                recursive = self._recursive
                watched += [(path, recursive.get(path, ())) for path in _ancestors(watch.path)]
            for path, watchers in watched:
                (absolute if path in self._absolute else chrooted).extend(watchers)
            if kind != EventType.CHILD:
                self._resync_data.discard(watch.path)
            if kind != EventType.CHANGED:
                self._resync_children.discard(watch.path)
            here = {w for w in (*chrooted, *absolute) if w in self._on_connection_thread}
        state = self._client.client_state
        if chrooted:
            event = WatchedEvent(kind, state, self._client.unchroot(watch.path))
            self._deliver(chrooted, event, here)
        if absolute:
            self._deliver(absolute, WatchedEvent(kind, state, watch.path), here)

    def _reset_watchers(self) -> None:
        """kazoo calls this on SUSPENDED and when the session ends: keep every watch while the
        session may resume (the server still holds them), drop them all when it ended."""
        if self._client.client_state == KeeperState.CONNECTING and self._supported:
            return
        self._drop_all(self._client.client_state)

    def _drop_all(self, state: str) -> None:
        self._internals.stock_reset_watchers()
        self._absent.clear()
        with self._lock:
            dropped = [
                w
                for table in (self._persistent, self._recursive)
                for ws in table.values()
                for w in ws
            ]
            self._persistent.clear()
            self._recursive.clear()
            self._known.clear()
            self._absolute.clear()
            on_connection_thread, self._on_connection_thread = self._on_connection_thread, set()
        self._deliver(dropped, WatchedEvent(EventType.NONE, state, None), on_connection_thread)

    # --- helpers -------------------------------------------------------------------------

    def _deliver(
        self, watchers: Iterable[Watcher], event: WatchedEvent, here: set[Watcher]
    ) -> None:
        """Hand ``event`` to each watcher: those in ``here`` called now, on this thread, the
        others on kazoo's callback thread."""
        for watcher in watchers:
            if watcher not in here:
                self._client.handler.dispatch_callback(Callback("watch", watcher, (event,)))
                continue
            try:
                watcher(event)
            except Exception:  # a watcher's bug must not take the connection thread down
                log.exception("watcher %r failed on %s", watcher, event)

    def _probe(self) -> bool:
        """Ask now when the connection has not told yet (installed on a running client)."""
        if self._supported is None and self._client.connected:
            try:
                self._call(MultiRead(()))
                self._supported = True
            except UnimplementedError:
                self._supported = False
            self._told.set()
        return bool(self._supported)

    def waiting_for_connection(self, wait: bool) -> contextlib.AbstractContextManager[None]:
        """Whether requests the calling thread makes inside the block wait for a connection
        while there is none (kazoo's way, and the default) or fail at once with
        :class:`~kazoo.exceptions.ConnectionLoss`, as do those of them still queued when the
        connection drops. A thread whose queue of work also carries the news of the
        connection itself (the cache's worker) must not wait: that news would wait with it."""
        return _Waiting(self._local, wait)

    def _waits(self) -> bool:
        """Whether the calling thread's requests wait for a connection (the hooks ask)."""
        return bool(getattr(self._local, "wait", True))

    def _server_path(self, path: str) -> str:
        """``path`` from the server's root, as kazoo prefixes the client's chroot."""
        return normpath(join(normpath(join("/", self._client.chroot)), path.lstrip("/")))

    def _request(self, request: Any) -> Any:
        """Send one of the extension's own requests and return its async result: through
        kazoo's request queue, as its own go, or, with a kazoo whose queue is not the one
        :mod:`sentinel.zk.kazoo_internals` knows, as a read through its public API (inside
        the client's chroot only)."""
        client = self._client
        if self._internals.calls:
            result = client.handler.async_result()
            self._internals.call(request, result)
            return result
        read = {GetData.type: client.get_async, GetChildren.type: client.get_children_async}
        chroot = client.chroot
        inside = not chroot or request.path == chroot or request.path.startswith(chroot + "/")
        if request.type in read and inside:
            return read[request.type](client.unchroot(request.path))
        result = client.handler.async_result()
        result.set_exception(
            UnimplementedError(
                f"{type(request).__name__} on {request.path}: the internals of kazoo "
                f"{kazoo_internals.KAZOO_VERSION} differ from those sentinel.zk.watches uses"
            )
        )
        return result

    def _call(self, request: Any) -> Any:
        return self._request(request).get()

    def _get_many_pipelined(
        self, data: list[str], children: list[str], operations: tuple[Any, ...]
    ) -> ReadResults:
        # all sent before the first reply is waited for
        pending = [self._request(operation) for operation in operations]
        results = [_outcome(result) for result in pending]
        return ReadResults(
            dict(zip(data, results[: len(data)], strict=True)),
            dict(zip(children, results[len(data) :], strict=True)),
        )


def _outcome(result: Any) -> Any:
    try:
        return result.get()
    except KazooException as exc:
        return exc


def install(client: KazooClient, *, force_fallback: bool = False) -> PersistentWatches:
    """Install the extension on ``client`` before its ``start()`` and return it; the same
    object again if it is installed already.

    From then on the client keeps its watches (kazoo's one-shot ones too) across reconnects
    within the session. ``force_fallback=True`` keeps kazoo's stock watches, as against a
    ZooKeeper older than 3.6 (for tests of callers' fallback paths).

    When the installed kazoo is not the one the extension was written for (its version, or
    any private name in :data:`sentinel.zk.kazoo_internals.NEEDS` missing or of another
    shape), nothing of kazoo's is overridden: the client is plain kazoo, the extension is in
    fallback mode, and one :class:`~sentinel.zk.kazoo_internals.KazooCompatibilityWarning`
    per process names the version and what differs. Raises :class:`RuntimeError` on a
    client already started (its connection is kazoo's own by then).
    """
    existing = kazoo_internals.extension_of(client)
    if isinstance(existing, PersistentWatches):
        return existing
    if client.client_state != KeeperState.CLOSED:
        raise RuntimeError("install the ZooKeeper extension before the client's start()")
    found = kazoo_internals.check(client)
    internals = Internals(client, found)
    if not found.hookable:
        kazoo_internals.warn_once(found)
    watches = PersistentWatches(
        client, internals, force_fallback=force_fallback or not found.hookable
    )
    if found.hookable:
        internals.hook(watches)
    kazoo_internals.remember(client, watches)
    return watches
