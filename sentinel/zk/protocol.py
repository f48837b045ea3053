"""ZooKeeper 3.6+ watches for kazoo: persistent and recursive watches kept across reconnects.

kazoo 2.11 speaks ZooKeeper's 3.4 protocol: its watches are one-shot, and on every connection
loss it drops them all (``KazooClient._reset_watchers`` on SUSPENDED), so a client re-reads
everything it follows after each reconnect. The Java client instead re-registers its watches
with the last zxid it saw (``SetWatches``), and the server fires only for nodes that changed.
This module brings the Java client's behaviour to kazoo, as a plug-in that depends only on
kazoo and the standard library (it reaches into kazoo's connection the way a patch upstream
would, so it is pinned to the kazoo versions it was tested with):

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
import socket
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import (
    EXCEPTIONS,
    ConnectionDropped,
    ConnectionLoss,
    KazooException,
    MarshallingError,
    NoNodeError,
    UnimplementedError,
)
from kazoo.protocol.connection import CLOSE_RESPONSE, WATCH_XID, ConnectionHandler
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import (
    Auth,
    Exists,
    GetChildren,
    GetData,
    MultiHeader,
    Watch,
    int_struct,
    long_struct,
    multiheader_struct,
    stat_struct,
    write_string,
)
from kazoo.protocol.states import (
    EVENT_TYPE_MAP,
    Callback,
    EventType,
    KeeperState,
    WatchedEvent,
    ZnodeStat,
)

log = logging.getLogger(__name__)

__all__ = [
    "AddWatchMode",
    "PersistentWatches",
    "ReadResults",
    "WatcherType",
    "install",
]

Watcher = Callable[[WatchedEvent], Any]

# ZooDefs.OpCode
REMOVE_WATCHES = 18
MULTI_READ = 22
SET_WATCHES2 = 105
ADD_WATCH = 106
# ClientCnxn: the xid of SetWatches packets (the server echoes it), and the size the Java
# client keeps each under, well below the server's 1 MB jute.maxbuffer (ZOOKEEPER-706).
SET_WATCHES_XID = -8
SET_WATCHES_MAX_LENGTH = 128 * 1024
_ERROR_RESULT = -1  # ZooDefs.OpCode.error: a multi's per-operation error


class AddWatchMode(IntEnum):
    """``org.apache.zookeeper.AddWatchMode``."""

    PERSISTENT = 0  # data and child events of the path, until removed
    PERSISTENT_RECURSIVE = 1  # created/deleted/changed events of the path and all below it


class WatcherType(IntEnum):
    """``org.apache.zookeeper.Watcher.WatcherType``: what :meth:`PersistentWatches.remove_watches`
    removes."""

    CHILDREN = 1
    DATA = 2
    ANY = 3
    PERSISTENT = 4
    PERSISTENT_RECURSIVE = 5


class _AddWatch(NamedTuple):
    """``AddWatchRequest {path, mode}``; the watcher is registered when the reply arrives."""

    path: str
    mode: AddWatchMode
    callback: Watcher
    known: Callable[[], Iterable[str]] | None
    absolute: bool = False  # path given from the server's root, not the client's chroot
    on_connection_thread: bool = False  # called where the event is read, not handed off
    type = ADD_WATCH

    def serialize(self) -> bytes:
        return write_string(self.path) + int_struct.pack(self.mode)

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> bool:
        return True


class _RemoveWatches(NamedTuple):
    """``RemoveWatchesRequest {path, type}``."""

    path: str
    watcher_type: WatcherType
    type = REMOVE_WATCHES

    def serialize(self) -> bytes:
        return write_string(self.path) + int_struct.pack(self.watcher_type)

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> bool:
        return True


class _SetWatches2(NamedTuple):
    """``SetWatches2 {relativeZxid, dataWatches, existWatches, childWatches,
    persistentWatches, persistentRecursiveWatches}``."""

    relative_zxid: int
    data: list[str]
    exist: list[str]
    child: list[str]
    persistent: list[str]
    recursive: list[str]
    type = SET_WATCHES2

    def serialize(self) -> bytes:
        out = bytearray(long_struct.pack(self.relative_zxid))
        for paths in (self.data, self.exist, self.child, self.persistent, self.recursive):
            out += int_struct.pack(len(paths))
            for path in paths:
                out += write_string(path)
        return bytes(out)


class _MultiRead(NamedTuple):
    """``MultiOperationRecord`` of GetData/GetChildren requests (no watches set)."""

    operations: tuple[GetData | GetChildren, ...]
    type = MULTI_READ

    def serialize(self) -> bytes:
        out = bytearray()
        for op in self.operations:
            out += MultiHeader(op.type, False, -1).serialize() + op.serialize()
        return bytes(out + multiheader_struct.pack(-1, True, -1))

    def deserialize(self, data: bytes, offset: int) -> list[Any]:
        """One result per operation, in their order: ``(bytes, ZnodeStat)`` for a GetData, a
        child list for a GetChildren, or the exception of that one operation.

        A reply that is not exactly that (cut short, a length past its end, a result of
        another kind than its operation, an unknown error code, a result too many or too few,
        bytes after its end marker) raises kazoo's
        :class:`~kazoo.exceptions.MarshallingError`: the caller gets no result rather than
        some. Every step consumes bytes, so a hostile reply cannot keep the decoder looping.
        """
        try:
            results, offset = self._decode(data, offset)
        except (struct.error, UnicodeDecodeError) as exc:
            raise MarshallingError(f"multi-read reply cut short or malformed: {exc}") from exc
        if offset != len(data):
            raise MarshallingError(f"multi-read reply has {len(data) - offset} bytes after its end")
        return results

    def _decode(self, data: bytes, offset: int) -> tuple[list[Any], int]:
        results: list[Any] = []
        for op in self.operations:
            header, offset = MultiHeader.deserialize(data, offset)
            if header.done:
                raise MarshallingError(
                    f"multi-read reply ends after {len(results)} of {len(self.operations)} results"
                )
            if header.type == _ERROR_RESULT:
                (code,) = int_struct.unpack_from(data, offset)
                offset += int_struct.size
                error = EXCEPTIONS.get(code) if code else None  # .get: no defaultdict factory
                if error is None:
                    raise MarshallingError(f"multi-read result with unknown error code {code}")
                results.append(error())
            elif header.type != op.type:
                raise MarshallingError(
                    f"multi-read result {len(results)} has type {header.type}, "
                    f"its operation {op.type}"
                )
            elif op.type == GetData.type:
                value, offset = _read_field(data, offset)
                stat = ZnodeStat._make(stat_struct.unpack_from(data, offset))
                offset += stat_struct.size
                results.append((value or b"", stat))
            else:
                (count,) = int_struct.unpack_from(data, offset)
                offset += int_struct.size
                if count < -1:  # -1 is jute's null list
                    raise MarshallingError(f"multi-read result with {count} children")
                children = []
                for _ in range(count):
                    child, offset = _read_field(data, offset)
                    if child is None:
                        raise MarshallingError("multi-read result with a null child name")
                    children.append(child.decode("utf-8"))
                results.append(children)
        header, offset = MultiHeader.deserialize(data, offset)
        if not header.done:
            raise MarshallingError(
                f"multi-read reply has more than its {len(self.operations)} results"
            )
        return results, offset


def _read_field(data: bytes, offset: int) -> tuple[bytes | None, int]:
    """A jute buffer or string at ``offset`` (None for null) and the offset after it; kazoo's
    read_buffer returns a cut value for a length past the end of ``data``."""
    (length,) = int_struct.unpack_from(data, offset)
    offset += int_struct.size
    if length == -1:
        return None, offset
    if length < 0 or offset + length > len(data):
        raise MarshallingError(
            f"multi-read reply: a field of {length} bytes at offset {offset} of {len(data)}"
        )
    return data[offset : offset + length], offset + length


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


def _batches(lists: Sequence[list[str]]) -> Iterator[list[list[str]]]:
    """Split the five watch lists into batches of about SET_WATCHES_MAX_LENGTH bytes of paths,
    in the Java client's order (the last path of a batch may overshoot a little, as there)."""
    position = [0] * len(lists)
    while any(position[i] < len(paths) for i, paths in enumerate(lists)):
        batch: list[list[str]] = [[] for _ in lists]
        size = 0
        for i, paths in enumerate(lists):
            while position[i] < len(paths) and size < SET_WATCHES_MAX_LENGTH:
                path = paths[position[i]]
                batch[i].append(path)
                size += len(path.encode("utf-8")) + int_struct.size
                position[i] += 1
        yield batch


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


