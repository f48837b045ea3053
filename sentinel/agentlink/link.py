"""A process's connection to its host agent: requests, answers, and the agent's changes.

:class:`AgentLink` connects to the agent's socket, says who the process is (``hello``) and
keeps the connection: a reader thread hands each change the agent sends to ``on_frame`` and
each answer to the request that waits for it. When the agent goes away (stopped, restarted,
or it dropped this process) the link tells ``on_state`` that the process is cut off since
then, fails what waits, and connects again with backoff; the agent's ``welcome`` says in what
state its own session is, and the cache re-syncs from there. Nothing here blocks the cache's
worker but a request it makes itself.

No failure is silent: anything that goes wrong reading or sending (not only a closed socket)
ends the connection, and the process is stale from then until it has connected again. The
link sends a heartbeat when it has sent nothing for the agent's ``heartbeat`` interval, and
takes :data:`~sentinel.agentlink.protocol.HEARTBEAT_MISSES` intervals without a frame from the
agent as a dead agent (stopped, or wedged while its socket stays open). A service the agent
says it cannot send (:class:`~sentinel.errors.AgentServiceUnavailable`) marks the process
stale (``suspended``, since the first such answer) until a frame of that service comes; the
other services keep flowing.

A link with a ``region`` reads another region through the agent (its hello names it): the
agent's ``welcome`` must say that region back, else the link refuses the agent (one before
regions would serve its own region's registry under the other's name); an agent that answers
that it does not serve the region (:class:`~sentinel.errors.RegionNotServed`) ends
:meth:`AgentLink.wait_connected` at once, the answer being final until the agent's
configuration changes. Such a link logs its failures at INFO: its owner (the client's other
regions, :mod:`sentinel.regions.remotes`) says once that the region is down, and why.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from kazoo.client import KazooState

from sentinel.agentlink import protocol
from sentinel.errors import (
    AccessDenied,
    AgentNotTrusted,
    AgentProtocolError,
    AgentServiceUnavailable,
    AgentUnavailable,
    NamespaceNotFound,
    PartitionNotFound,
    ReadThroughThrottled,
    RegionNotServed,
    SentinelError,
    ServiceNotFound,
    ZooKeeperUnavailable,
    _restore,
)

log = logging.getLogger(__name__)

# Reconnection backoff: the first retry at once (an agent restarting is back within a
# second), then doubling to a few seconds, each with up to half of it added at random so
# that the processes of a host do not all knock at the same instant.
_FIRST_RETRY = 0.05
_MAX_RETRY = 3.0
# The heartbeat intervals a link accepts from an agent's welcome (another is clipped).
_HEARTBEAT_RANGE = (0.05, 60.0)
# The agent's states, as the cache's connection listener takes them.
_STATES = {
    "connected": KazooState.CONNECTED,
    "suspended": KazooState.SUSPENDED,
    "lost": KazooState.LOST,
}

OnFrame = Callable[[dict[str, Any]], None]
OnState = Callable[[str, float | None], None]


class AgentLink:
    """The process's end of the agent's socket at ``path`` (see the module)."""

    def __init__(
        self,
        path: str,
        namespace: str,
        client: str,
        auth_client: str | None,
        *,
        identity: str | None = None,
        agent_user: str | int | None = None,
        timeout: float = 10.0,
        region: str | None = None,
    ) -> None:
        self.path = path
        #: The other region this link reads through the agent (None: the agent's own).
        self.region = region
        # Who may listen on the socket (the hello below carries the process's identity).
        self._trusted = protocol.trusted_uids(agent_user)
        # The process's ZooKeeper identity: the agent serves it only what that identity may
        # read (a local socket to the host's own daemon; never logged, never in a repr).
        self._hello = {
            "op": "hello",
            "version": protocol.VERSION,
            "namespace": namespace,
            "client": client,
            "auth_client": auth_client,
            "identity": identity,
            "deltas": True,  # it applies a change's delta (sentinel.cache.agent)
        }
        if region is not None:  # absent, not null: the hello of a home link is as it was
            self._hello["region"] = region
        self._timeout = timeout
        self.on_frame: OnFrame = lambda message: None
        self.on_state: OnState = lambda state, since: None
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._pending: dict[int, Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._connected = threading.Event()
        self._answered = threading.Event()  # connected, or told the region is not served
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._first_failure: AgentUnavailable | None = None
        self._heartbeat: float | None = None  # the agent's interval (None: an agent without)
        self._sent_at = 0.0  # when this end last sent a frame (monotonic)
        # The agent's session's state and since when, and the services the agent said it
        # cannot send, since when: together, the state the cache is told.
        self._agent_state: tuple[str, float | None] = (KazooState.SUSPENDED, None)
        self._unsendable: dict[str, float] = {}
        #: Connections made to the agent so far (the first, then one per reconnection).
        self.connections = 0
        #: The agent's last ``welcome``: its session's state and, for a process with a key
        #: ring, whether the namespace is secured and the keys published for its client.
        self.welcome: dict[str, Any] = {}

    @property
    def _failure_level(self) -> int:
        """A home link warns of its first failure; a region's says it at INFO (see the
        module)."""
        return logging.INFO if self.region is not None else logging.WARNING

    @property
    def connected(self) -> bool:
        """Whether the link is connected to the agent now."""
        return self._connected.is_set()

    @property
    def agent_connected(self) -> bool:
        """Whether the agent said its session is connected, last it said (its welcome, then
        its ``connection`` frames): known once :meth:`wait_connected` returns, before the
        cache hears it."""
        return self._connected.is_set() and self._agent_state[0] == KazooState.CONNECTED

    def start(self) -> None:
        """Begin connecting, in the background."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sentinel-agent", daemon=True)
            self._thread.start()

    def wait_connected(self, timeout: float) -> None:
        """Wait for the first connection; :class:`AgentUnavailable` after ``timeout``
        (:class:`~sentinel.errors.RegionNotServed` as soon as the agent says so)."""
        self._answered.wait(timeout)
        if not self._connected.is_set():
            reason = self._first_failure or AgentUnavailable(
                f"no agent answered on {self.path} within {timeout:g}s"
            )
            raise reason

    def close(self) -> None:
        """Close the connection for good; what waits fails with :class:`AgentUnavailable`.

        The reader thread owns the connection's socket (it alone sets and clears it): this
        only ends the connection, which the reader sees and closes. A close meanwhile cannot
        pull the socket from under the reader's heartbeat, nor a connection being made
        outlive it (:meth:`_connect` checks under the same lock)."""
        self._closed.set()
        with self._send_lock:
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # the reader sees the end, and stops
        self._fail_pending()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self._timeout)

    # --- requests -------------------------------------------------------------------------------

    def request(self, message: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send ``message`` and wait for its answer; an ``error`` answer is raised as the
        error the agent met, :class:`AgentUnavailable` when the link goes meanwhile."""
        if not self._connected.is_set():
            raise AgentUnavailable(f"not connected to the agent at {self.path}")
        request = next(self._ids)
        future: Future[dict[str, Any]] = Future()
        self._pending[request] = future
        try:
            self._send({**message, "id": request})
            answer = future.result(self._timeout if timeout is None else timeout)
        except FutureTimeout:
            raise AgentUnavailable(
                f"the agent at {self.path} did not answer {message['op']!r} in time"
            ) from None
        finally:
            self._pending.pop(request, None)
        if answer["op"] == "error":
            raise _error_of(answer)
        return answer

    def send(self, message: dict[str, Any]) -> bool:
        """Send ``message`` with no answer expected; False when not connected (a
        reconnection makes the caller send it again)."""
        if not self._connected.is_set():
            return False
        try:
            self._send(message)
        except (OSError, AgentUnavailable):
            return False
        return True

    def _send(self, message: dict[str, Any]) -> None:
        """Send one frame; any failure ends the connection (a frame half written leaves the
        stream unusable), and the reader reconnects."""
        with self._send_lock:
            sock = self._sock
            if sock is None:
                raise AgentUnavailable(f"not connected to the agent at {self.path}")
            try:
                protocol.send(sock, message)
            except Exception as exc:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # the reader sees the end, and reconnects
                raise AgentUnavailable(f"the agent at {self.path} went away ({exc})") from None
            self._sent_at = time.monotonic()

    # --- the connection -------------------------------------------------------------------------

    def _run(self) -> None:
        """Connect, read until the connection ends, and again: nothing ends this thread but
        :meth:`close` (an error of any kind ends the connection only, logged)."""
        delay = _FIRST_RETRY
        while not self._closed.is_set():
            try:
                welcome = self._connect()
            except Exception as exc:
                if self._closed.is_set():
                    break
                failure = exc if isinstance(exc, AgentUnavailable) else None
                if failure is None:
                    log.exception("connecting to the agent at %s failed", self.path)
                    failure = AgentUnavailable(f"connecting to the agent at {self.path} failed")
                if self._first_failure is None:
                    log.log(self._failure_level, "%s; retrying", failure)
                refused = isinstance(failure, RegionNotServed)  # the agent's answer: final
                if self._first_failure is None or refused:
                    self._first_failure = failure
                if refused:
                    self._answered.set()
                self._closed.wait(delay * (1 + random.random() / 2))
                delay = min(delay * 2, _MAX_RETRY)
                continue
            delay = _FIRST_RETRY
            self.welcome = welcome
            self._agent_state = (_STATES.get(welcome.get("state"), KazooState.SUSPENDED), None)
            self.connections += 1
            self._connected.set()
            self._answered.set()
            try:
                self._state(welcome)
                self._read()
            except Exception:  # a frame handler's bug: the connection ends, not the thread
                log.exception("dropping the agent's connection")
            self._connected.clear()
            self._disconnect()
            if not self._closed.is_set():
                log.warning("lost the agent at %s; serving the cache, marked stale", self.path)
                self._unsendable.clear()
                self._agent_state = (KazooState.SUSPENDED, time.time())
                self.on_state(*self._agent_state)

    def _connect(self) -> dict[str, Any]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._timeout)
        try:
            sock.connect(self.path)
            self._check_listener(sock)
            try:
                protocol.send(sock, self._hello)
            except OSError:
                # Refused at once (the agent's caps), and maybe told why: read that first.
                welcome = protocol.receive(sock, protocol.MAX_REPLY_BYTES, frozenset({"error"}))
                if welcome is None:
                    raise
            else:
                welcome = protocol.receive(
                    sock, protocol.MAX_REPLY_BYTES, frozenset({"welcome", "error"})
                )
        except AgentNotTrusted:
            sock.close()
            raise
        except (OSError, AgentProtocolError) as exc:
            sock.close()
            reason = getattr(exc, "strerror", None) or str(exc)
            raise AgentUnavailable(
                f"no agent answers on {self.path} ({reason}): start 'sentinel agent', or "
                f"unset ${protocol.ENV}"
            ) from None
        if welcome is None:
            sock.close()
            raise AgentUnavailable(
                f"the agent at {self.path} closed the connection: it does not serve this "
                "namespace, or this user may not connect (see the agent's log)"
            )
        if welcome["op"] == "error":  # refused, and told why (its caps, a region not served)
            sock.close()
            raise _error_of(welcome)
        if self.region is not None and welcome.get("region") != self.region:
            sock.close()
            raise AgentUnavailable(
                f"the agent at {self.path} does not serve other regions (its welcome does not "
                f"name region {self.region!r}): upgrade it and configure the region there"
            )
        heartbeat = welcome.get("heartbeat")
        if isinstance(heartbeat, int | float) and not isinstance(heartbeat, bool):
            self._heartbeat = min(max(float(heartbeat), _HEARTBEAT_RANGE[0]), _HEARTBEAT_RANGE[1])
        else:
            self._heartbeat = None  # an agent without heartbeats: waits as long as it is quiet
        # Reads wake at least every interval: to send this end's heartbeat, and to notice an
        # agent that has gone quiet; a send that cannot go on for as long as a silent agent
        # is allowed is a dead agent too. Kernel timeouts on a blocking socket, not Python's
        # (which polls before each read): one wait per read, as without heartbeats.
        sock.settimeout(None)
        if self._heartbeat is not None:
            for option, seconds in (
                (socket.SO_RCVTIMEO, self._heartbeat),
                (socket.SO_SNDTIMEO, self._heartbeat * protocol.HEARTBEAT_MISSES),
            ):
                sock.setsockopt(socket.SOL_SOCKET, option, _timeval(seconds))
        with self._send_lock:
            if self._closed.is_set():  # closed while connecting: this connection never serves
                sock.close()
                raise AgentUnavailable(f"the link to the agent at {self.path} is closed")
            self._sock = sock
            self._sent_at = time.monotonic()
        return welcome

    def _check_listener(self, sock: socket.socket) -> None:
        """:class:`AgentNotTrusted` unless both the socket file and the process listening on
        it belong to root, this process's user or the configured agent user: anyone who may
        write the socket's directory could have put a listener there, and the hello carries
        this process's identity. The listener's uid is the kernel's (``SO_PEERCRED``), so a
        file swapped between this check and the connect changes nothing."""
        _, listener, _ = protocol.peer_credentials(sock)
        owner = os.lstat(self.path).st_uid
        if listener in self._trusted and owner in self._trusted:
            return
        trusted = ", ".join(str(uid) for uid in sorted(self._trusted))
        raise AgentNotTrusted(
            f"refusing the agent at {self.path}: the socket belongs to uid {owner} and its "
            f"listener runs as uid {listener}, while only uids {trusted} may serve this "
            f"process; nothing was sent to it. If the agent runs as another user, set "
            f"${protocol.USER_ENV} to it; otherwise find who listens there"
        )

    def _read(self) -> None:
        """Frames until the connection ends: answers to their requests, the rest to
        ``on_frame`` (which must not block). Ends when the agent closes, sends what is not a
        frame, or sends nothing for :data:`~sentinel.agentlink.protocol.HEARTBEAT_MISSES`
        heartbeats."""
        sock = self._sock
        assert sock is not None
        frames = protocol.FrameReader(protocol.MAX_REPLY_BYTES, protocol.REPLIES)
        heard_at = time.monotonic()
        while True:
            try:
                data = sock.recv(1 << 20)
            except (TimeoutError, BlockingIOError):  # SO_RCVTIMEO: a heartbeat's time
                data = None
            except OSError as exc:
                if not self._closed.is_set():
                    log.warning("dropping the agent's connection: %s", exc)
                return
            now = time.monotonic()
            if data == b"":
                return
            if data is not None:
                heard_at = now
                try:
                    messages = frames.feed(data)
                except AgentProtocolError as exc:
                    log.warning("dropping the agent's connection: %s", exc)
                    return
                for message in messages:
                    self._dispatch(message)
            if self._heartbeat is None:
                continue
            if now - heard_at > protocol.HEARTBEAT_MISSES * self._heartbeat:
                log.warning(
                    "the agent at %s sent nothing for %.3gs (its heartbeat is every %gs): "
                    "serving the cache, marked stale, and reconnecting",
                    self.path,
                    now - heard_at,
                    self._heartbeat,
                )
                return
            if now - self._sent_at >= self._heartbeat:
                try:
                    self._send(protocol.HEARTBEAT)
                except AgentUnavailable as exc:
                    if not self._closed.is_set():
                        log.warning("dropping the agent's connection: %s", exc)
                    return

    def _dispatch(self, message: dict[str, Any]) -> None:
        request = message.get("id")
        future = self._pending.get(request) if isinstance(request, int) else None
        op, service = message["op"], message.get("service")
        if op == "error":
            self._unsendable_service(message)
        elif (
            op in ("service", "gone")
            and isinstance(service, str)
            and self._unsendable.pop(service, None) is not None
            and not self._unsendable
        ):
            log.info("the agent sends %s again", service)
            self._report()
        if future is not None:
            future.set_result(message)
        elif op == "connection":
            self._state(message)
        elif op != "heartbeat":
            self.on_frame(message)

    def _unsendable_service(self, message: dict[str, Any]) -> None:
        """An ``error`` naming a service the agent cannot send: stale until it can."""
        error = _error_of(message)
        service = getattr(error, "service", None)
        if not isinstance(error, AgentServiceUnavailable) or not isinstance(service, str):
            return
        log.warning("%s; serving what this process has of it, marked stale", error)
        first = not self._unsendable
        self._unsendable.setdefault(service, time.time())
        if first:
            self._report()

    def _state(self, message: dict[str, Any]) -> None:
        """The agent's session's state (``welcome``, ``connection``)."""
        self._agent_state = (
            _STATES.get(message.get("state"), KazooState.SUSPENDED),
            _since(message),
        )
        self._report()

    def _report(self) -> None:
        """Tell the cache its state: the agent's session's, but stale (``suspended``) while a
        service could not be sent, since the first such answer."""
        state, since = self._agent_state
        if self._unsendable:
            first = min(self._unsendable.values())
            state, since = KazooState.SUSPENDED, first if since is None else min(since, first)
        self.on_state(state, since)

    def _disconnect(self) -> None:
        """The reader's end of a connection: its socket closed, what waits on it failed."""
        with self._send_lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._fail_pending()

    def _fail_pending(self) -> None:
        gone = AgentUnavailable(f"the connection to the agent at {self.path} ended")
        for future in list(self._pending.values()):
            # An answer may land between the check and the set (a close on another thread).
            with contextlib.suppress(InvalidStateError):
                if not future.done():
                    future.set_exception(gone)


def _timeval(seconds: float) -> bytes:
    """A ``struct timeval`` for SO_RCVTIMEO/SO_SNDTIMEO."""
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1_000_000))


