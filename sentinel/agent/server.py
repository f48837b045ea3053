"""``sentinel agent``: one ZooKeeper session per host, serving the host's processes.

:class:`AgentServer` holds one :class:`~sentinel.Sentinel` client (its session, its cache and
its watches) and serves the processes that connect to its Unix socket: each says which
services it follows, and gets each one's whole state, then each change as what changed
(:mod:`sentinel.agentlink.protocol`, :mod:`sentinel.agent.changes`). A process's lookups never
cross the socket: it keeps its own immutable snapshots, as with a session of its own.

The server is its socket loop and the rooms it wires together, each owning its state and
calling back into the loop through :class:`~sentinel.agent.connection.Server`:

* :mod:`~sentinel.agent.admission`: who may connect (peer credentials, the caps, whose
  client ids are whose), and the socket path's checks;
* :mod:`~sentinel.agent.connection`: one process's connection;
* :mod:`~sentinel.agent.answers`: what a process's requests are answered, on request workers;
* :mod:`~sentinel.agent.identities`: the sessions acting as the processes' identities, what a
  process may read, and its ``/clients`` entries;
* :mod:`~sentinel.agent.credentials`: the ``/auth`` nodes read for the processes;
* :mod:`~sentinel.agent.fanout`: each change handed to the connections following it, and
  their frames built on frame workers;
* :mod:`~sentinel.agent.regions`: the agent's other regions, whose servers this one hands
  the connections whose hello names them.

Threads do not grow with connections: one loop (:mod:`selectors`) accepts, reads and writes
every socket, non-blocking; requests (which may wait on ZooKeeper) run on a few request
workers, and frames are built on a few frame workers, so the loop never waits. Nothing a
process sends reaches the agent's cache worker or kazoo's threads. A hello must come within
``hello_timeout``; a process that sends nothing (not even a heartbeat) for
:data:`~sentinel.agentlink.protocol.HEARTBEAT_MISSES` heartbeats is dropped, and the agent sends a
heartbeat on a link idle for ``heartbeat`` seconds so that its processes can tell a quiet
agent from a dead one; one that has not read for ``send_timeout`` seconds is dropped (it
reconnects and reads afresh). A refused peer, a frame that is not a message, or a process
that claims the client id of another process of its user is logged, counted and dropped; any
failure on a connection drops that connection only, logged and counted.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import resource
import selectors
import socket
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sentinel import telemetry
from sentinel.agent.admission import Admission, prepare_socket_path
from sentinel.agent.answers import Answers
from sentinel.agent.connection import LOGGER, MAX_QUEUED_REQUESTS, Connection, Workers
from sentinel.agent.credentials import Credentials
from sentinel.agent.fanout import Fanout
from sentinel.agent.identities import Identities
from sentinel.agent.peers import Throttled
from sentinel.agentlink import protocol
from sentinel.agentlink.link import error_answer
from sentinel.agentlink.protocol import ProtocolError
from sentinel.agentlink.protocol import field as checked
from sentinel.errors import RegionNotServed
from sentinel.registry.layout import validate_name

if TYPE_CHECKING:
    from sentinel.agent.regions import RegionServers
    from sentinel.client import Sentinel

log = logging.getLogger(LOGGER)

# Threads serving requests (which may wait on ZooKeeper: the hello's key check, follow,
# partition, announce): a fixed few, whatever the connections.
REQUEST_WORKERS = 8
# Connections accepted in one turn of the loop before it serves the others again.
_ACCEPTS_PER_TURN = 64
# A full descriptor table or kernel memory on accept: accepting pauses this long (the
# connections wait in the listen backlog meanwhile) while the loop serves the others.
_ACCEPT_BACKOFF = 0.1
_RECEIVE_BYTES = 256 * 1024
# The kernel's buffer for each connection's frames (the kernel doubles it): a large frame
# goes out in a few writes, each a turn of the loop and a wake-up of the process's reader,
# rather than in dozens of the default's. Memory only while frames wait unread, and a
# connection's frames wait in the agent's own buffer anyway until written.
_SEND_BUFFER = 1 << 20


class AgentServer:
    """Serves the processes of a host from ``sentinel``'s session on the socket at ``path``.

    ``allowed_uids``/``allowed_gids``: who may connect besides root and the agent's own
    user. ``send_timeout``: seconds a process may leave a frame unread before it is dropped.
    ``max_connections``/``max_connections_per_uid``: connections served at once, in all and
    from one peer uid (more are refused, each told why). ``hello_timeout``: seconds a new
    connection has to send its hello. ``heartbeat``: seconds of silence after which the agent
    sends a heartbeat; a process silent for three of them is dropped, and drops the agent
    after as long. ``max_frame_bytes``: the largest frame sent; a service whose state is
    larger is sent as an error naming it. ``deltas``: send a change as what changed (False:
    the service's whole state, as before deltas were built; for comparing the two,
    ``benchmarks.agent``). ``regions``: the agent's other regions
    (:class:`~sentinel.agent.regions.RegionServers`): a hello naming one of them is handed to
    that region's server, made on first need with this one's settings; ``region``: the
    region such a server serves (it listens on no socket: it is handed its connections).
    """

    def __init__(
        self,
        sentinel: Sentinel,
        path: str,
        *,
        allowed_uids: Iterable[int] = (),
        allowed_gids: Iterable[int] = (),
        send_timeout: float = 30.0,
        max_connections: int = 4096,
        max_connections_per_uid: int = 1024,
        hello_timeout: float = 10.0,
        heartbeat: float = 5.0,
        max_frame_bytes: int = protocol.MAX_REPLY_BYTES,
        deltas: bool = True,
        regions: RegionServers | None = None,
        region: str | None = None,
    ) -> None:
        # A region's server is made with these (_region_server): the same checks and caps.
        self._settings: dict[str, Any] = {
            "allowed_uids": tuple(allowed_uids),
            "allowed_gids": tuple(allowed_gids),
            "send_timeout": send_timeout,
            "max_connections": max_connections,
            "max_connections_per_uid": max_connections_per_uid,
            "hello_timeout": hello_timeout,
            "heartbeat": heartbeat,
            "max_frame_bytes": max_frame_bytes,
            "deltas": deltas,
        }
        allowed_uids = self._settings["allowed_uids"]
        self.sentinel = sentinel
        #: The other region this server serves (None: the agent's own session).
        self.region = region
        self._regions = regions
        #: The agent's other surfaces and where each listens (``xds``, ``dns``): its
        #: ``status`` says them; set by whoever starts them (``sentinel agent``).
        self.listeners: dict[str, str] = {}
        if regions is not None and region is None:  # the agent's xDS server fails over there
            regions.bind(sentinel, self._region_server)
        self.deltas = deltas
        self.path = path
        self._send_timeout = send_timeout
        self._max_connections = max_connections
        self._hello_timeout = hello_timeout
        self._heartbeat = heartbeat
        self._heartbeat_frame = protocol.encode(protocol.HEARTBEAT)
        self._admission = Admission(
            path,
            allowed_uids=allowed_uids,
            allowed_gids=self._settings["allowed_gids"],
            max_connections=max_connections,
            max_connections_per_uid=max_connections_per_uid,
            region=region,
        )
        self._credentials = Credentials(sentinel, self._admission, deltas=deltas)
        self._identities = Identities(sentinel, self._admission)
        self._fanout = Fanout(
            sentinel,
            self._admission,
            self._credentials,
            self,
            deltas=deltas,
            max_frame_bytes=max_frame_bytes,
        )
        self._listening: socket.socket | None = None
        self._stopped = threading.Event()
        self._remove_listener: Any = None
        # The loop's: its selector, the socket pair that wakes it, and the connections the
        # workers hand it (something to write, reading to resume, or a socket to close).
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._calls: collections.deque[Connection] = collections.deque()
        self._loop_thread: threading.Thread | None = None
        self._accept_resumes_at: float | None = None  # accepting paused until then
        self._tick = max(0.01, min(1.0, heartbeat / 4, hello_timeout / 4, send_timeout / 4))
        self._requests = Workers(REQUEST_WORKERS, "sentinel-agent-request")
        self._accept_errors = Throttled(log)
        self._answers = Answers(
            sentinel,
            self,
            self._requests,
            admission=self._admission,
            identities=self._identities,
            credentials=self._credentials,
            fanout=self._fanout,
            heartbeat=heartbeat,
            regions=regions,
        )

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> AgentServer:
        """Listen on the socket (a stale one left by a dead agent is replaced; a region's
        server listens on none) and follow the session's changes."""
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        if self.region is None:
            self._listen()
        self._remove_listener = self.sentinel.listen(None, self._fanout.on_change)
        self.sentinel.session.cache.on_swap = self._fanout.on_swap
        self._loop_thread = threading.Thread(target=self._loop, name="sentinel-agent", daemon=True)
        self._loop_thread.start()
        log.info(
            "agent serving %s%s from %s%s",
            self.path,
            "" if self.region is None else f" (region {self.region})",
            self.sentinel.hosts,
            self.sentinel.namespace,
        )
        return self

    def _listen(self) -> None:
        prepare_socket_path(self.path)
        _raise_descriptor_limit(self._max_connections)
        listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bound 0600; opened to everyone only when other users are allowed: the kernel then
        # lets them reach the peer check, which decides (the file's mode cannot name a list
        # of users and groups).
        old_umask = os.umask(0o177)
        try:
            listening.bind(self.path)
            if self._admission.open:
                os.chmod(self.path, 0o666)
        finally:
            os.umask(old_umask)
        listening.listen(1024)
        listening.setblocking(False)
        self._listening = listening
        self._selector.register(listening, selectors.EVENT_READ, listening)

    def run(self) -> None:
        """Serve until :meth:`stop`."""
        self._stopped.wait()

    def stop(self) -> None:
        """Stop accepting, drop every connection (their processes keep serving their
        snapshots, marked stale, and reconnect) and remove the socket."""
        self._stopped.set()
        if self._remove_listener is not None:
            self._remove_listener()
            self.sentinel.session.cache.on_swap = None
        self._wake()
        if self._loop_thread is not None and self._loop_thread is not threading.current_thread():
            self._loop_thread.join()
        if self._listening is not None:
            with contextlib.suppress(OSError):
                self._listening.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        connections = self._admission.connected()
        for connection in connections:
            self.drop(connection, None)
        for connection in connections:  # the loop has ended: closed here
            self._close(connection)
        # Requests under way finish (each bounded by its ZooKeeper timeout), and the /clients
        # entries of the connections dropped are retired, before the sessions go.
        self._requests.shutdown()
        self._fanout.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        self._identities.close()
        if self._regions is not None:
            self._regions.close()

    def __enter__(self) -> AgentServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def processes(self) -> int:
        """The processes connected now."""
        return len(self._admission.connections)

    # --- the loop: every socket's accepting, reading and writing ------------------------------

    def _loop(self) -> None:
        """Serve the sockets until :meth:`stop`. Nothing in a turn waits but the selector, and
        nothing a turn meets ends the loop: an error is logged and counted and the loop goes
        on (a connection's own error drops that connection only)."""
        next_sweep = time.monotonic() + self._tick
        while not self._stopped.is_set():
            try:
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + self._tick
                wake_at = next_sweep
                if self._accept_resumes_at is not None:
                    wake_at = min(wake_at, self._accept_resumes_at)
                for key, mask in self._selector.select(max(0.0, wake_at - time.monotonic())):
                    self._ready(key.data, mask)
                self._run_calls()
            except Exception:
                telemetry.AGENT_ERRORS.labels("loop").inc()
                log.exception("agent: the socket loop met an error; it goes on")

    def _ready(self, data: object, mask: int) -> None:
        if data is None:  # woken by a worker: its calls are run after this turn's events
            with contextlib.suppress(OSError):
                while self._wake_r.recv(4096):
                    pass
        elif isinstance(data, socket.socket):
            self._accept()
        else:
            connection: Connection = data  # type: ignore[assignment]
            if connection.closed:  # dropped by a worker: its socket is closed after this turn
                return
            try:
                if mask & selectors.EVENT_READ:
                    self._receive(connection)
                if mask & selectors.EVENT_WRITE and not connection.closed:
                    self._write(connection)
            except Exception:  # a bug of the agent's own: logged, and the process reconnects
                log.exception("agent: dropping pid %d", connection.pid)
                self.drop(connection, "error")

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: the loop is awake already
            self._wake_w.send(b"\0")

    def call_loop(self, connection: Connection) -> None:
        """From a worker: have the loop look at ``connection`` again (frames to write,
        reading to resume, or its socket to close)."""
        self._calls.append(connection)
        self._wake()

    def _run_calls(self) -> None:
        while True:
            try:
                connection = self._calls.popleft()
            except IndexError:
                return
            if connection.closed:
                self._close(connection)
            else:
                self._update(connection)
                if connection.out:
                    self._write(connection)

    def _update(self, connection: Connection) -> None:
        """Wait on the socket for what the connection needs now: reading unless its
        requests are queued to the limit, writing while it has frames to write."""
        with connection.due:
            wanted = 0 if len(connection.requests) >= MAX_QUEUED_REQUESTS else selectors.EVENT_READ
            if connection.out:
                wanted |= selectors.EVENT_WRITE
        if wanted == connection.events:
            return
        if connection.events == 0:
            self._selector.register(connection.sock, wanted, connection)
        elif wanted == 0:
            self._selector.unregister(connection.sock)
        else:
            self._selector.modify(connection.sock, wanted, connection)
        connection.events = wanted

    def _close(self, connection: Connection) -> None:
        """The loop's (or, once it ended, :meth:`stop`'s): forget the socket and close it (or
        hand it to the server of the region its hello named)."""
        if connection.events:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(connection.sock)
            connection.events = 0
        if connection.handed_to is not None:
            server, hello = connection.handed_to
            server.adopt(connection, hello)
            return
        with contextlib.suppress(OSError):
            connection.sock.shutdown(socket.SHUT_RDWR)
        connection.sock.close()

    def _sweep(self, now: float) -> None:
        """What time decides, every tick: accepting resumed after a pause; a hello that did
        not come, a process silent past its heartbeats or not reading for ``send_timeout``
        dropped; a heartbeat for each link idle for ``heartbeat``."""
        if self._accept_resumes_at is not None and now >= self._accept_resumes_at:
            self._accept_resumes_at = None
            assert self._listening is not None
            self._selector.register(self._listening, selectors.EVENT_READ, self._listening)
        silence = protocol.HEARTBEAT_MISSES * self._heartbeat
        connections = self._admission.connected()
        for connection in connections:
            reason = None
            with connection.due:
                heartbeats = connection.welcomed and connection.version >= 2
                if not connection.greeted and now - connection.accepted_at > self._hello_timeout:
                    reason = "hello"
                elif connection.out and now - connection.sent_at > self._send_timeout:
                    reason = "slow"
                elif (
                    heartbeats
                    and now - connection.heard_at > silence
                    and len(connection.requests) < MAX_QUEUED_REQUESTS  # read, not held back
                ):
                    reason = "silent"
                elif (
                    heartbeats
                    and not connection.out
                    and not connection.flushing
                    and now - connection.sent_at >= self._heartbeat
                ):
                    connection.out.append(self._heartbeat_frame)
                    connection.sent_at = now
            if reason is not None:
                log.warning(
                    "agent: dropping pid %d: %s",
                    connection.pid,
                    {
                        "hello": f"no hello within {self._hello_timeout:g}s",
                        "slow": f"it read nothing for {self._send_timeout:g}s",
                        "silent": f"it sent nothing, not even a heartbeat, for {silence:g}s",
                    }[reason],
                )
                self.drop(connection, reason)
            elif connection.out and not connection.events & selectors.EVENT_WRITE:
                self._update(connection)

    # --- accepting ----------------------------------------------------------------------------

    def _accept(self) -> None:
        """Accept what waits (a burst at most): every error is logged and counted, and a full
        descriptor table or kernel memory pauses accepting briefly instead of spinning."""
        assert self._listening is not None
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, _ = self._listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                telemetry.AGENT_ERRORS.labels("accept").inc()
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._accept_errors.warning(
                        "agent: cannot accept (%s): accepting again in %gs, serving meanwhile",
                        exc.strerror,
                        _ACCEPT_BACKOFF,
                    )
                    self._selector.unregister(self._listening)
                    self._accept_resumes_at = time.monotonic() + _ACCEPT_BACKOFF
                    return
                self._accept_errors.warning("agent: accept failed (%s); accepting goes on", exc)
                continue
            try:
                self._admit(sock)
            except Exception:
                telemetry.AGENT_ERRORS.labels("accept").inc()
                log.exception("agent: a connection could not be admitted; accepting goes on")
                with contextlib.suppress(OSError):
                    sock.close()

    def _admit(self, sock: socket.socket) -> None:
        """Serve a new connection if its peer may connect and the caps allow; else refuse it
        (the caps' refusal says why, in an error frame)."""
        pid, uid, gid = protocol.peer_credentials(sock)
        if not self._admission.allowed(sock, uid, gid):
            telemetry.AGENT_DROPPED.labels("refused").inc()
            self._admission.refusals.warning(
                "agent: refused pid %d (uid %d, gid %d): not allowed", pid, uid, gid
            )
            sock.close()
            return
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        connection = Connection(sock, pid, uid, self._fanout.schedule)
        if self._admission.join(connection):
            self._update(connection)

    def adopt(self, handed: Connection, hello: dict[str, Any]) -> None:
        """From the agent's own server's loop: serve a connection it admitted (its peer
        checked) whose hello named this server's region, from that hello on; over this
        server's caps, it is refused as :meth:`_admit` refuses (told why)."""
        connection = Connection(handed.sock, handed.pid, handed.uid, self._fanout.schedule)
        connection.frames = handed.frames  # what followed the hello, read already
        connection.requests.extend([hello, *handed.requests])
        connection.greeted, connection.serving = True, True
        connection.accepted_at = handed.accepted_at
        if not self._admission.join(connection, "stopping" if self._stopped.is_set() else None):
            return
        self._requests.submit(self._answers.serve_next, connection)
        self.call_loop(connection)  # this server's loop reads it from now on

    def drop(self, connection: Connection, reason: str | None) -> None:
        """Close a connection (the loop closes its socket) and forget its announcements;
        ``reason`` is counted (None: the process left, or the agent stops)."""
        with connection.due:
            if connection.closed:
                return
            connection.closed = True
            connection.requests.clear()
            connection.out.clear()
        if reason is not None:
            telemetry.AGENT_DROPPED.labels(reason).inc()
        self.call_loop(connection)
        with self._admission.lock:  # one step for every room a connection leaves
            self._admission.leave(connection)
            gone = self._identities.forget(connection)
            self._credentials.unfollow(connection.auth_client)
        self._admission.count()
        if gone:  # its /clients entries go with it, on a request worker
            self._requests.submit(self._identities.retire, connection, gone)

    # --- reading and writing -------------------------------------------------------------------

    def _receive(self, connection: Connection) -> None:
        """The loop's: read what the process sent and queue its requests for a request
        worker (one at a time per connection, in order)."""
        try:
            data = connection.sock.recv(_RECEIVE_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self.drop(connection, None)
        if not data:
            if connection.frames.partial:
                log.warning("agent: dropping pid %d: it left mid-frame", connection.pid)
                return self.drop(connection, "protocol")
            return self.drop(connection, None)
        connection.heard_at = time.monotonic()
        try:
            messages = connection.frames.feed(data)
        except ProtocolError as exc:
            log.warning("agent: dropping pid %d: %s", connection.pid, exc)
            return self.drop(connection, "protocol")
        requests = [m for m in messages if m["op"] != "heartbeat"]
        if not requests:
            return
        with connection.due:
            connection.greeted = True
            connection.requests.extend(requests)
            start, connection.serving = not connection.serving, True
            full = len(connection.requests) >= MAX_QUEUED_REQUESTS
        if start:
            self._requests.submit(self._answers.serve_next, connection)
        if full:
            self._update(connection)  # read again once they are served

    def _write(self, connection: Connection) -> None:
        """The loop's: write what the socket takes now; once all is written, have what is
        due built."""
        with connection.due:
            broken = not connection.closed and connection.send_out()
            written = not connection.out
        if broken:
            return self.drop(connection, None)
        if written:
            self._update(connection)
            self._fanout.schedule(connection)

    # --- the agent's other regions: a hello naming one hands its connection over -------------

    def served_region(self, connection: Connection, hello: dict[str, Any]) -> str | bool | None:
        """The region a hello names, when this server serves it (None: it names none);
        False when it names another: then the connection is handed to that region's server
        (its loop reads it from there), or refused with RegionNotServed when the agent's
        configuration has no such region."""
        if "region" not in hello:
            return None
        name = validate_name("region", checked(hello, "region", str))
        if name == self.region or (
            self.region is None and self._regions is not None and name == self._regions.local
        ):
            return name
        if self.region is not None:  # a region's server is handed only its own hellos
            raise ProtocolError(f"a hello naming region {name!r} on region {self.region!r}")
        server = None if self._regions is None else self._regions.server(name, self._region_server)
        if server is None:
            configured = ", ".join(self._regions.names) if self._regions is not None else ""
            error = RegionNotServed(
                f"the agent at {self.path} serves no region {name!r} (its other regions: "
                f"{configured or 'none'}; --regions, $SENTINEL_REGIONS)"
            )
            # Counted before it is told: the process then leaves, and its end may be the
            # loop's to see first (then this connection's drop below counts nothing).
            telemetry.AGENT_DROPPED.labels("region").inc()
            self._admission.refusals.warning("agent: pid %d: %s", connection.pid, error)
            with contextlib.suppress(OSError):  # nothing sent on it yet: the frame fits
                connection.sock.send(protocol.encode(error_answer(None, error)))
            self.drop(connection, None)
            return False
        with connection.due:
            if connection.closed:
                return False
            connection.closed = True  # this server reads it no more
            connection.handed_to = (server, hello)
        self._admission.hand_over(connection)
        self.call_loop(connection)  # the loop forgets its socket and hands it over
        return False

    def _region_server(self, sentinel: Sentinel, region: str) -> AgentServer:
        """A started server of ``sentinel``'s session to ``region``, with this server's
        settings (peer checks, caps, timeouts), listening on no socket of its own."""
        return AgentServer(sentinel, self.path, region=region, **self._settings).start()


def _raise_descriptor_limit(connections: int) -> None:
    """Raise the soft limit on open files to the hard one: each connection is a descriptor,
    and the soft limit (1024 on many systems) is below the connection caps; a full table
    would make accepting fail for every process, not only the one that filled it. The hard
    limit is what the administrator allows; below the caps, the caps hold at it instead (and
    accepting pauses briefly when the table is full)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("agent: cannot raise the open files limit from %d (%s)", soft, exc)
    if soft != resource.RLIM_INFINITY and soft < connections + 64:
        log.warning(
            "agent: %d open files allowed, fewer than the %d connections it may serve: raise "
            "LimitNOFILE (systemd) or ulimit -n",
            soft,
            connections,
        )
