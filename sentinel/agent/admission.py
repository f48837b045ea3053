"""Who may connect to the host agent's socket, how many at once, and whose client ids are whose.

Every connection's peer credentials are checked (``SO_PEERCRED``, and ``SO_PEERGROUPS`` for
its supplementary groups, both as the kernel recorded them when it connected): root, the
agent's own user, and the users and groups allowed. The socket file is made 0600, or 0666
when other users or groups are allowed, so that the kernel lets them reach the check; its
directory must be writable by root or the agent's user alone (:func:`prepare_socket_path`).
Connections are capped per peer uid and in all (:class:`~sentinel.agent.peers.Shares`); a
connection over the caps is told why. A client id is its user's: another user's process that
says the same one is no conflict (so that the default id, ``<hostname>-<pid>``, claimed by
another user locks nobody out), and the ``/clients`` entries under an id are kept for the
first process that announced them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
import threading

from sentinel import telemetry
from sentinel.agent.connection import LOGGER, Connection
from sentinel.agent.peers import Shares, Throttled
from sentinel.agentlink import protocol
from sentinel.agentlink.link import error_answer
from sentinel.agentlink.protocol import ProtocolError
from sentinel.errors import AddressInUse, AgentUnavailable, SentinelError

log = logging.getLogger(LOGGER)

# SO_PEERGROUPS (Linux 4.13): 59 in the generic numbering (x86, arm), where Python lacks it.
_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
_GROUPS_BYTES = 1024  # the most Python's getsockopt reads: 256 groups


class Admission:
    """The connections one agent server serves, and who may be one of them.

    :attr:`lock` guards :attr:`connections`, the shares and the claims here, and is the lock
    of the other rooms' state that a connection's arrival or departure changes with them
    (its credential watches, its ``/clients`` entries): one drop is one step for them all.
    ``region``: the region the server serves (None: the agent's own), for its process count.
    """

    def __init__(
        self,
        path: str,
        *,
        allowed_uids: tuple[int, ...],
        allowed_gids: tuple[int, ...],
        max_connections: int,
        max_connections_per_uid: int,
        region: str | None,
    ) -> None:
        self._path = path
        self._region = region
        self._uids = frozenset({0, os.geteuid(), *allowed_uids})
        self._gids = frozenset(allowed_gids)
        #: Whether users other than root and the agent's may reach the check (the file's mode).
        self.open = bool(set(allowed_uids) - {0, os.geteuid()} or self._gids)
        self.lock = threading.Lock()
        #: The connections served, read under :attr:`lock`.
        self.connections: set[Connection] = set()
        self._shares = Shares(max_connections, max_connections_per_uid, "connections")
        # (peer uid, client id) -> the pid whose connections use it, and how many are
        # connected: an id is its user's, so that one user cannot take another's (the default
        # id, <hostname>-<pid>, is easily guessed) and lock its processes out.
        self._clients: dict[tuple[int, str], tuple[int, int]] = {}
        # client id -> the (uid, pid) whose /clients entries the agent keeps under it: the
        # first connected process to announce one; a process of another user or pid that
        # shares the id is served but its entries are not kept (they would overwrite these).
        self._entries: dict[str, tuple[int, int]] = {}
        #: Refusals logged, a flood of them throttled (a peer's junk fills no log).
        self.refusals = Throttled(log)

    def connected(self) -> list[Connection]:
        """The connections served now."""
        with self.lock:
            return list(self.connections)

    def allowed(self, sock: socket.socket, uid: int, gid: int) -> bool:
        """Whether the peer is root, the agent's user, an allowed user, or in an allowed group
        (primary or supplementary, as the kernel recorded them at connect: no ``/proc`` read,
        so a pid reused meanwhile changes nothing)."""
        if uid in self._uids or gid in self._gids:
            return True
        if not self._gids:
            return False
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, _GROUPS_BYTES)
        except OSError as exc:  # more groups than fit, or a kernel without SO_PEERGROUPS
            log.warning("agent: no supplementary groups of uid %d (%s)", uid, exc.strerror)
            return False
        return not self._gids.isdisjoint(struct.unpack(f"{len(raw) // 4}I", raw))

    def join(self, connection: Connection, refusal: str | None = None) -> bool:
        """Serve ``connection`` if the caps allow (and no ``refusal`` came before them); else
        refuse it, told why. Whether it is served."""
        with self.lock:
            if refusal is None:
                refusal = self._shares.take(connection.uid)
            if refusal is None:
                self.connections.add(connection)
        if refusal is not None:
            self.refuse(connection.sock, connection.pid, connection.uid, refusal)
            return False
        self.count()
        return True

    def refuse(self, sock: socket.socket, pid: int, uid: int, refusal: str) -> None:
        """Tell a connection over the caps why (nothing was sent on it yet: a new socket's
        buffer holds the frame) and close it; counted."""
        telemetry.AGENT_DROPPED.labels("cap").inc()
        self.refusals.warning("agent: refused pid %d (uid %d): %s", pid, uid, refusal)
        error = AgentUnavailable(f"the agent at {self._path} refused this process: {refusal}")
        with contextlib.suppress(OSError):
            sock.send(protocol.encode(error_answer(None, error)))
        sock.close()

    def release(self, connection: Connection) -> None:
        """Under :attr:`lock`: serve ``connection`` no more (its share freed); its claim stays
        (:meth:`leave`)."""
        if connection in self.connections:
            self.connections.discard(connection)
            self._shares.release(connection.uid)

    def hand_over(self, connection: Connection) -> None:
        """``connection`` goes to another region's server, which admits it anew: served here
        no more (it claimed nothing here: its hello was not accepted)."""
        with self.lock:
            self.release(connection)
        self.count()

    def leave(self, connection: Connection) -> None:
        """Under :attr:`lock`: ``connection`` is gone; its client id and the ``/clients``
        entries kept under it are free once its user's last connection of that id left."""
        if connection.client is not None:
            claim = (connection.uid, connection.client)
            pid, count = self._clients[claim]
            if count > 1:
                self._clients[claim] = (pid, count - 1)
            else:
                del self._clients[claim]
                if self._entries.get(connection.client) == (connection.uid, pid):
                    del self._entries[connection.client]
        self.release(connection)

    def claim(self, connection: Connection, client: str) -> None:
        """``connection``'s hello says client id ``client``: ProtocolError when another pid of
        its user holds it (its ``/clients`` entries are that process's)."""
        claim = (connection.uid, client)
        with self.lock:
            holder, count = self._clients.get(claim, (connection.pid, 0))
            if holder == connection.pid and not connection.closed:
                self._clients[claim] = (holder, count + 1)
                connection.client = client
        if holder != connection.pid:
            raise ProtocolError(f"client id {client!r} is pid {holder}'s, not {connection.pid}'s")

    def keeps_entries(self, connection: Connection) -> bool:
        """Under :attr:`lock`, ``connection`` served and its client id claimed: whether its
        ``/clients`` entries are kept (its process is the first to announce under its id);
        logged when they are not."""
        assert connection.client is not None
        owner = self._entries.setdefault(connection.client, (connection.uid, connection.pid))
        if owner == (connection.uid, connection.pid):
            return True
        self.refusals.warning(
            "agent: pid %d (uid %d): client id %r has its /clients entries kept for pid %d "
            "(uid %d); this process is served, its entries are not kept",
            connection.pid,
            connection.uid,
            connection.client,
            owner[1],
            owner[0],
        )
        return False

    def count(self) -> None:
        """Publish how many processes are connected."""
        if self._region is None:
            telemetry.AGENT_PROCESSES.set(len(self.connections))
        else:
            telemetry.AGENT_REGION_PROCESSES.labels(self._region).set(len(self.connections))


def prepare_socket_path(path: str) -> None:
    """Make ready to listen on the Unix socket ``path``: its directory made (0755) when
    missing and checked (:func:`_check_directory`), and a socket left there by a dead agent
    removed. SentinelError when ``path`` is not a socket, AddressInUse when a live agent
    listens on it: never replaced. The agent's socket and its xDS socket
    (:mod:`sentinel.agent.xds`) both."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    _check_directory(directory)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SentinelError(f"{path} exists and is not a socket: not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: a dead agent's
        return
    finally:
        probe.close()
    raise AddressInUse(f"an agent already serves {path}")


def _check_directory(directory: str) -> None:
    """SentinelError unless ``directory`` is a directory (not a link) of root or the agent's
    user that nobody else may write: whoever may write it could replace the socket with one
    of their own, and take the processes' hellos."""
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise SentinelError(f"{directory} (the socket's directory) is not a directory")
    if info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022:
        raise SentinelError(
            f"refusing to serve from {directory}: uid {info.st_uid} owns it with mode "
            f"{stat.S_IMODE(info.st_mode):04o}, so others than root and this user (uid "
            f"{os.geteuid()}) may replace the socket: give --socket (or --xds) a path in a "
            "directory only they may write (systemd's RuntimeDirectory=, or one the agent makes)"
        )
