"""The ``/auth`` nodes the host agent reads for its processes: each auth client's credential
node of each service it follows, its published keys, and the newest version issued.

Credentials cross the agent's socket as the ``/auth`` node holds them, sealed to the
process's key ring: the agent holds no private key and never sees a credential in the clear.
A credential node is followed once for every process of its auth client, and only while one
is connected: a claimed client name costs the agent a watch for as long as its process lives.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.protocol.states import ZnodeStat

from sentinel.agentlink import protocol
from sentinel.auth import acl
from sentinel.auth.store import read_auth, read_issued
from sentinel.errors import DecodeError, ZooKeeperUnavailable
from sentinel.registry.layout import auth_keys_path, auth_path
from sentinel.zk.watches import WatcherType

if TYPE_CHECKING:
    from sentinel.agent.admission import Admission
    from sentinel.client import Sentinel


class Credentials:
    """The credential nodes followed for ``admission``'s connections on ``sentinel``'s
    session; ``deltas``: a change is sent as a credential frame (else as the service's whole
    state). Its state is guarded by the admission's lock (a connection's departure unfollows
    what only it needed, in the same step)."""

    def __init__(self, sentinel: Sentinel, admission: Admission, *, deltas: bool) -> None:
        self._sentinel = sentinel
        self._admission = admission
        self._deltas = deltas
        # (service, auth client) -> the /auth node's text (None: no node), as last read
        self._texts: dict[tuple[str, str], str | None] = {}
        # The DataWatch following each pair's node, by a token of its own: a watch whose token
        # is gone (its client's processes all left, or a newer watch replaced it) stops.
        self._watches: dict[tuple[str, str], object] = {}

    def text(self, service: str, client: str) -> str | None:
        """Under the admission's lock: ``client``'s credential node of ``service`` as last
        read (None: no node, or not followed)."""
        return self._texts.get((service, client))

    def welcome(self, client: str) -> dict[str, Any]:
        """What a process of ``client`` with a key ring checks at start, read here so that it
        opens no session when its public keys are published already (the common case):
        ``secured`` and ``keys``, None where unknown (the agent's session down: the process
        then checks on its own session) or absent."""
        answer: dict[str, Any] = {"secured": None, "keys": None}
        try:
            if self._sentinel.connection_state != "connected":  # a read would wait for it
                raise ZooKeeperUnavailable("the agent's session is not connected")
            zk = self._sentinel.session.zk
            answer["secured"] = acl.is_secured(zk)
            keys, _ = zk.get(auth_keys_path(client))
            answer["keys"] = keys.decode("utf-8", "replace")
        except NoNodeError:
            pass
        except (KazooException, ZooKeeperUnavailable):
            answer["secured"] = None
        return answer

    def newest_version(self, service: str, client: str | None) -> int:
        """The newest credential version of ``client`` a process may have applied: the
        highest the manager issued or published (0 for none, or no auth client)."""
        if client is None:
            return 0
        zk = self._sentinel.session.zk
        try:
            record, _ = read_auth(zk, service, client)
        except DecodeError:
            record = None
        published = record.versions if record is not None else ()
        return max(read_issued(zk, service, client), *published, 0)

    def follow(self, service: str, client: str) -> None:
        """Follow ``client``'s credential node of ``service`` (once for every process of that
        client, and only while one is connected, see :meth:`unfollow`); its changes mark the
        service on their connections. Returns once the node was first read."""
        pair = (service, client)
        token = object()
        lock = self._admission.lock
        with lock:
            if pair in self._texts:
                return
            self._texts[pair] = None
            self._watches[pair] = token
        ready = threading.Event()

        def changed(data: bytes | None, _: ZnodeStat | None) -> bool:
            with lock:
                if self._watches.get(pair) is not token:  # unfollowed, maybe followed anew
                    ready.set()
                    return False
                connections = [
                    c
                    for c in self._admission.connections
                    if c.auth_client == client and not c.closed
                ]
                if not connections:  # its processes are gone: stop following the node
                    self._texts.pop(pair, None)
                    self._watches.pop(pair, None)
                    ready.set()
                    return False
                text = self._texts[pair] = None if data is None else data.decode("utf-8", "replace")
            frame = None
            if self._deltas:  # one frame for every process of the client
                frame = protocol.encode({"op": "auth", "service": service, "auth": text})
            for connection in connections:
                connection.mark_service(service, credential=frame)
            ready.set()
            return True

        self._sentinel.session.zk.DataWatch(auth_path(service, client), changed)
        ready.wait(self._sentinel.connect_timeout)  # the first read, before the reply

    def unfollow(self, client: str | None) -> None:
        """Under the admission's lock, once no connected process claims ``client``: stop
        following its credential nodes, the session's watches included, now rather than when
        a node is next written (a node that does not exist, a name a process only claimed,
        may never be). Under the lock, so that a process of the same client following
        meanwhile sets its watch after this removal, never before it."""
        connections = self._admission.connections
        if client is None or any(c.auth_client == client for c in connections):
            return
        for pair in [pair for pair in self._texts if pair[1] == client]:
            self._texts.pop(pair)
            self._watches.pop(pair, None)
            # not waited for: this thread holds the lock
            self._sentinel.session.watches.remove_watches(
                auth_path(*pair), WatcherType.DATA, wait=False
            )
