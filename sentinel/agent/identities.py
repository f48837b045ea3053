"""The sessions the host agent opens as its processes' identities, and what those serve:
whether a process may read a service, and its ``/clients`` entries while it is connected.

Whose a process's ``/clients`` entries are: the identity it proved in its hello (the agent
writes them on a session of that identity, so a rotation trusts them as it would the
process's own); a process without an identity has them on the agent's session, as an
anonymous process would. When the process leaves, its entries go (or, where the identity
may not delete them, are marked as left until its identity's last process leaves). What a
process may read is what its identity may read: the agent serves it nothing else.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError, NoNodeError
from kazoo.security import Permissions

from sentinel import telemetry
from sentinel.agent.connection import LOGGER, Connection
from sentinel.auth.acl import ensure_clients_node
from sentinel.connection import client_arguments, start_client
from sentinel.errors import AccessDenied, SentinelError
from sentinel.registry.layout import METRICS, auth_path, service_path
from sentinel.registry.records import ClientRecord
from sentinel.shards.spec import policy_path
from sentinel.zk.ephemeral import EphemeralNodes

if TYPE_CHECKING:
    from sentinel.agent.admission import Admission
    from sentinel.client import Sentinel

log = logging.getLogger(LOGGER)

# Sessions the agent opens as its processes' identities (their /clients entries, and reads of
# nodes not everyone may read): identities are a host's few roles and applications. Bounded
# per peer user and in all; past a bound the least recently used session that holds no live
# process's entry is closed, so one user's junk identities never lock another identity out.
MAX_IDENTITY_SESSIONS_PER_PEER = 16
MAX_IDENTITY_SESSIONS = 64


@dataclass(eq=False)
class IdentitySession:
    """A session acting as one process identity, for one peer user: it keeps the
    ``/clients`` entries of that user's processes of that identity, and reads what not
    everyone may read."""

    zk: KazooClient
    nodes: EphemeralNodes
    live: dict[str, Connection] = field(default_factory=dict)  # path -> whose entry it is

    def close(self) -> None:
        """End the session: its entries, live or marked, go with it."""
        self.nodes.close(timeout=0)
        with contextlib.suppress(Exception):
            self.zk.stop()
        self.zk.close()


class Identities:
    """The identity sessions of one agent server on ``sentinel``'s session, per (peer uid,
    identity), and the ``/clients`` entries its connections keep on them (or on the agent's
    own session). Its state is guarded by ``admission``'s lock: a connection's departure
    forgets its entries in the same step as it leaves."""

    def __init__(self, sentinel: Sentinel, admission: Admission) -> None:
        self._sentinel = sentinel
        self._admission = admission
        self._lock = admission.lock
        # (peer uid, identity) -> a session acting as it, least recently used first
        self._sessions: OrderedDict[tuple[int, str], IdentitySession] = OrderedDict()
        # connection -> its /clients paths -> the identity session keeping each (None: the
        # agent's own session)
        self._announced: dict[Connection, dict[str, IdentitySession | None]] = {}

    def close(self) -> None:
        """End every identity session (the connections have gone, their entries retired)."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session.close()

    # --- a process's /clients entries ------------------------------------------------------

    def keep(self, connection: Connection, service: str, path: str, data: bytes) -> None:
        """Keep ``connection``'s ``/clients`` entry of ``service`` (``data`` at ``path``,
        checked as its own) while it is connected, on a session of the identity it proved
        (so that a rotation counts it as it would the process's own), else on the agent's."""
        with self._lock:
            if connection.closed:
                return  # its drop has run, or runs next: nothing of it is kept
            if not self._admission.keeps_entries(connection):
                return
        session = None
        if connection.identity is not None:
            session = self._session(connection, entry=path)
            if session is None:  # logged there; as a refused write of a process's own
                return
        # The identity's own session, else the agent's: both keep their zk and nodes alike.
        holder = self._sentinel.session if session is None else session
        nodes, zk = holder.nodes, holder.zk
        nodes.put(
            path,
            data,
            prepare=functools.partial(ensure_clients_node, zk, service),
            keep_trying=True,
        )
        # Noted once written, so that its retirement always follows its write: a connection
        # dropped meanwhile (closed is set before its drop forgets what it announced) retires
        # it here.
        with self._lock:
            gone = connection.closed
            if not gone:
                self._announced.setdefault(connection, {})[path] = session
        if gone:
            self._retire(connection, path, session)

    def forget(self, connection: Connection) -> dict[str, IdentitySession | None]:
        """Under the admission's lock, ``connection`` gone: its entries that no connected
        process announced too (to :meth:`retire`), each with the session keeping it."""
        announced = self._announced.pop(connection, {})
        if not announced:
            return {}
        still = {path for paths in self._announced.values() for path in paths}
        return {p: s for p, s in announced.items() if p not in still}

    def retire(self, connection: Connection, entries: dict[str, IdentitySession | None]) -> None:
        """The entries :meth:`forget` gave, retired (on a request worker: this waits on
        ZooKeeper)."""
        for path, session in entries.items():
            self._retire(connection, path, session)

    def _retire(self, connection: Connection, path: str, session: IdentitySession | None) -> None:
        """A departed process's ``/clients`` entry stops counting at once: deleted where its
        session may delete it (an open namespace), else (a secured one lets only the admin
        delete an entry) marked as left, which a rotation ignores, and removed for good when
        the session holding it ends: at once when it was its identity's last process here."""
        # The identity's own session, else the agent's: both keep their zk and nodes alike.
        holder = self._sentinel.session if session is None else session
        nodes, zk = holder.nodes, holder.zk
        if session is not None:
            with self._lock:
                if session.live.get(path) is not connection:
                    return  # announced again since, by a reconnected process
                del session.live[path]
                last = not session.live
                if last:  # nothing else keeps it: its end removes every entry it holds
                    for key, held in list(self._sessions.items()):
                        if held is session:
                            del self._sessions[key]
            if last:
                session.close()
                return
        try:
            nodes.remove(path)
            return
        except NoAuthError:
            pass  # only the admin deletes an entry in a secured namespace
        except Exception as exc:  # the session lost or closing: its end removes them
            log.warning("agent: could not remove %s (%s)", path, type(exc).__name__)
            return
        try:
            data, _ = zk.get(path)
            record = ClientRecord.from_bytes(path.split("/")[2], path.rsplit("/", 1)[1], path, data)
            zk.set(path, replace(record, left=time.time()).to_bytes(path))
        except Exception as exc:  # gone meanwhile, or the session lost: its end removes it
            log.warning("agent: could not mark %s as left (%s)", path, type(exc).__name__)

    # --- what a process may read ------------------------------------------------------------

    def require_readable(self, connection: Connection, service: str) -> None:
        """:class:`AccessDenied` unless the process may read ``service`` (checked once per
        connection and service; loads the service, whose spec names its shard policy)."""
        if service in connection.readable:
            return
        self._sentinel.prefetch(service)
        self._check_readable(connection, service)
        connection.readable.add(service)

    def may_read(self, connection: Connection, service: str) -> bool:
        """Whether the process may read ``service`` (:meth:`require_readable`); a check that
        cannot be made (the service gone, the session down) says no."""
        try:
            self.require_readable(connection, service)
        except (SentinelError, KazooException):
            return False
        return True

    def _check_readable(self, connection: Connection, service: str) -> None:
        """:class:`AccessDenied` unless the process's identity may read every subtree it
        would be served of ``service`` (its node, its metrics, its credential node, its shard
        policy). A subtree that everyone may read costs one ACL read; one that not everyone
        may read is read as the process's identity, on a session of that identity's own
        (kept for the identity's other processes), since ZooKeeper hides the digest hashes in
        an ACL from a session without ADMIN there."""
        snapshot = self._sentinel.session.cache.snapshots.get(service)
        roots = [service_path(service), f"{METRICS}/{service}"]
        if connection.auth_client is not None:
            roots.append(auth_path(service, connection.auth_client))
        if snapshot is not None and snapshot.spec.shard_policy is not None:
            roots.append(policy_path(snapshot.spec.shard_policy))
        for root in roots:
            if not self._readable(connection, root):
                raise AccessDenied(
                    f"service {service!r}: this process's ZooKeeper identity may not read "
                    f"{root} (its ACL), and the agent serves it only what it may read"
                )

    def _readable(self, connection: Connection, path: str) -> bool:
        try:
            entries, _ = self._sentinel.session.zk.get_acls(path)
        except NoNodeError:
            return True  # nothing there to hide
        if any(e.perms & Permissions.READ and e.id.scheme == "world" for e in entries):
            return True
        if connection.identity is None:
            return False
        session = self._session(connection)
        if session is None:
            return False
        try:
            session.zk.get(path)
        except NoAuthError:
            return False
        except NoNodeError:
            return True
        return True

    def _session(self, connection: Connection, entry: str | None = None) -> IdentitySession | None:
        """A session acting as the process's identity for its peer user, made on first need;
        ``entry``: a ``/clients`` path the process keeps on it (which keeps the session from
        eviction while the process lives). None when it does not connect, or when every
        session the bounds allow holds a live process's entry (logged)."""
        assert connection.identity is not None
        key = (connection.uid, connection.identity)
        with self._lock:
            session = self._sessions.get(key)
            if session is not None:
                self._sessions.move_to_end(key)
                if entry is not None:
                    session.live[entry] = connection
                return session
        # Opened outside the lock: the socket loop takes it, and must never wait behind a
        # session's start (two requests may both open one; the second is closed unused).
        session = self._open(connection.identity)
        if session is None:
            return None
        with self._lock:
            chosen, unused = self._sessions.get(key), [session]
            if chosen is None:
                evicted = self._make_room(connection.uid)
                if evicted is not None:
                    self._sessions[key] = chosen = session
                    unused = evicted
            if chosen is not None and entry is not None:
                chosen.live[entry] = connection
        for other in unused:
            other.close()
        if chosen is None:
            telemetry.AGENT_IDENTITIES_REFUSED.inc()
            log.warning(
                "agent: pid %d (uid %d): every identity session this user may hold keeps a live "
                "process's /clients entries; its identity is not served",
                connection.pid,
                connection.uid,
            )
        return chosen

    def _make_room(self, uid: int) -> list[IdentitySession] | None:
        """Under the lock: evict the least recently used idle sessions (holding no live
        process's entry) so that ``uid`` may open one more; the evicted (to close), or None
        when the bounds leave no room."""
        evicted: list[IdentitySession] = []
        for bound, mine in ((MAX_IDENTITY_SESSIONS_PER_PEER, True), (MAX_IDENTITY_SESSIONS, False)):
            held = [k for k in self._sessions if not mine or k[0] == uid]
            if len(held) < bound:
                continue
            idle = next((k for k in held if not self._sessions[k].live), None)
            if idle is None:
                return None
            evicted.append(self._sessions.pop(idle))
        return evicted

    def _open(self, identity: str) -> IdentitySession | None:
        zk = KazooClient(
            hosts=f"{self._sentinel.hosts}{self._sentinel.namespace}",
            **client_arguments(identity, self._sentinel.tls),
        )
        try:
            start_client(zk, self._sentinel.hosts, self._sentinel.connect_timeout)
        except Exception as exc:
            log.warning("agent: no session for a process's identity (%s)", type(exc).__name__)
            with contextlib.suppress(Exception):
                zk.stop()
            zk.close()
            return None
        nodes = EphemeralNodes(zk)
        nodes.start()
        return IdentitySession(zk, nodes)
