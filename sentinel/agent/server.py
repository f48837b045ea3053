"""``sentinel agent``: one ZooKeeper session per host, serving the host's processes.

:class:`AgentServer` holds one :class:`~sentinel.Sentinel` client (its session, its cache and
its watches) and serves the processes that connect to its Unix socket: each says which
services it follows, and gets each one's whole state, then the state again after every
change (:mod:`sentinel.agent.protocol`). A process's lookups never cross the socket: it keeps
its own immutable snapshots, as with a session of its own.

Who may connect: the socket file is made with mode 0660 (0600 without ``allowed_gids``), and
every connection's peer credentials (``SO_PEERCRED``) are checked: root, the agent's own user,
and the users and groups allowed. A refused peer, a frame that is not a message, or a process
that claims another process's identity is logged, counted and dropped; the others are served.

Nothing a process sends reaches the agent's cache worker or kazoo's threads: each connection
has a reader thread (requests, which may wait on ZooKeeper) and a sender thread. Changes are
marked on the connection (a set of services, latest wins), never queued, so a slow process
costs the agent one set per connection and is sent the latest state when it reads again; one
that has not read for ``send_timeout`` seconds is dropped (it reconnects and reads afresh).
Credentials cross the socket as the ``/auth`` node holds them, sealed to the process's key
ring: the agent holds no private key and never sees a credential in the clear.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError, NoNodeError
from kazoo.protocol.states import ZnodeStat
from kazoo.security import Permissions

from sentinel import telemetry
from sentinel.agent import changes, protocol
from sentinel.agent.changes import Pending
from sentinel.agent.link import error_answer
from sentinel.agent.protocol import ProtocolError
from sentinel.agent.protocol import field as checked
from sentinel.auth import acl
from sentinel.auth.acl import ensure_clients_node
from sentinel.cache.snapshot_file import policy_entry, service_entry
from sentinel.cache.views import ServiceSnapshot
from sentinel.connection import client_arguments
from sentinel.errors import (
    AccessDenied,
    NamespaceNotFound,
    ResolutionError,
    SentinelError,
    ServiceNotFound,
    ZooKeeperUnavailable,
)
from sentinel.events import ChangeEvent, ConnectionChanged, ShardKeysChanged
from sentinel.registry.layout import (
    METRICS,
    auth_keys_path,
    auth_path,
    client_path,
    service_path,
    validate_name,
)
from sentinel.registry.records import ClientRecord
from sentinel.shards.maps import DirectoryMap
from sentinel.shards.spec import bucket_of, bucket_path, encode_bucket, policy_path
from sentinel.zk.errors import translate
from sentinel.zk.protocol import WatcherType

if TYPE_CHECKING:
    from sentinel.client import Sentinel

log = logging.getLogger(__name__)

_PEERCRED = struct.Struct("3i")  # pid, uid, gid
_TIMEVAL = struct.Struct("ll")  # SO_SNDTIMEO's struct timeval
# Sessions the agent opens to read as its processes' identities (only for nodes not everyone
# may read): identities are a host's few roles and applications; more is refused.
MAX_IDENTITY_SESSIONS = 64
# Requests a process may have unanswered: its worker follows one service at a time and its
# lookups ask for a key each; more is a flood, and the connection is dropped.
MAX_PENDING_REPLIES = 1024


@dataclass(eq=False)
class _Connection:
    """One process's connection: who it is, what it follows, and what it has not been sent."""

    sock: socket.socket
    pid: int
    client: str | None = None
    auth_client: str | None = None
    identity: str | None = None  # its ZooKeeper identity, for what it may read
    followed: set[str] = field(default_factory=set)
    policies_sent: dict[str, str] = field(default_factory=dict)  # policy -> spec text sent
    announced: set[str] = field(default_factory=set)  # /clients paths
    # What is due: replies in order, then the services' changes, the policies' latest state.
    replies: list[dict[str, Any]] = field(default_factory=list)
    pending: Pending = field(default_factory=Pending)
    keys: dict[str, set[str] | None] = field(default_factory=dict)  # None: the whole map
    numbers: dict[str, int] = field(default_factory=dict)  # service -> its whole state's sent
    connection: bool = False
    due: threading.Condition = field(default_factory=threading.Condition)
    closed: bool = False

    def mark(
        self,
        *,
        policy: str | None = None,
        keys: Iterable[str] | None = None,
        connection: bool = False,
    ) -> None:
        """Note what changed; the sender sends its latest state. Never blocks on the peer."""
        with self.due:
            if policy is not None and policy in self.policies_sent:
                pending = self.keys.get(policy, set())
                self.keys[policy] = None if keys is None or pending is None else {*pending, *keys}
            self.connection |= connection
            self.due.notify()

    def mark_service(self, service: str, change: tuple[int, bytes] | None) -> None:
        """A change of ``service``: its delta (its number, its frame), or None when the
        process must be sent the whole state. Never blocks on the peer."""
        with self.due:
            if service in self.followed:
                if change is None:
                    self.pending.add_whole(service)
                else:
                    self.pending.add_delta(service, *change)
                self.due.notify()

    def mark_credential(self, service: str, frame: bytes | None) -> None:
        """The process's credential node of ``service`` changed: its frame (None: send the
        whole state)."""
        with self.due:
            if service in self.followed:
                if frame is None:
                    self.pending.add_whole(service)
                else:
                    self.pending.add_credential(service, frame)
                self.due.notify()

    def reply(self, message: dict[str, Any]) -> None:
        with self.due:
            if len(self.replies) >= MAX_PENDING_REPLIES:
                raise ProtocolError(f"more than {MAX_PENDING_REPLIES} requests unanswered")
            self.replies.append(message)
            self.due.notify()