def _since(message: dict[str, Any]) -> float | None:
    since = message.get("since")
    return float(since) if isinstance(since, int | float) and not isinstance(since, bool) else None


def _error_of(answer: dict[str, Any]) -> Exception:
    """The error an ``error`` answer describes: the lookup error the agent met, with its
    fields (only the known fields of known types, each a JSON primitive), else
    :class:`ZooKeeperUnavailable` with the agent's message."""
    kind = _ERRORS.get(str(answer.get("type")))
    message = str(answer.get("message"))
    fields = answer.get("fields")
    if kind is None or not isinstance(fields, dict):
        return ZooKeeperUnavailable(f"the agent: {message}")
    state = {
        name: tuple(value) if isinstance(value, list) else value
        for name, value in fields.items()
        if name in _FIELDS
        and (
            isinstance(value, str | int | float | type(None))
            or (isinstance(value, list) and all(isinstance(v, str) for v in value))
        )
    }
    return _restore(kind, (message,), state)


# The errors a request may meet at the agent, raised as themselves in the process.
_ERRORS: dict[str, type[SentinelError]] = {
    kind.__name__: kind
    for kind in (
        ServiceNotFound,
        PartitionNotFound,
        ReadThroughThrottled,
        NamespaceNotFound,
        AccessDenied,
        AgentUnavailable,
        AgentServiceUnavailable,
        RegionNotServed,
    )
}
_FIELDS = frozenset(
    {
        "service",
        "key",
        "partition",
        "policy",
        "reason",
        "suggestions",
        "shard_policy",
        "retry_after",
        "namespace",
        "hosts",
        "region",
    }
)


def error_answer(request: int | None, exc: SentinelError) -> dict[str, Any]:
    """The ``error`` answer for ``exc`` (the agent's side of :func:`_error_of`)."""
    fields = {
        name: list(value) if isinstance(value, tuple) else value
        for name, value in vars(exc).items()
        if name in _FIELDS
        and isinstance(value, str | int | float | tuple | type(None))
        and not isinstance(value, bool)
    }
    return {
        "op": "error",
        "id": request,
        "type": type(exc).__name__,
        "message": str(exc),
        "fields": fields,
    }
