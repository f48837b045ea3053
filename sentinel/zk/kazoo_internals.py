"""Every use of kazoo's private names by :mod:`sentinel.zk.watches`, and the check that they
are still there.

kazoo 2.11 has no public hook for what the extension does (new opcodes sent before kazoo's
own requests on a new connection, events seen before kazoo's one-shot watchers get them,
watches kept through SUSPENDED, requests written by their callers' threads), so it overrides
a few of kazoo's private methods and reads a few private attributes. All of them are named in
:data:`NEEDS`, and only this module touches them. :func:`check` compares the installed kazoo
with that table (its version, each name present, each method's parameters as
:func:`inspect.signature` sees them, each attribute on the very client being extended); when
anything differs, :mod:`sentinel.zk.watches` installs no hook at all and the client is plain
kazoo, with one :class:`KazooCompatibilityWarning` that names the version and what differs.

What kazoo would need for this module to go is written in ``docs/zookeeper.md`` ("What kazoo
would need").
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import socket
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import kazoo.protocol.connection as kazoo_connection
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionDropped, ConnectionLoss
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.serialization import Auth, Watch
from kazoo.protocol.states import EVENT_TYPE_MAP, KeeperState
from kazoo.version import __version__ as KAZOO_VERSION

log = logging.getLogger(__name__)

__all__ = [
    "KAZOO_VERSION",
    "NEEDS",
    "TESTED_SERIES",
    "Compatibility",
    "HookedConnection",
    "Internals",
    "KazooCompatibilityWarning",
    "Need",
    "check",
]

TESTED_SERIES = (2, 11)  # the kazoo release series the hooks were written and tested against


@dataclass(frozen=True)
class Need:
    """One private name of kazoo's the extension uses.

    ``owner``: ``KazooClient`` or ``ConnectionHandler`` (a method of the class, checked with
    its ``parameters``, ``self`` first), ``client`` or ``connection`` (an attribute of the
    client being extended or of its connection, checked on that object), or ``module`` (a
    name of :mod:`kazoo.protocol.connection`). ``hook``: used only by the overrides; the
    others (``hook=False``) also serve the extension's own requests when it stands aside.
    """

    owner: str
    name: str
    parameters: tuple[str, ...] | None = None
    hook: bool = True

    def __str__(self) -> str:
        where = {"client": "KazooClient()", "connection": "ConnectionHandler()"}
        return f"{where.get(self.owner, self.owner)}.{self.name}"


NEEDS: tuple[Need, ...] = (
    # overridden on the client (per client: kazoo builds neither class from a parameter)
    Need("KazooClient", "_call", ("self", "request", "async_object"), hook=False),
    Need("KazooClient", "_reset_watchers", ("self",)),
    Need("KazooClient", "_session_callback", ("self", "state")),
    # the connection: a subclass, built in place of the client's own before start()
    Need(
        "ConnectionHandler",
        "__init__",
        ("self", "client", "retry_sleeper", "logger", "sasl_options"),
    ),
    Need("ConnectionHandler", "_connect", ("self", "host", "hostip", "port")),
    Need("ConnectionHandler", "_send_request", ("self", "read_timeout", "connect_timeout")),
    Need("ConnectionHandler", "_send_ping", ("self", "connect_timeout")),
    Need("ConnectionHandler", "_read_socket", ("self", "read_timeout")),
    Need("ConnectionHandler", "_read_watch_event", ("self", "buffer", "offset")),
    Need("ConnectionHandler", "_read_response", ("self", "header", "buffer", "offset")),
    Need("ConnectionHandler", "_read_header", ("self", "timeout")),
    Need("ConnectionHandler", "_submit", ("self", "request", "timeout", "xid")),
    Need("ConnectionHandler", "stop", ("self", "timeout")),
    Need("module", "CLOSE_RESPONSE"),
    Need("module", "WATCH_XID"),
    # read or written
    Need("client", "_connection"),
    Need("client", "_session_id"),
    Need("client", "_state"),
    Need("client", "_queue"),
    Need("client", "_pending"),
    Need("client", "_stopped"),
    Need("client", "_data_watchers", hook=False),
    Need("client", "_child_watchers", hook=False),
    Need("connection", "_xid"),
    Need("connection", "_socket"),
    Need("connection", "retry_sleeper"),
    Need("connection", "logger"),
    Need("connection", "sasl_options"),
)


class KazooCompatibilityWarning(RuntimeWarning):
    """The installed kazoo is not the one :mod:`sentinel.zk.watches` was written for: the
    extension stands aside and the client runs as plain kazoo."""


@dataclass(frozen=True)
class Compatibility:
    """What :func:`check` found: the needs that differ, as text, for the overrides (``hooks``)
    and for the extension's own requests (``calls``)."""

    hooks: tuple[str, ...]
    calls: tuple[str, ...]

    @property
    def hookable(self) -> bool:
        """Every override the extension makes would find what it expects."""
        return not self.hooks and not self.calls