class _Connection(ConnectionHandler):
    """kazoo's connection with the extension's hooks (its class is swapped in by install)."""

    _extension: PersistentWatches
    # While the connection thread reads one reply or event from the socket: that thread, and
    # the requests a watcher called there asked to send at once (PersistentWatches.read_now).
    _reading_thread: threading.Thread | None = None
    _at_once: list[tuple[Any, Any]]
    _write_timeout = 10.0  # seconds; the connect timeout, as kazoo's own sends use
    # Held around every write to the socket together with its xid and its entry in the
    # client's pending replies, whichever thread writes; ``_direct``: callers may write
    # (connected, primed, plain TCP), cleared under the lock before a drop fails the pending.
    _send_lock: threading.Lock
    _direct = False

    def _connect(self, host: str, hostip: str, port: int) -> tuple[float, float]:
        session = self.client._session_id
        read_timeout, connect_timeout = super()._connect(host, hostip, port)
        self._write_timeout = connect_timeout / 1000.0
        resumed = session is not None and session == self.client._session_id
        self._extension._primed(self, resumed, connect_timeout / 1000.0)
        with self._send_lock:
            self._direct = not self.client.use_ssl
        return read_timeout, connect_timeout

    def send_now(self, request: Any, async_object: Any) -> bool:
        """Write ``request`` to the socket from the calling thread, its reply to complete
        ``async_object``; False (nothing done) when it must go through kazoo's queue: not
        connected, TLS, an auth packet, or requests queued ahead of it, whose order it keeps.

        A failed write leaves the request among the pending replies and shuts the socket: the
        connection thread then fails it with the rest (ConnectionLoss), as kazoo would.
        """
        if not self._direct or getattr(request, "type", Auth.type) == Auth.type:
            return False
        client = self.client
        with self._send_lock:
            if not self._direct or client._queue or client._state != KeeperState.CONNECTED:
                return False
            try:
                self._write_pending(request, async_object)
            except Exception as exc:
                self._direct = False
                log.debug("write from the calling thread failed (%r): dropping the connection", exc)
                with contextlib.suppress(OSError):
                    self._socket.shutdown(socket.SHUT_RDWR)
        return True

    def _write_pending(self, request: Any, async_object: Any) -> None:
        """Write ``request`` with the next xid, entered among the replies awaited first (the
        connection thread may read the reply at once); a failed write leaves it there, for
        the drop that follows to fail it with the rest. The caller holds ``_send_lock``."""
        self._xid = (self._xid % 2147483647) + 1
        self.client._pending.append((request, async_object, self._xid))
        self._submit(request, self._write_timeout, self._xid)

    def stop_sending(self) -> None:
        """No more writes from calling threads (the connection is going): from here on they
        queue, and kazoo fails or sends the queue as it always has."""
        with self._send_lock:
            self._direct = False

    def _send_request(self, read_timeout: float, connect_timeout: float) -> None:
        with self._send_lock:
            super()._send_request(read_timeout, connect_timeout)

    def _send_ping(self, connect_timeout: float) -> None:
        with self._send_lock:
            super()._send_ping(connect_timeout)

    def _read_socket(self, read_timeout: float) -> Any:
        """kazoo's read of one reply or event; then the requests its watchers asked to send at
        once, ahead of those other threads queued (no wake-up of this thread needed, and no
        write to kazoo's wake-up socket, which could block this thread with a full buffer)."""
        self._at_once = []
        self._reading_thread = threading.current_thread()
        try:
            response = super()._read_socket(read_timeout)
        except BaseException:
            self._fail_at_once()
            raise
        finally:
            self._reading_thread = None
        if response is CLOSE_RESPONSE:
            self._fail_at_once()
            return response
        while self._at_once:
            request, result = self._at_once.pop(0)
            try:
                with self._send_lock:
                    self._write_pending(request, result)
            except BaseException:
                self._fail_at_once()
                # The connection loop drops the connection, as on any failed send, and kazoo
                # fails the pending requests, this one among them, with ConnectionLoss.
                raise
        return response

    def _fail_at_once(self) -> None:
        for _, result in self._at_once:
            result.set_exception(ConnectionLoss())
        self._at_once = []

    def _exchange(self, requests: Sequence[Any], timeout: float) -> list[int]:
        """Send ``requests`` before anything else on this connection and return their error
        codes, dispatching the watch events the server sends before its replies."""
        for request in requests:
            self._submit(request, timeout, SET_WATCHES_XID)
        codes: list[int] = []
        while len(codes) < len(requests):
            header, buffer, offset = self._read_header(timeout)
            if header.xid == WATCH_XID:
                self._read_watch_event(buffer, offset)
            elif header.xid == SET_WATCHES_XID:
                if header.zxid > 0:
                    self.client.last_zxid = header.zxid
                codes.append(header.err)
            else:
                raise ConnectionDropped(f"unexpected reply xid {header.xid} while priming")
        return codes

    def _read_watch_event(self, buffer: bytes, offset: int) -> None:
        self._extension._dispatch(Watch.deserialize(buffer, offset)[0])
        super()._read_watch_event(buffer, offset)

    def _read_response(self, header: Any, buffer: bytes, offset: int) -> Any:
        if self.client._pending:
            self._extension._replied(self.client._pending[0][0], header.err)
        return super()._read_response(header, buffer, offset)


