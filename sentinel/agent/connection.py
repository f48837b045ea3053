"""One process's connection to the host agent, and what the agent's rooms ask of its server.

A :class:`Connection` is what the agent knows of one process on its socket: who it is (the
kernel's pid and uid, its hello's client id and identity), what it follows, what it has not
been sent yet, and its socket's buffers. Every room of the agent reads and marks it
(:mod:`~sentinel.agent.admission`, :mod:`~sentinel.agent.identities`,
:mod:`~sentinel.agent.fanout`, :mod:`~sentinel.agent.answers`); the server's loop
(:mod:`sentinel.agent.server`) alone reads and writes its socket, and the rooms call back
into the loop through :class:`Server` rather than reaching into it.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sentinel.agent.changes import Pending
from sentinel.agentlink import protocol
from sentinel.agentlink.protocol import ProtocolError

if TYPE_CHECKING:
    from sentinel.agent.regions import RegionServer

#: The agent daemon's logger, whichever of its rooms writes: the one name operators configure
#: (and the one it had before the rooms were split out of :mod:`sentinel.agent.server`).
LOGGER = "sentinel.agent.server"
# Requests a process may have unanswered: its worker follows one service at a time and its
# lookups ask for a key each; more is a flood, and the connection is dropped.
MAX_PENDING_REPLIES = 1024
# Requests read from a connection and not yet served: past this its socket is not read until
# they are (the kernel's buffer then holds the process back), never a growing queue.
MAX_QUEUED_REQUESTS = 64


@dataclass(eq=False)
class Connection:
    """One process's connection: who it is, what it follows, what it has not been sent, and
    its socket's buffers (the loop's; the workers' through :attr:`due`)."""

    sock: socket.socket
    pid: int
    uid: int
    kick: Callable[[Connection], None]  # something is due: have its frames built
    client: str | None = None
    auth_client: str | None = None
    identity: str | None = None  # its ZooKeeper identity, for what it may read
    version: int = protocol.VERSION  # its hello's: 2 and later send and expect heartbeats
    deltas: bool = False  # its hello says it applies deltas (older processes do not)
    followed: set[str] = field(default_factory=set)
    policies_sent: dict[str, str] = field(default_factory=dict)  # policy -> spec text sent
    readable: set[str] = field(default_factory=set)  # services its identity may read
    # What is due: replies in order, then the services' changes, the policies' latest state.
    replies: list[dict[str, Any]] = field(default_factory=list)
    pending: Pending = field(default_factory=Pending)
    keys: dict[str, set[str] | None] = field(default_factory=dict)  # None: the whole map
    numbers: dict[str, int] = field(default_factory=dict)  # service -> its whole state's sent
    connection: bool = False
    due: threading.Lock = field(default_factory=threading.Lock)  # everything here
    closed: bool = False
    # The socket's side, under ``due``: frames read and not yet served, frames built and not
    # yet written, and whether a worker is on either.
    frames: protocol.FrameReader = field(
        default_factory=lambda: protocol.FrameReader(protocol.MAX_REQUEST_BYTES, protocol.REQUESTS)
    )
    requests: collections.deque[dict[str, Any]] = field(default_factory=collections.deque)
    out: collections.deque[bytes] = field(default_factory=collections.deque)
    out_offset: int = 0  # bytes of out[0] written
    serving: bool = False  # a request worker has its requests
    flushing: bool = False  # a frame worker builds its frames
    greeted: bool = False  # its first frame (the hello) has come
    # The server of the region its hello named, and that hello: the loop hands it over.
    handed_to: tuple[RegionServer, dict[str, Any]] | None = None
    welcomed: bool = False  # its hello was accepted
    events: int = 0  # what the loop's selector waits for on its socket (0: not registered)
    accepted_at: float = field(default_factory=time.monotonic)
    heard_at: float = field(default_factory=time.monotonic)  # the last bytes it sent
    sent_at: float = field(default_factory=time.monotonic)  # the last progress writing

    def mark(
        self,
        *,
        policy: str | None = None,
        keys: Iterable[str] | None = None,
        connection: bool = False,
    ) -> None:
        """Note what changed; its latest state is sent. Never blocks on the peer."""
        with self.due:
            if policy is not None and policy in self.policies_sent:
                pending = self.keys.get(policy, set())
                self.keys[policy] = None if keys is None or pending is None else {*pending, *keys}
            self.connection |= connection
        self.kick(self)

    def mark_service(
        self,
        service: str,
        delta: tuple[int, bytes] | None = None,
        credential: bytes | None = None,
    ) -> None:
        """A change of ``service``: its delta (its number, its frame) or its credential
        node's frame; neither, or a process that does not take deltas: the whole state.
        Never blocks on the peer."""
        with self.due:
            if service not in self.followed:
                return
            if credential is not None and self.deltas:
                self.pending.add_credential(service, credential)
            elif delta is not None and self.deltas:
                self.pending.add_delta(service, *delta)
            else:
                self.pending.add_whole(service)
        self.kick(self)

    def reply(self, message: dict[str, Any]) -> None:
        """Queue an answer (sent in order, before the changes marked)."""
        with self.due:
            if len(self.replies) >= MAX_PENDING_REPLIES:
                raise ProtocolError(f"more than {MAX_PENDING_REPLIES} requests unanswered")
            self.replies.append(message)
        self.kick(self)

    def send_out(self) -> bool:
        """Under :attr:`due`, the socket open: write what the socket takes now of the frames
        built; True when the socket is broken."""
        while self.out:
            chunk = self.out[0]
            try:
                sent = self.sock.send(memoryview(chunk)[self.out_offset :])
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                return True
            self.sent_at = time.monotonic()
            self.out_offset += sent
            if self.out_offset == len(chunk):
                self.out.popleft()
                self.out_offset = 0
        return False


class Server(Protocol):
    """What the agent's rooms ask of the server whose loop owns the connections' sockets."""

    def drop(self, connection: Connection, reason: str | None) -> None:
        """Close ``connection`` and forget it everywhere; ``reason`` is counted (None: the
        process left, or the agent stops)."""

    def call_loop(self, connection: Connection) -> None:
        """Have the loop look at ``connection`` again (frames to write, reading to resume, or
        its socket to close)."""


class Workers:
    """A fixed few threads for one kind of work, whatever the connections: a task handed
    to them once they are shut down (the agent stops) is dropped, there being nothing to do."""

    def __init__(self, count: int, name: str) -> None:
        self._pool = ThreadPoolExecutor(count, name)

    def submit(self, task: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # shut down: the agent stops
            self._pool.submit(task, *args)

    def shutdown(self) -> None:
        """Wait for the tasks under way; refuse new ones."""
        self._pool.shutdown(wait=True)