def _series(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else -1)
    return tuple(parts)


def _differs(need: Need, client: KazooClient, connection: object) -> str | None:
    """What is wrong with ``need`` on this kazoo and this client, or None."""
    owner: object = {
        "KazooClient": KazooClient,
        "ConnectionHandler": ConnectionHandler,
        "client": client,
        "connection": connection,
        "module": kazoo_connection,
    }[need.owner]
    if owner is None or not hasattr(owner, need.name):
        return f"{need} missing"
    if need.parameters is None:
        return None
    value = getattr(owner, need.name)
    try:
        # not followed through a decorator's __wrapped__: the function called is the wrapper
        found = tuple(inspect.signature(value, follow_wrapped=False).parameters)
    except (TypeError, ValueError):
        return f"{need} not a function"
    if found != need.parameters:
        return f"{need}({', '.join(found)}), not ({', '.join(need.parameters)})"
    return None


def check(client: KazooClient) -> Compatibility:
    """Compare the installed kazoo and ``client`` with :data:`NEEDS` and the tested series."""
    connection = getattr(client, "_connection", None)
    hooks: list[str] = []
    calls: list[str] = []
    if _series(KAZOO_VERSION) != TESTED_SERIES:
        hooks.append(f"kazoo {KAZOO_VERSION} is not {'.'.join(map(str, TESTED_SERIES))}.x")
    for need in NEEDS:
        problem = _differs(need, client, connection)
        if problem is not None:
            (hooks if need.hook else calls).append(problem)
    return Compatibility(tuple(hooks), tuple(calls))


_warned: set[Compatibility] = set()
_warned_lock = threading.Lock()


def warn_once(found: Compatibility) -> None:
    """One :class:`KazooCompatibilityWarning` per process for each different finding."""
    with _warned_lock:
        if found in _warned:
            return
        _warned.add(found)
    missing = "; ".join(found.hooks + found.calls)
    warnings.warn(
        f"sentinel.zk.watches does not fit kazoo {KAZOO_VERSION} ({missing}): the client runs "
        "as plain kazoo, with its one-shot watches (re-read after each reconnection) and no "
        "ZooKeeper 3.6 watches",
        KazooCompatibilityWarning,
        stacklevel=3,
    )


def session(client: KazooClient) -> tuple[int, bytes]:
    """The session ``client`` holds or will resume, as ``(id, password)``: kazoo's public
    ``client_id`` while connected; while not (``client_id`` is None then), the id and password
    kazoo keeps for its next connection (for :func:`sentinel.testing.helpers.expire_session`,
    which ends a session whose link is cut; not part of :data:`NEEDS`: the extension does not
    use them). Raises :class:`LookupError` when this kazoo keeps them under other names."""
    if client.client_id is not None:
        return client.client_id
    try:
        return client._session_id, client._session_passwd
    except AttributeError as exc:
        raise LookupError(f"kazoo {KAZOO_VERSION} keeps no session id where 2.11 does") from exc


# The attribute of an extended client that holds its extension (the client's own, and gone
# with it).
_EXTENSION = "_sentinel_zk_extension"


def extension_of(client: KazooClient) -> object:
    """The extension :func:`remember` attached to ``client``, or None."""
    return getattr(client, _EXTENSION, None)


def remember(client: KazooClient, extension: object) -> None:
    """Attach ``extension`` to ``client`` (see :func:`extension_of`)."""
    setattr(client, _EXTENSION, extension)


class Extension(Protocol):
    """What the hooks call back: :class:`sentinel.zk.watches.PersistentWatches`."""

    def _primed(self, connection: HookedConnection, resumed: bool, timeout: float) -> None:
        """Right after connect and auth, on the connection thread."""

    def _dispatch(self, watch: Watch) -> None:
        """An event read, before kazoo's one-shot watchers get it."""

    def _replied(self, request: Any, code: int) -> None:
        """A reply is about to complete ``request``."""

    def _reset_watchers(self) -> None:
        """In place of kazoo's ``_reset_watchers``."""

    def _waits(self) -> bool:
        """Whether the calling thread's requests wait for a connection while there is none."""