class AgentServer:
    """Serves the processes of a host from ``sentinel``'s session on the socket at ``path``.

    ``allowed_uids``/``allowed_gids``: who may connect besides root and the agent's own
    user. ``send_timeout``: seconds a process may leave a frame unread before it is dropped.
    ``deltas``: send a change as what changed (False: the service's whole state, as before
    deltas were built; for comparing the two, ``benchmarks.agent``).
    """

    def __init__(
        self,
        sentinel: Sentinel,
        path: str,
        *,
        allowed_uids: Iterable[int] = (),
        allowed_gids: Iterable[int] = (),
        send_timeout: float = 30.0,
        deltas: bool = True,
    ) -> None:
        self.sentinel = sentinel
        self.deltas = deltas
        self.path = path
        self._uids = frozenset({0, os.geteuid(), *allowed_uids})
        self._gids = frozenset(allowed_gids)
        self._send_timeout = send_timeout
        self._connections: set[_Connection] = set()
        self._lock = threading.Lock()  # the set above, and the credential nodes below
        # (service, auth client) -> the /auth node's text (None: no node), as last read
        self._auth: dict[tuple[str, str], str | None] = {}
        # The DataWatch following each pair's node, by a token of its own: a watch whose token
        # is gone (its client's processes all left, or a newer watch replaced it) stops.
        self._auth_watches: dict[tuple[str, str], object] = {}
        self._readers: dict[str, KazooClient] = {}  # identity -> a session reading as it
        # service -> (the number of its last change, the snapshot after it), as the cache's
        # worker swapped it in; and the JSON of the snapshot's nodes, encoded once for every
        # whole state sent of it.
        self._published: dict[str, tuple[int, ServiceSnapshot]] = {}
        self._encoded: dict[str, tuple[ServiceSnapshot, str]] = {}
        self._listening: socket.socket | None = None
        self._stopped = threading.Event()
        self._remove_listener: Any = None

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> AgentServer:
        """Listen on the socket (a stale one left by a dead agent is replaced) and follow the
        session's changes."""
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, mode=0o755, exist_ok=True)
        self._replace_stale_socket()
        listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o117 if self._gids else 0o177)  # made 0660 or 0600, never wider
        try:
            listening.bind(self.path)
        finally:
            os.umask(old_umask)
        listening.listen(128)
        self._listening = listening
        self._remove_listener = self.sentinel.listen(None, self._on_change)
        self.sentinel._cache.on_swap = self._on_swap
        threading.Thread(target=self._accept, name="sentinel-agent-accept", daemon=True).start()
        log.info(
            "agent serving %s from %s%s", self.path, self.sentinel.hosts, self.sentinel.namespace
        )
        return self

    def run(self) -> None:
        """Serve until :meth:`stop`."""
        self._stopped.wait()

    def stop(self) -> None:
        """Stop accepting, drop every connection (their processes keep serving their
        snapshots, marked stale, and reconnect) and remove the socket."""
        self._stopped.set()
        if self._remove_listener is not None:
            self._remove_listener()
            self.sentinel._cache.on_swap = None
        if self._listening is not None:
            with contextlib.suppress(OSError):
                self._listening.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        with self._lock:
            connections = list(self._connections)
            readers, self._readers = list(self._readers.values()), {}
        for connection in connections:
            self._drop(connection, None)
        for reader in readers:
            reader.stop()
            reader.close()

    def __enter__(self) -> AgentServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def processes(self) -> int:
        """The processes connected now."""
        return len(self._connections)

    def _replace_stale_socket(self) -> None:
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise SentinelError(f"{self.path} exists and is not a socket: not replacing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.path)
        except OSError:
            os.unlink(self.path)  # nobody listens: a dead agent's
            return
        finally:
            probe.close()
        raise SentinelError(f"an agent already serves {self.path}")

    # --- connections ------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._listening is not None
        while not self._stopped.is_set():
            try:
                sock, _ = self._listening.accept()
            except OSError:
                return  # closed by stop()
            pid, uid, gid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )
            if uid not in self._uids and gid not in self._gids:
                telemetry.AGENT_DROPPED.labels("refused").inc()
                log.warning("agent: refused pid %d (uid %d, gid %d): not allowed", pid, uid, gid)
                sock.close()
                continue
            # Sends time out (a process that stops reading is dropped), reads never do: a
            # process that asks nothing for hours is as welcome as a busy one.
            seconds = int(self._send_timeout)
            micros = int((self._send_timeout - seconds) * 1_000_000)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _TIMEVAL.pack(seconds, micros))
            connection = _Connection(sock, pid)
            with self._lock:
                self._connections.add(connection)
            telemetry.AGENT_PROCESSES.set(len(self._connections))
            for target, name in ((self._read, "reader"), (self._send, "sender")):
                threading.Thread(
                    target=target,
                    args=(connection,),
                    name=f"sentinel-agent-{name}-{pid}",
                    daemon=True,
                ).start()

    def _drop(self, connection: _Connection, reason: str | None) -> None:
        """Close a connection and forget its announcements; ``reason`` is counted (None: the
        process left, or the agent stops)."""
        with connection.due:
            if connection.closed:
                return
            connection.closed = True
            connection.due.notify()
        if reason is not None:
            telemetry.AGENT_DROPPED.labels(reason).inc()
        with contextlib.suppress(OSError):
            connection.sock.shutdown(socket.SHUT_RDWR)
        connection.sock.close()
        with self._lock:
            self._connections.discard(connection)
            still = {path for other in self._connections for path in other.announced}
            self._unfollow_auth(connection.auth_client)
        telemetry.AGENT_PROCESSES.set(len(self._connections))
        for path in connection.announced - still:  # its /clients entries go with it
            try:
                self.sentinel._nodes.remove(path)
            except Exception as exc:  # the session lost or closing: its end removes them
                log.warning("agent: could not remove %s (%s)", path, type(exc).__name__)

    def _unfollow_auth(self, client: str | None) -> None:
        """Under the lock, once no connected process claims ``client``: stop following its
        credential nodes, the session's watches included, now rather than when a node is next
        written (a node that does not exist, a name a process only claimed, may never be).
        Under the lock, so that a process of the same client following meanwhile sets its
        watch after this removal, never before it."""
        if client is None or any(c.auth_client == client for c in self._connections):
            return
        for pair in [pair for pair in self._auth if pair[1] == client]:
            self._auth.pop(pair)
            self._auth_watches.pop(pair, None)
            # not waited for: this thread holds the lock
            self.sentinel._watches.remove_watches(auth_path(*pair), WatcherType.DATA, wait=False)

    def _read(self, connection: _Connection) -> None:
        """The connection's requests, one at a time; anything that is not one drops it."""
        try:
            hello = protocol.receive(
                connection.sock, protocol.MAX_REQUEST_BYTES, frozenset({"hello"})
            )
            if hello is None:
                return self._drop(connection, None)
            self._welcome(connection, hello)
            while True:
                message = protocol.receive(
                    connection.sock, protocol.MAX_REQUEST_BYTES, protocol.REQUESTS - {"hello"}
                )
                if message is None:
                    return self._drop(connection, None)
                self._serve(connection, message)
        except (ProtocolError, SentinelError, ValueError) as exc:
            log.warning("agent: dropping pid %d: %s", connection.pid, exc)
            self._drop(connection, "protocol")
        except OSError:
            self._drop(connection, None)
        except Exception:  # a bug of the agent's own: logged, and the process reconnects
            log.exception("agent: dropping pid %d", connection.pid)
            self._drop(connection, "error")

    def _welcome(self, connection: _Connection, hello: dict[str, Any]) -> None:
        if checked(hello, "version", int) != protocol.VERSION:
            raise ProtocolError(f"protocol version {hello['version']}, not {protocol.VERSION}")
        if checked(hello, "namespace", str) != self.sentinel.namespace:
            raise ProtocolError(
                f"namespace {hello['namespace']!r}: this agent serves {self.sentinel.namespace!r}"
            )
        connection.client = validate_name("client id", checked(hello, "client", str))
        connection.identity = checked(hello, "identity", (str, type(None)))
        auth_client = checked(hello, "auth_client", (str, type(None)))
        welcome = self._connection_message("welcome")
        if auth_client is not None:
            connection.auth_client = validate_name("auth client", auth_client)
            # What a process with a key ring checks at start, read here so that it opens no
            # session when its public keys are published already (the common case). Unknown
            # while the agent's session is down: the process then checks on its own session.
            welcome["secured"] = welcome["keys"] = None
            try:
                welcome["secured"] = acl.is_secured(self.sentinel._zk)
                keys, _ = self.sentinel._zk.get(auth_keys_path(auth_client))
                welcome["keys"] = keys.decode("utf-8", "replace")
            except NoNodeError:
                pass
            except KazooException:
                welcome["secured"] = None
        connection.reply(welcome)

    def _serve(self, connection: _Connection, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "announce":  # no answer
            self._announce(connection, message)
            return
        request = checked(message, "id", int)
        if op == "follow":
            service = validate_name("service", checked(message, "service", str))
            try:
                self.sentinel.prefetch(service)
                self._check_readable(connection, service)
            except (ServiceNotFound, NamespaceNotFound, AccessDenied) as exc:
                connection.reply(error_answer(request, exc))
                return
            except (ZooKeeperUnavailable, KazooException) as exc:  # its session is down
                connection.reply(error_answer(request, translate(exc, "the agent's session")))
                return
            if connection.auth_client is not None:
                self._follow_auth(service, connection.auth_client)
            connection.reply({"op": "service", "id": request, "service": service})
        elif op == "partition":
            service = validate_name("service", checked(message, "service", str))
            key = checked(message, "key", (str, int))
            try:
                partition = self.sentinel.partition_of(service, key)
            except (ResolutionError, ZooKeeperUnavailable, KazooException) as exc:
                connection.reply(error_answer(request, translate(exc, "the agent's session")))
                return
            connection.reply({"op": "partition", "id": request, "partition": partition})

    def _announce(self, connection: _Connection, message: dict[str, Any]) -> None:
        """Keep the process's ``/clients`` record on the agent's session while it is
        connected: only its own (its client id and its pid, as the kernel tells it)."""
        service = validate_name("service", checked(message, "service", str))
        assert connection.client is not None
        path = client_path(service, connection.client)
        data = checked(message, "record", str).encode()
        record = ClientRecord.from_bytes(service, connection.client, path, data)
        if record.pid != connection.pid:
            raise ProtocolError(f"a /clients record for pid {record.pid}, sent by {connection.pid}")
        nodes = self.sentinel._nodes  # the agent's session keeps the process's entries
        nodes.put(
            path,
            data,
            prepare=functools.partial(ensure_clients_node, self.sentinel._zk, service),
            keep_trying=True,
        )
        connection.announced.add(path)

    # --- what a process may read ------------------------------------------------------------

    def _check_readable(self, connection: _Connection, service: str) -> None:
        """:class:`AccessDenied` unless the process's identity may read every subtree it
        would be served of ``service`` (its node, its metrics, its credential node, its shard
        policy). A subtree that everyone may read costs one ACL read; one that not everyone
        may read is read as the process's identity, on a session of that identity's own
        (kept for the identity's other processes), since ZooKeeper hides the digest hashes in
        an ACL from a session without ADMIN there."""
        snapshot = self.sentinel._snapshots.get(service)
        roots = [service_path(service), f"{METRICS}/{service}"]
        if connection.auth_client is not None:
            roots.append(auth_path(service, connection.auth_client))
        if snapshot is not None and snapshot.spec.shard_policy is not None:
            roots.append(policy_path(snapshot.spec.shard_policy))
        for root in roots:
            if not self._readable(connection.identity, root):
                raise AccessDenied(
                    f"service {service!r}: this process's ZooKeeper identity may not read "
                    f"{root} (its ACL), and the agent serves it only what it may read"
                )

    def _readable(self, identity: str | None, path: str) -> bool:
        try:
            entries, _ = self.sentinel._zk.get_acls(path)
        except NoNodeError:
            return True  # nothing there to hide
        if any(e.perms & Permissions.READ and e.id.scheme == "world" for e in entries):
            return True
        if identity is None:
            return False
        reader = self._identity_session(identity)
        if reader is None:
            return False
        try:
            reader.get(path)
        except NoAuthError:
            return False
        except NoNodeError:
            return True
        return True

    def _identity_session(self, identity: str) -> KazooClient | None:
        """A session authenticated as ``identity``, made on first need (None past
        :data:`MAX_IDENTITY_SESSIONS`, or when it does not connect)."""
        with self._lock:
            reader = self._readers.get(identity)
            if reader is not None or len(self._readers) >= MAX_IDENTITY_SESSIONS:
                return reader
            reader = KazooClient(
                hosts=f"{self.sentinel.hosts}{self.sentinel.namespace}",
                **client_arguments(identity, self.sentinel.tls),
            )
            try:
                reader.start(timeout=self.sentinel.connect_timeout)
            except Exception as exc:
                log.warning("agent: no session for a process's identity (%s)", type(exc).__name__)
                return None
            self._readers[identity] = reader
            return reader

    # --- changes (the agent cache's worker; kazoo's thread for credentials) ---------------------

    def _on_change(self, event: ChangeEvent) -> None:
        """Mark a change of the session or of a shard map on every connection; a service's
        changes are :meth:`_on_swap`'s. Nothing here waits."""
        with self._lock:
            connections = list(self._connections)
        if isinstance(event, ConnectionChanged):
            for connection in connections:
                connection.mark(connection=True)
        elif isinstance(event, ShardKeysChanged):
            for connection in connections:
                connection.mark(policy=event.policy, keys=event.changes)

    def _on_swap(
        self,
        service: str,
        old: ServiceSnapshot,
        new: ServiceSnapshot | None,
        names: Collection[str] | None,
    ) -> None:
        """A service's snapshot replaced in the agent's cache (None: dropped): number the
        change, encode what changed once, and hand the same frame to every connection
        following the service (the whole state when a delta cannot say it). On the cache's
        worker; nothing here waits."""
        fields = None if new is None or not self.deltas else changes.delta(service, old, new, names)
        with self._lock:
            number = self._published.get(service, (0, old))[0] + (fields != {})
            if new is None:
                self._published.pop(service, None)
                self._encoded.pop(service, None)
            else:
                self._published[service] = (number, new)
            connections = list(self._connections)
        if fields == {}:
            return  # nothing a process holds (the agent's own credential)
        change = None
        if fields is not None:
            frame = protocol.encode({"op": "delta", "service": service, "seq": number, **fields})
            change = (number, frame)
        for connection in connections:
            connection.mark_service(service, change)

    def _follow_auth(self, service: str, client: str) -> None:
        """Follow ``client``'s credential node of ``service`` (once for every process of that
        client, and only while one is connected: a claimed client name costs the agent a
        watch for as long as its process lives, see :meth:`_unfollow_auth`); its changes mark
        the service on their connections."""
        pair = (service, client)
        token = object()
        with self._lock:
            if pair in self._auth:
                return
            self._auth[pair] = None
            self._auth_watches[pair] = token
        ready = threading.Event()

        def changed(data: bytes | None, _: ZnodeStat | None) -> bool:
            with self._lock:
                if self._auth_watches.get(pair) is not token:  # unfollowed, maybe followed anew
                    ready.set()
                    return False
                connections = [
                    c for c in self._connections if c.auth_client == client and not c.closed
                ]
                if not connections:  # its processes are gone: stop following the node
                    self._auth.pop(pair, None)
                    self._auth_watches.pop(pair, None)
                    ready.set()
                    return False
                text = self._auth[pair] = None if data is None else data.decode("utf-8", "replace")
            frame = None
            if self.deltas:  # one frame for every process of the client
                frame = protocol.encode({"op": "auth", "service": service, "auth": text})
            for connection in connections:
                connection.mark_credential(service, frame)
            ready.set()
            return True

        self.sentinel._zk.DataWatch(auth_path(service, client), changed)
        ready.wait(self.sentinel.connect_timeout)  # the first read, before the reply

    # --- the sender ---------------------------------------------------------------------------

    def _send(self, connection: _Connection) -> None:
        """Send what is due, latest state first-come; drop the connection when the process
        stops reading for ``send_timeout`` seconds."""
        while True:
            with connection.due:
                while not (
                    connection.closed
                    or connection.replies
                    or connection.pending
                    or connection.keys
                    or connection.connection
                ):
                    connection.due.wait()
                if connection.closed:
                    return
                replies, connection.replies = connection.replies, []
                credentials, services, deltas = connection.pending.take()
                keys, connection.keys = connection.keys, {}
                state, connection.connection = connection.connection, False
            try:
                # A credential frame first: a state built below holds one at least as new.
                for frame in credentials.values():
                    self._write_frame(connection, "auth", frame)
                for message in replies:
                    if message["op"] == "service":
                        # Followed from here: a change after this marks it, and the state
                        # sent now holds every change before. No change frame of a service
                        # goes out before its answer.
                        with connection.due:
                            connection.followed.add(message["service"])
                        self._write_service(connection, message["service"], message["id"])
                        continue
                    self._write(connection, message)
                for service in sorted(services):
                    self._write_service(connection, service)
                for service, frames in deltas.items():
                    sent = connection.numbers.get(service, 0)
                    for number, frame in frames:
                        if number > sent:  # else the whole state sent held it
                            self._write_frame(connection, "delta", frame)
                for policy, changed in keys.items():
                    self._write(connection, self._keys_message(connection, policy, changed))
                if state:
                    self._write(connection, self._connection_message("connection"))
            except OSError as exc:
                # SO_SNDTIMEO ran out: the process stopped reading.
                slow = isinstance(exc, TimeoutError | BlockingIOError)
                if slow:
                    log.warning(
                        "agent: dropping pid %d: it read nothing for %gs",
                        connection.pid,
                        self._send_timeout,
                    )
                return self._drop(connection, "slow" if slow else None)

    def _write(self, connection: _Connection, message: dict[str, Any]) -> None:
        self._write_frame(connection, message["op"], protocol.encode(message))

    def _write_frame(self, connection: _Connection, op: str, frame: bytes) -> None:
        sent = protocol.send_frame(connection.sock, frame)
        telemetry.AGENT_SENT_BYTES.inc(sent)
        telemetry.AGENT_FRAMES.labels(op).inc()

    def _write_service(
        self, connection: _Connection, service: str, request: int | None = None
    ) -> None:
        """Send the service's whole state now (``gone`` when the agent no longer holds it),
        numbered as its last change, with its shard map the first time and the process's
        sealed credential node. Its nodes are encoded once per snapshot, whatever the number
        of connections sent it."""
        with self._lock:
            number, snapshot = self._published.get(service, (0, None))
            if snapshot is None:  # no change since the agent's cache loaded it
                snapshot = self.sentinel._snapshots.get(service)
            auth = None
            if connection.auth_client is not None:
                auth = self._auth.get((service, connection.auth_client))
        if snapshot is None:
            with connection.due:
                connection.followed.discard(service)
            self._write(connection, {"op": "gone", "id": request, "service": service})
            return
        message: dict[str, Any] = {
            "op": "service",
            "id": request,
            "service": service,
            "seq": number,
            "policies": {},
            "auth": auth,
        }
        policy = snapshot.spec.shard_policy
        if policy is not None and policy not in connection.policies_sent:
            message["policies"][policy] = self._policy_entry(connection, policy)
        connection.numbers[service] = number
        frame = protocol.encode(message, {"entry": self._entry(service, snapshot)})
        self._write_frame(connection, "service", frame)

    def _entry(self, service: str, snapshot: ServiceSnapshot) -> str:
        """``snapshot``'s nodes in the snapshot file's form, as JSON, encoded once."""
        encoded = self._encoded.get(service)
        if encoded is None or encoded[0] is not snapshot:
            entry = {**service_entry(service, snapshot), "invalid": sorted(snapshot.invalid)}
            encoded = self._encoded[service] = (snapshot, protocol.json_text(entry))
        return encoded[1]

    def _keys_message(
        self, connection: _Connection, policy: str, keys: set[str] | None
    ) -> dict[str, Any]:
        """The buckets of a directory map that hold ``keys``, or the whole map (another
        kind, another spec than the process has, or ``keys`` None)."""
        shard_map = self.sentinel._shard_maps.get(policy)
        spec_text = None if shard_map is None else shard_map.spec.to_bytes(policy_path(policy))
        if (
            keys is None
            or not isinstance(shard_map, DirectoryMap)
            or connection.policies_sent.get(policy) != spec_text.decode()  # type: ignore[union-attr]
        ):
            return {
                "op": "policy",
                "policy": policy,
                "entry": self._policy_entry(connection, policy),
            }
        indexes = {bucket_of(key, shard_map.spec.buckets) for key in keys}
        return {
            "op": "buckets",
            "policy": policy,
            "buckets": {
                str(i): encode_bucket(bucket_path(policy, i), shard_map.bucket(i)).decode()
                for i in indexes
            },
        }

    def _policy_entry(self, connection: _Connection, policy: str) -> dict[str, Any] | None:
        """A shard map in the snapshot file's form (None: the policy does not exist)."""
        shard_map = self.sentinel._shard_maps.get(policy)
        entry = None if shard_map is None else policy_entry(policy, shard_map)
        connection.policies_sent[policy] = "" if entry is None else entry["spec"]
        return entry

    def _connection_message(self, op: str) -> dict[str, Any]:
        state = self.sentinel.connection_state
        since = None if state == "connected" else time.time() - self.sentinel.staleness
        return {"op": op, "version": protocol.VERSION, "state": state, "since": since, "id": None}