class PersistentWatches:
    """The extension installed on one :class:`~kazoo.client.KazooClient` (see :func:`install`).

    Watchers are called on kazoo's event thread with a
    :class:`~kazoo.protocol.states.WatchedEvent` whose path is relative to the client's chroot,
    as kazoo's own watchers are, and must not block it; those added with
    ``on_connection_thread=True`` on the connection thread itself (see :meth:`add_watch`).
    """

    def __init__(self, client: KazooClient, *, force_fallback: bool = False) -> None:
        self._client = client
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
        self._stock_reset = client._reset_watchers
        client._reset_watchers = self._reset_watchers
        self._stock_call = client._call
        client._call = self._send
        self._stock_session_callback = client._session_callback
        client._session_callback = self._session_changed
        connection = client._connection
        connection._extension = self
        connection._send_lock = threading.Lock()
        connection.__class__ = _Connection

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
    ) -> None:
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
        """
        if not self._probe():
            raise UnimplementedError("the server does not support addWatch (ZooKeeper < 3.6)")
        server_path = path if absolute else self._server_path(path)
        request = _AddWatch(
            server_path, AddWatchMode(mode), watcher, known, absolute, on_connection_thread
        )
        self._call(request)

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
        connection = self._client._connection
        if getattr(connection, "_reading_thread", None) is not threading.current_thread():
            return None
        result = self._client.handler.async_result()
        server_path = path if absolute else self._server_path(path)
        connection._at_once.append((GetData(server_path, None), _Then(result, then)))
        return result

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
        client = self._client
        if watcher_type != WatcherType.CHILDREN:
            client._data_watchers.pop(server_path, None)
            self._absent.discard(server_path)
        if watcher_type != WatcherType.DATA:
            client._child_watchers.pop(server_path, None)
        if watcher_type == WatcherType.ANY:
            with self._lock:
                for table in (self._persistent, self._recursive):
                    self._on_connection_thread.difference_update(table.pop(server_path, ()))
                self._known.pop(server_path, None)
                self._absolute.discard(server_path)
        request = _RemoveWatches(server_path, WatcherType(watcher_type))
        if wait:
            self._call(request)
        elif not self.fallback:
            self._client._call(request, self._client.handler.async_result())

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
        results = self._call(_MultiRead(operations)) if operations else []
        return ReadResults(
            dict(zip(data, results[: len(data)], strict=True)),
            dict(zip(children, results[len(data) :], strict=True)),
        )

    # --- the hooks kazoo's connection calls -------------------------------------------

    def _primed(self, connection: _Connection, resumed: bool, timeout: float) -> None:
        """On the connection thread, right after connect and auth: learn whether the server
        has the 3.6 opcodes, and re-register the session's watches on a resumed session."""
        if self._supported is None:
            self._supported = connection._exchange([_MultiRead(())], timeout) == [0]
            self._told.set()
            log.debug("ZooKeeper 3.6 watches %s", "on" if self._supported else "unavailable")
        if not (resumed and self._supported):
            return
        lists = self._watch_lists()
        self._resync_data, self._resync_children = self._resync_paths(lists)
        lists[0] += sorted(self._resync_data)
        lists[2] += sorted(self._resync_children)
        packets = [_SetWatches2(self._client.last_zxid, *batch) for batch in _batches(lists)]
        failures = [code for code in connection._exchange(packets, timeout) if code]
        if failures:
            # No watch this session had can be trusted now: fail over as on a lost session.
            log.warning("SetWatches2 refused (%s): dropping the session's watches", failures)
            self._drop_all(KeeperState.CONNECTED)
            return
        # The server fired the changed ones while it handled SetWatches2, before its reply;
        # the rest would stay on the server until they fire: remove them.
        with self._lock:
            held = set(self._persistent) | set(self._recursive)
        removals = [_RemoveWatches(p, WatcherType.DATA) for p in self._resync_data] + [
            _RemoveWatches(p, WatcherType.CHILDREN)
            for p in self._resync_children
            if p not in held  # removing a child watch there could take the persistent one
        ]
        if removals:
            connection._exchange(removals, timeout)  # NoWatcher after a race is fine
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
        client = self._client
        data_paths = [path for path, watchers in list(client._data_watchers.items()) if watchers]
        self._absent.intersection_update(data_paths)
        with self._lock:
            persistent, recursive = list(self._persistent), list(self._recursive)
        return [
            [path for path in data_paths if path not in self._absent],
            [path for path in data_paths if path in self._absent],
            [path for path, watchers in list(client._child_watchers.items()) if watchers],
            persistent,
            recursive,
        ]

    def _replied(self, request: Any, code: int) -> None:
        """A reply is about to complete ``request``: register before the caller wakes, and
        before the connection thread reads any event the watch causes."""
        if isinstance(request, _AddWatch) and not code:
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
        if watch.type not in EVENT_TYPE_MAP or self._client._stopped.is_set():
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
        state = self._client._state
        if chrooted:
            event = WatchedEvent(kind, state, self._client.unchroot(watch.path))
            self._deliver(chrooted, event, here)
        if absolute:
            self._deliver(absolute, WatchedEvent(kind, state, watch.path), here)

    def _reset_watchers(self) -> None:
        """kazoo calls this on SUSPENDED and when the session ends: keep every watch while the
        session may resume (the server still holds them), drop them all when it ended."""
        if self._client._state == KeeperState.CONNECTING and self._supported:
            return
        self._drop_all(self._client._state)

    def _drop_all(self, state: str) -> None:
        self._stock_reset()
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
                self._call(_MultiRead(()))
                self._supported = True
            except UnimplementedError:
                self._supported = False
            self._told.set()
        return bool(self._supported)

    @contextlib.contextmanager
    def waiting_for_connection(self, wait: bool) -> Iterator[None]:
        """Whether requests the calling thread makes inside the block wait for a connection
        while there is none (kazoo's way, and the default) or fail at once with
        :class:`~kazoo.exceptions.ConnectionLoss`, as do those of them still queued when the
        connection drops. A thread whose queue of work also carries the news of the
        connection itself (the cache's worker) must not wait: that news would wait with it."""
        previous = getattr(self._local, "wait", True)
        self._local.wait = wait
        try:
            yield
        finally:
            self._local.wait = previous

    def _send(self, request: Any, async_object: Any) -> Any:
        """kazoo's ``_call``: the request written by this thread when it can be (see
        :meth:`_Connection.send_now`), queued for the connection thread otherwise, or failed
        at once for a thread that does not wait for a connection while there is none."""
        if self._client._connection.send_now(request, async_object):
            return None
        if getattr(self._local, "wait", True):
            return self._stock_call(request, async_object)
        if not self._connected():  # failed before it is queued: kazoo's wake-up byte for it
            # would stay unread until the next connection, and ~280 of them block the next caller
            async_object.set_exception(ConnectionLoss("not connected, and not waiting"))
            return False
        queued = self._stock_call(request, async_object)
        # Dropped meanwhile? kazoo sets the state before it fails what is queued, so a request
        # queued after that is seen here.
        if not self._connected():
            self._unqueue(request, async_object)
        return queued

    def _connected(self) -> bool:
        return self._client._state in (KeeperState.CONNECTED, KeeperState.CONNECTED_RO)

    def _session_changed(self, state: str) -> None:
        """kazoo's ``_session_callback``: any change but to CONNECTED stops callers' writes
        before kazoo fails the pending and queued requests, so none is added after that."""
        if state not in (KeeperState.CONNECTED, KeeperState.CONNECTED_RO):
            self._client._connection.stop_sending()
        self._stock_session_callback(state)

    def _unqueue(self, request: Any, async_object: Any) -> None:
        """Fail a request of a thread that does not wait if it is still in kazoo's queue (the
        wake-up byte it left is read by kazoo as a request cancelled)."""
        with self._client._connection._send_lock:  # the connection thread sends under it
            try:
                self._client._queue.remove((request, async_object))
            except ValueError:
                return  # sent, or failed by kazoo with the rest of the queue
        async_object.set_exception(ConnectionLoss("the connection dropped"))

    def _server_path(self, path: str) -> str:
        return _prefix_root(self._client.chroot, path)

    def _call(self, request: Any) -> Any:
        result = self._client.handler.async_result()
        self._client._call(request, result)
        return result.get()

    def _get_many_pipelined(
        self, data: list[str], children: list[str], operations: tuple[Any, ...]
    ) -> ReadResults:
        pending = []
        for operation in operations:  # all sent before the first reply is waited for
            pending.append(self._client.handler.async_result())
            self._client._call(operation, pending[-1])
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
    """Install the extension on ``client`` (before or after ``start()``) and return it; the
    same object again if it is installed already.

    From then on the client keeps its watches (kazoo's one-shot ones too) across reconnects
    within the session. ``force_fallback=True`` keeps kazoo's stock behaviour, as against a
    ZooKeeper older than 3.6 (for tests of callers' fallback paths).
    """
    existing = getattr(client._connection, "_extension", None)
    if existing is not None:
        return existing
    return PersistentWatches(client, force_fallback=force_fallback)