class HookedConnection(ConnectionHandler):
    """kazoo's connection with the extension's hooks, built in place of the client's own."""

    # While the connection thread reads one reply or event from the socket: that thread, and
    # the requests a watcher called there asked to send at once (Internals.read_after).
    _reading_thread: threading.Thread | None = None
    _write_timeout = 10.0  # seconds; the connect timeout, as kazoo's own sends use
    # ``_direct``: callers may write (connected, primed, plain TCP), cleared under
    # ``_send_lock`` before a drop fails the pending.
    _direct = False

    def __init__(self, *args: Any, extension: Extension, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._extension = extension
        self._at_once: list[tuple[Any, Any]] = []
        self._after: list[Callable[[], None]] = []
        # Held around every write to the socket together with its xid and its entry in the
        # client's pending replies, whichever thread writes.
        self._send_lock = threading.Lock()

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

    def read_after(self, request: Any, async_object: Any) -> bool:
        """On the connection thread while it reads an event: send ``request`` right after
        that event is handled, ahead of the queue; False anywhere else."""
        if self._reading_thread is not threading.current_thread():
            return False
        self._at_once.append((request, async_object))
        return True

    def after_message(self, run: Callable[[], None]) -> bool:
        """On the connection thread while it reads one reply or event: call ``run()`` once
        that message is handled, just before the thread goes back to its ``select`` (which
        lets go of the interpreter); False anywhere else. A thread woken by ``run`` then finds
        the interpreter free instead of waking to wait for it."""
        if self._reading_thread is not threading.current_thread():
            return False
        self._after.append(run)
        return True

    def stop(self, timeout: float | None = None) -> bool:
        """kazoo's wait for this connection's thread to end, called once the client is
        stopping. An attempt still connecting is cut first: its handshake read waits out the
        session timeout on a server that accepts and never answers (a frozen one), and kazoo's
        ``stop()`` waits for that read, so a ``start()`` given 1 s took 10. A connected session
        is left to close as kazoo closes it (the server then ends it at once)."""
        sock = self._socket
        if sock is not None and self.client._stopped.is_set() and not self.client.connected:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return super().stop(timeout)

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
        self._after = []
        self._reading_thread = threading.current_thread()
        try:
            try:
                response = super()._read_socket(read_timeout)
            except BaseException:
                self._fail_at_once()
                raise
            finally:
                self._reading_thread = None
            if response is kazoo_connection.CLOSE_RESPONSE:
                self._fail_at_once()
                return response
            while self._at_once:
                request, result = self._at_once.pop(0)
                try:
                    with self._send_lock:
                        self._write_pending(request, result)
                except BaseException:
                    self._fail_at_once()
                    # The connection loop drops the connection, as on any failed send, and
                    # kazoo fails the pending requests, this one among them, with ConnectionLoss.
                    raise
            return response
        finally:
            self._run_after()

    def _run_after(self) -> None:
        after, self._after = self._after, []
        for run in after:
            try:
                run()
            except Exception:  # a caller's bug must not take the connection thread down
                log.exception("%r after a message failed", run)

    def _fail_at_once(self) -> None:
        for _, result in self._at_once:
            result.set_exception(ConnectionLoss())
        self._at_once = []

    def exchange(self, requests: Sequence[Any], timeout: float, xid: int) -> list[int]:
        """Send ``requests`` (all with ``xid``) before anything else on this connection and
        return their error codes, dispatching the watch events the server sends before its
        replies."""
        for request in requests:
            self._submit(request, timeout, xid)
        codes: list[int] = []
        while len(codes) < len(requests):
            header, buffer, offset = self._read_header(timeout)
            if header.xid == kazoo_connection.WATCH_XID:
                self._read_watch_event(buffer, offset)
            elif header.xid == xid:
                if header.zxid > 0:
                    self.client.last_zxid = header.zxid
                codes.append(header.err)
            else:
                raise ConnectionDropped(f"unexpected reply xid {header.xid} while priming")
        return codes

    def _read_watch_event(self, buffer: bytes, offset: int) -> None:
        watch = Watch.deserialize(buffer, offset)[0]
        self._extension._dispatch(watch)
        # kazoo's own handling parses the event again to serve its one-shot watchers: skipped
        # when it holds none for the path (it would pop nothing and call nobody), so the
        # cache's worker, woken by the dispatch, waits less for this thread to let go.
        client = self.client
        if (
            watch.type not in EVENT_TYPE_MAP
            or watch.path in client._data_watchers
            or watch.path in client._child_watchers
        ):
            super()._read_watch_event(buffer, offset)

    def _read_response(self, header: Any, buffer: bytes, offset: int) -> Any:
        if self.client._pending:
            self._extension._replied(self.client._pending[0][0], header.err)
        return super()._read_response(header, buffer, offset)


class Internals:
    """One client's kazoo internals as the extension uses them.

    Built on every extended client; :meth:`hook` installs the overrides (only when
    :func:`check` found everything), the rest serve the extension's own requests in either
    mode (only when its ``calls`` are clean: see :attr:`calls`).
    """

    def __init__(self, client: KazooClient, found: Compatibility) -> None:
        self._client = client
        self.calls = not found.calls  # _call and the one-shot watcher tables are usable
        self.connection: HookedConnection | None = None
        self._extension: Extension | None = None
        self.stock_call: Callable[[Any, Any], Any] = getattr(client, "_call", None)  # type: ignore[assignment]
        self.stock_reset_watchers: Callable[[], None] = lambda: None
        self._stock_session_callback: Callable[[str], None] = lambda state: None

    def hook(self, extension: Extension) -> None:
        """Install the overrides on the (not started) client: its connection replaced by a
        :class:`HookedConnection`, and its ``_call``, ``_reset_watchers`` and
        ``_session_callback`` by the extension's."""
        client = self._client
        stock = client._connection
        self.connection = HookedConnection(
            client,
            stock.retry_sleeper,
            logger=stock.logger,
            sasl_options=stock.sasl_options,
            extension=extension,
        )
        client._connection = self.connection
        self._extension = extension
        self.stock_reset_watchers = client._reset_watchers
        client._reset_watchers = extension._reset_watchers
        self.stock_call = client._call
        client._call = self._call
        self._stock_session_callback = client._session_callback
        client._session_callback = self._session_changed

    # --- the extension's own requests and kazoo's one-shot watcher tables ----------------

    def call(self, request: Any, async_object: Any) -> Any:
        """Send ``request`` as kazoo sends its own (through the hooks when installed)."""
        return self._client._call(request, async_object)

    def one_shot_paths(self) -> tuple[list[str], list[str]]:
        """The server paths of kazoo's one-shot data watches and child watches."""
        client = self._client
        return (
            [path for path, watchers in list(client._data_watchers.items()) if watchers],
            [path for path, watchers in list(client._child_watchers.items()) if watchers],
        )

    def forget_one_shot(self, path: str, data: bool, children: bool) -> None:
        """Drop kazoo's one-shot watchers of ``path``: none of them is called from now on."""
        if not self.calls:
            return
        if data:
            self._client._data_watchers.pop(path, None)
        if children:
            self._client._child_watchers.pop(path, None)

    def stopped(self) -> bool:
        """The client is stopping: kazoo dispatches no more events."""
        return self._client._stopped.is_set()

    def read_after(self, request: Any, async_object: Any) -> bool:
        """See :meth:`HookedConnection.read_after` (False when not hooked)."""
        return self.connection is not None and self.connection.read_after(request, async_object)

    def after_message(self, run: Callable[[], None]) -> bool:
        """See :meth:`HookedConnection.after_message` (False when not hooked)."""
        return self.connection is not None and self.connection.after_message(run)

    # --- the client's hooks --------------------------------------------------------------

    def _call(self, request: Any, async_object: Any) -> Any:
        """kazoo's ``_call``: the request written by this thread when it can be (see
        :meth:`HookedConnection.send_now`), queued for the connection thread otherwise, or
        failed at once for a thread that does not wait for a connection while there is none."""
        assert self.connection is not None and self._extension is not None
        if self.connection.send_now(request, async_object):
            return None
        if self._extension._waits():
            return self.stock_call(request, async_object)
        if not self.connected():  # failed before it is queued: kazoo's wake-up byte for it
            # would stay unread until the next connection, and enough of them block the next
            # caller (docs/zookeeper.md: the wake-up socket's capacity)
            async_object.set_exception(ConnectionLoss("not connected, and not waiting"))
            return False
        queued = self.stock_call(request, async_object)
        # Dropped meanwhile? kazoo sets the state before it fails what is queued, so a request
        # queued after that is seen here.
        if not self.connected():
            self._unqueue(request, async_object)
        return queued

    def connected(self) -> bool:
        """The client's own state (set before kazoo fails what is queued) is connected."""
        return self._client._state in (KeeperState.CONNECTED, KeeperState.CONNECTED_RO)

    def _session_changed(self, state: str) -> None:
        """kazoo's ``_session_callback``: any change but to CONNECTED stops callers' writes
        before kazoo fails the pending and queued requests, so none is added after that."""
        if state not in (KeeperState.CONNECTED, KeeperState.CONNECTED_RO):
            assert self.connection is not None
            self.connection.stop_sending()
        self._stock_session_callback(state)

    def _unqueue(self, request: Any, async_object: Any) -> None:
        """Fail a request of a thread that does not wait if it is still in kazoo's queue (the
        wake-up byte it left is read by kazoo as a request cancelled)."""
        assert self.connection is not None
        with self.connection._send_lock:  # the connection thread sends under it
            try:
                self._client._queue.remove((request, async_object))
            except ValueError:
                return  # sent, or failed by kazoo with the rest of the queue
        async_object.set_exception(ConnectionLoss("the connection dropped"))
