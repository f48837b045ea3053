"""One process's ZooKeeper session and what hangs off it: its life cycle, and the seam the
role daemons use.

A :class:`Session` is what a :class:`~sentinel.Sentinel` client stands on: the kazoo client,
the ephemeral nodes it holds, the watches and the watch-driven cache, and their life cycle:
set-up, serving a snapshot while nothing answers, agent mode, renewal in a forked child, and
close. The facade delegates to it and keeps the lookups, the writes and their errors.

It is also the one internal interface the roles built on a client use (the host agent, the
shard manager, the collector, :mod:`sentinel.testing`): ``client.session`` and its attributes
:attr:`~Session.zk`, :attr:`~Session.nodes`, :attr:`~Session.watches` and
:attr:`~Session.cache`, never a private attribute of the client. It is internal: for the roles
shipped with Sentinel, with no promise of stability to applications (which use the facade).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.retry import KazooRetry

from sentinel.agentlink.link import AgentLink
from sentinel.auth import acl
from sentinel.auth.keys import ClientKeyring, PublishedKeys, signer_missing
from sentinel.auth.reader import CredentialReader
from sentinel.auth.store import publish_public_keys
from sentinel.cache import RegistryCache, ServiceSnapshot
from sentinel.cache.config import CacheConfig
from sentinel.cache.snapshot_file import SnapshotWriter, load_snapshot
from sentinel.connection import client_arguments, start_client
from sentinel.errors import (
    AgentUnavailable,
    ClientClosed,
    ClientNotEnrolled,
    DecodeError,
    SentinelError,
    SigningRequired,
    SnapshotRejected,
    ValidationError,
    ZooKeeperUnavailable,
)
from sentinel.publisher import Publisher
from sentinel.registry.layout import SECTIONS, auth_keys_path, sanitize_name
from sentinel.zk import watches as zkwatches
from sentinel.zk.ephemeral import EphemeralNodes
from sentinel.zk.errors import translate
from sentinel.zk.tls import TlsConfig
from sentinel.zk.watches import PersistentWatches

# The life cycle's lines keep the logger they have always had: an application's logging
# configuration names it.
log = logging.getLogger("sentinel.client")

# close(): how long the threads may finish their work on a live session, then how long they
# may take to stop once the session has ended (which fails any read still waiting on it).
_CLOSE_DRAIN_SECONDS = 2.0
_CLOSE_JOIN_SECONDS = 10.0

# kazoo's default reconnect backoff doubles up to an hour: after a long outage a client would
# wait minutes past the ensemble's return. Capped, with kazoo's jitter, it retries every few
# seconds at most, and a fleet's retries stay spread.
RECONNECT_MAX_DELAY = 2.0

#: Told what the facade keeps of the session for its readers, each time it changes: the client
#: id, and the two dicts the hot path reads (the cache's snapshots and shard maps): a new
#: cache's, and empty ones in a forked child until it is renewed.
Mirror = Callable[[str, dict[str, ServiceSnapshot], dict[str, Any]], None]

# Every session of this process, for the at-fork hook; weak, so a dropped client is not kept.
_sessions: weakref.WeakSet[Session] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for session in list(_sessions):
        Session._forked(session)


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True)
class SessionSettings:
    """What a session is made of, each setting resolved and checked once, by the client's
    settings (:class:`~sentinel.settings.ClientSettings`): where the ensemble is, who this
    process is in it, and how its cache follows the registry."""

    hosts: str
    namespace: str
    client_id: str
    connect_timeout: float
    session_timeout: float
    tls: TlsConfig | None
    identity: str | None
    #: The host agent's socket (None: a session of the client's own).
    agent: str | None
    #: The agent's other region this client reads (None: the agent's own).
    agent_region: str | None
    auth_client: str
    require_signed: bool | None
    cache: CacheConfig
    app: str | None
    announce: bool


class Session:
    """One process's ZooKeeper session, its ephemeral nodes, watches and cache.

    Built and driven by :class:`~sentinel.Sentinel` (``client.session``); the role daemons
    reach the registry through these attributes, read as they are used (a forked child's
    renewal replaces each of them):

    - :attr:`zk`: the kazoo client (the session); writes that belong together go in one
      transaction, and nothing may block kazoo's callback thread;
    - :attr:`nodes`: the ephemeral nodes this session holds and re-creates after an expiry;
    - :attr:`watches`: the watches (persistent recursive ones where the server has them);
    - :attr:`cache`: the watch-driven cache, its snapshots and shard maps (immutable values,
      read without a lock) and its hooks (``on_swap``).

    The rest (:meth:`start`, :meth:`close`, :meth:`check_fork`, :meth:`require_writable`...)
    is the life cycle the facade delegates to. Internal: for the roles shipped with Sentinel.
    """

    #: The kazoo client: this process's session (a forked child's own, once renewed).
    zk: KazooClient
    #: The ephemeral nodes this session holds (registrations, ``/clients`` entries).
    nodes: EphemeralNodes
    #: The session's watches (:mod:`sentinel.zk.watches`).
    watches: PersistentWatches
    #: The watch-driven cache (or, in agent mode, the cache the host agent feeds).
    cache: RegistryCache
    #: The publisher of this session's instances.
    publisher: Publisher
    #: The link to the host agent in agent mode, else None.
    agent_link: AgentLink | None

    def __init__(
        self,
        settings: SessionSettings,
        *,
        keyring: ClientKeyring | None,
        credentials: CredentialReader | None,
        mirror: Mirror,
    ) -> None:
        self.hosts = settings.hosts
        self.namespace = settings.namespace
        #: This process's name in ``/clients`` (a forked child's ``<parent id>-<pid>``).
        self.client_id = settings.client_id
        self.connect_timeout = settings.connect_timeout
        self.agent = settings.agent
        #: In agent mode, the other region this client reads through the agent (None: the
        #: agent's own); such a client never opens a session of its own (it never writes).
        self.agent_region = settings.agent_region
        self.auth_client = settings.auth_client
        self.tls = settings.tls
        cache_config = self.cache_config = settings.cache
        self._session_timeout = settings.session_timeout
        self._identity = settings.identity
        self._keyring = keyring
        self._credentials = credentials
        self._require_signed = settings.require_signed
        # What each new cache is made with (a forked child's renewal makes one, with an app).
        self._cache_options: dict[str, Any] = {
            "load_timeout": settings.connect_timeout,
            "negative_ttl": cache_config.negative_ttl,
            "announce": settings.announce,
            "app": settings.app,
            "credentials": credentials,
            "resync_jitter": cache_config.resync_jitter,
            "read_through_rate": cache_config.read_through_rate,
            "curator_base_paths": cache_config.curator_base_paths,
            "events_on_connection_thread": cache_config.events_on_connection_thread,
            "protection": cache_config.mass_loss_protection,
        }
        self._mirror = mirror
        #: Whether the client serves (started, not closed).
        self.started = False
        # Whether this client made (or found) the namespace's sections: its first write does.
        self.namespace_ready = False
        self._lifecycle_lock = threading.Lock()
        self._session_lock = threading.Lock()  # agent mode: one first write opens the session
        self._pid = os.getpid()  # the process whose session this client holds
        #: When this process was forked from the one whose session it holds (None: it was not).
        self.forked_at: float | None = None
        self._new_session()
        _sessions.add(self)
        self._snapshot_writer: SnapshotWriter | None = None
        if cache_config.snapshot_path is not None:
            self._snapshot_writer = SnapshotWriter(
                Path(cache_config.snapshot_path),
                self.cache.snapshots,
                self.cache.shard_maps,
                self.namespace,
                self.hosts,
                cache_config.snapshot_interval,
                None if credentials is None else credentials.highest_versions,
                skip=self.cache.foreign_services,
            )
            self.cache.worker.on_change = self._snapshot_writer.mark_dirty

    @property
    def snapshot_writer(self) -> SnapshotWriter | None:
        """The writer of the snapshot file (``CacheConfig(snapshot_path=...)``), else None."""
        return self._snapshot_writer

    def _new_session(self) -> None:
        """A kazoo client, ephemeral nodes, publisher and cache of this process's own, not
        started (at construction, and in a forked child: see :meth:`_renew_after_fork`)."""
        connection = client_arguments(self._identity, self.tls)
        self.zk = KazooClient(
            hosts=f"{self.hosts}{self.namespace}",
            timeout=self._session_timeout,
            connection_retry=KazooRetry(
                max_tries=-1,
                max_delay=RECONNECT_MAX_DELAY,
                sleep_func=connection["handler"].sleep_func,
            ),
            **connection,
        )
        # Installed with the cache that relies on it: once installed, kazoo keeps its
        # one-shot watches across reconnections too (see sentinel.zk.watches).
        one_shot = not self.cache_config.persistent_watches
        watches = zkwatches.install(self.zk, force_fallback=one_shot)
        self.watches = watches
        self.nodes = EphemeralNodes(self.zk)
        self.publisher = Publisher(self.zk, self.nodes)
        self.agent_link = None
        if self.agent is not None:  # the session above is opened by the first write only
            auth_client = None if self._credentials is None else self.auth_client
            self.agent_link = AgentLink(
                self.agent,
                self.namespace,
                self.client_id,
                auth_client,
                identity=acl.effective_identity(self._identity),
                timeout=self.connect_timeout,
                region=self.agent_region,
            )
        self.cache = RegistryCache(
            self.zk,
            self.client_id,
            self.nodes,
            watches=watches,
            agent=self.agent_link,
            **self._cache_options,
        )
        # The facade's hot path reads these two dicts directly: one attribute lookup less per
        # call. Handed over once the cache is stored, so a concurrent lookup that sees the new
        # snapshots also sees the new cache.
        self._mirror(self.client_id, self.cache.snapshots, self.cache.shard_maps)

    def _forked(self) -> None:
        """The at-fork hook, in the child: arm the renewal of the session, nothing more.

        kazoo is not fork-safe (its threads are gone, its locks may be held, its socket is
        the parent's session), so nothing inherited is called here; no I/O, no thread. The
        hot path's dicts are swapped for empty ones: the child's first lookup misses and
        takes the slow path, which renews (:meth:`check_fork`), and a warm lookup pays
        nothing for this (``os.getpid()`` is a system call, dear beside a warm lookup: its
        cost in docs/decisions/fork-child-gets-its-own-session.md).
        """
        self._lifecycle_lock = threading.Lock()
        self._session_lock = threading.Lock()
        self.forked_at = time.time()
        self._mirror(self.client_id, {}, {})

    def check_fork(self) -> None:
        """In a process other than the one whose session this client holds (a forked child):
        renew the client first. One system call; never on a warm lookup."""
        if self._pid != os.getpid():
            self._renew_after_fork()

    def _renew_after_fork(self, serve: bool = True) -> None:
        """Give a forked child a session of its own, serving the inherited cache meanwhile.

        The inherited kazoo client, ephemeral nodes, publisher and cache are abandoned, never
        closed: closing would end the parent's session. The child gets a client id of its own
        (``<parent id>-<pid>``; the parent's id becomes its ``app`` unless one was given), no
        registrations (the parent's instances stay the parent's) and no snapshot file (the
        parent writes it). A started client serves the inherited snapshots and shard maps,
        marked stale, while it connects in the background; the re-sync on connecting re-reads
        them all and sets its own watches, as after a start from a snapshot file. When they
        are older than ``inherited_max_age`` nothing inherited is served: the services are
        read again on the child's session, and a lookup waits for its service's read. Without
        ``serve`` (a child closing a client it never used) the client is left closed.
        """
        with self._lifecycle_lock:
            if self._pid == os.getpid():  # another thread renewed it meanwhile
                return
            inherited = self.cache
            parent = self.client_id
            self._cache_options["app"] = self._cache_options["app"] or parent
            self.client_id = sanitize_name(f"{parent}-{os.getpid()}")
            self._snapshot_writer = None
            # Until the pid is stored, last, other threads' lookups miss the new (empty) dicts
            # and wait for this lock in check_fork.
            self._new_session()
            self.cache.adopt_listeners(inherited)
            started, self.started = self.started, False
            if started and serve:
                stale_since = inherited.disconnected_at or self.forked_at or time.time()
                limit = self.cache_config.inherited_max_age
                if limit is None or time.time() - stale_since <= limit:
                    # A Curator service is read again on the child's session, not inherited.
                    foreign = inherited.foreign_services()
                    served = {s: v for s, v in inherited.snapshots.items() if s not in foreign}
                    self._serve_restored(served, inherited.shard_maps, stale_since)
                else:  # too old to serve: read afresh, the inherited services first
                    self._serve_restored({}, {}, stale_since)
                    self.cache.prefetch(sorted(inherited.snapshots))
            self.forked_at = None
            self._pid = os.getpid()
        log.info("forked from client %s: this process is client %s", parent, self.client_id)

    @property
    def state(self) -> str:
        """The session's state for a repr: kazoo's, ``not started``, or ``forked, renewed on
        first use``."""
        if self._pid != os.getpid():
            return "forked, renewed on first use"
        return self.zk.state if self.started else "not started"

    def start(self) -> None:
        """Connect (the facade's :meth:`~sentinel.Sentinel.start`; kazoo's errors are
        translated there). Raises ZooKeeperUnavailable (or AgentUnavailable) when nothing
        answers within ``connect_timeout`` and there is no snapshot file to serve."""
        self.check_fork()
        if self.started:
            return
        if self.agent_link is not None:
            self._start_with_agent()
            return
        try:
            self._start_zk()
        except ZooKeeperUnavailable as error:
            with self._lifecycle_lock:
                if not self._serve_snapshot(error):
                    raise
            return
        try:
            self._prepare()
        except BaseException:
            self.zk.stop()
            self.zk.close()
            raise
        self.cache.start()
        self._start_snapshot_writer()
        self.started = True
        log.info("connected to %s%s as %s", self.hosts, self.namespace, self.client_id)

    def _start_with_agent(self) -> None:
        """:meth:`start` in agent mode: connect to the agent (or, when none answers, serve
        the snapshot file while the link keeps trying, as a direct client serves it while
        ZooKeeper does not answer); a client with a key ring not yet published also opens
        its own session, to publish its public keys (a write)."""
        link = self.agent_link
        assert link is not None
        link.start()  # connects in the background from now on; its news wait for the worker
        try:
            link.wait_connected(self.connect_timeout)
        except AgentUnavailable as error:
            with self._lifecycle_lock:  # close() meanwhile finds it whole or not started
                if self._serve_snapshot(error):
                    return
            link.close()
            raise
        self.cache.start()
        try:
            if self._keyring is not None and not self._keys_published_per_agent():
                if self.agent_region is None:
                    self._open_write_session()
                else:
                    self._publish_keys_in_region()
        except BaseException:
            link.close()
            self.cache.close(timeout=0)
            raise
        self._start_snapshot_writer()
        self.started = True
        log.info(
            "serving %s%s from the agent at %s as %s",
            self.hosts,
            self.namespace,
            self.agent,
            self.client_id,
        )

    def _publish_keys_in_region(self) -> None:
        """Agent mode, a client of another region (it reads there through the agent and
        writes nothing): publish its key ring's public keys in that region, so that the
        region's manager can seal credentials to them, on a session of its own closed at once;
        the agent's welcome said they are not there (at most once per ring and region, then).
        When that cannot be done (the region's ensemble not reachable from this host, the
        client not enrolled there...), a warning says why and what follows; the region is
        still read."""
        keyring = self._keyring
        assert keyring is not None  # the caller's condition
        try:
            self._start_zk()
        except (SentinelError, KazooException) as exc:
            self._keys_not_published(translate(exc, "connecting"))
            return
        try:
            publish_public_keys(self.zk, self.auth_client, keyring)
        except (SentinelError, KazooException) as exc:
            self._keys_not_published(translate(exc, "publishing public keys"))
        else:
            log.info("published %s's public keys in region %r", self.auth_client, self.agent_region)
        finally:
            self.zk.stop()
            self.zk.close()

    def _keys_not_published(self, exc: BaseException) -> None:
        log.warning(
            "client %r has no public keys in region %r and could not publish them (%s): "
            "credentials there cannot be sealed to it until they are published (a client of "
            "that region with this key ring publishes them as it starts)",
            self.auth_client,
            self.agent_region,
            exc,
        )

    def _keys_published_per_agent(self) -> bool:
        """Agent mode with a key ring: whether the agent found this ring's public keys
        published for ``auth_client`` (then no session is needed at start), after the same
        signing check :meth:`_prepare` makes, on what the agent read."""
        assert self.agent_link is not None and self._keyring is not None
        welcome = self.agent_link.welcome
        secured = welcome.get("secured")
        if not isinstance(secured, bool):  # the agent could not tell: check on our session
            return False
        self._check_signing(secured=secured)
        keys = welcome.get("keys")
        if not isinstance(keys, str):
            return False
        path = auth_keys_path(self.auth_client)
        try:
            found = PublishedKeys.from_bytes(self.auth_client, path, keys.encode())
        except DecodeError:
            return False
        return found == self._keyring.published(self.auth_client)

    def _open_write_session(self) -> None:
        """Agent mode: the client's own session, for its writes and ephemeral nodes, opened
        by the first write (or at start, with a key ring)."""
        with self._session_lock:
            if self.zk.connected:
                return
            self._start_zk()
            try:
                self._prepare()
            except BaseException:
                self.zk.stop()
                raise

    def _start_zk(self) -> None:
        """Start the session (ZooKeeperUnavailable when no server answers, AuthenticationFailed
        when the login is refused). A missing namespace is reported by the reads that need it
        (NamespaceNotFound) and created by the first write."""
        start_client(self.zk, self.hosts, self.connect_timeout)

    def _prepare(self, serving: bool = False) -> None:
        """Once connected: the signing requirement, this client's public keys (with a key
        ring, which creates the namespace if missing: a write), and the session's ephemeral
        nodes. ``serving``: the client already serves its snapshot, so neither a missing
        signer nor a key slot it may not write can fail :meth:`start` any more: they are
        logged. Without a key ring nothing here writes."""
        try:
            self._check_signing()
        except SigningRequired as exc:
            if not serving or self._credentials is None:
                raise
            log.error("%s; until then every credential is refused", exc)
            self._credentials.refuse_all("refused: the namespace requires signed credentials")
        if self._keyring is not None:
            # Publishing its keys is a write: like a publisher, such a client creates the
            # namespace if it is missing (the manager can then seal credentials to it).
            self._make_sections()
            try:
                publish_public_keys(self.zk, self.auth_client, self._keyring)
            except ClientNotEnrolled as exc:
                if not serving:
                    raise
                log.error("%s; credentials sealed to keys published before still open", exc)
        self.nodes.start()

    def ensure_namespace(self) -> None:
        """Create the namespace and its five sections unless they exist (the facade's
        :meth:`~sentinel.Sentinel.ensure_namespace`)."""
        self.require_started()
        self._make_sections()

    def _make_sections(self) -> None:
        for section in SECTIONS:
            self.zk.ensure_path(section)
        self.namespace_ready = True

    def on_listener_thread(self) -> bool:
        """Whether the calling thread is the cache's worker (a listener runs there)."""
        return self.cache.on_worker()

    def require_writable(self) -> None:
        """Before a write: started (in agent mode with its own session, opened now if it is
        the first write), and the namespace's sections made (once per client)."""
        self.require_started()
        if self.agent_region is not None:
            raise ValidationError(
                f"this client reads region {self.agent_region!r} through the host agent: it "
                "writes nothing there (registrations are regional: write from that region)"
            )
        if self.agent_link is not None and not self.zk.connected:
            self._open_write_session()
        if not self.namespace_ready:
            self.ensure_namespace()

    def require_started(self) -> None:
        """Renew a forked child first; ClientClosed unless the client is started."""
        self.check_fork()
        if not self.started:
            raise ClientClosed("the client is not started: call start() or use 'with Sentinel()'")

    def _check_signing(self, secured: bool | None = None) -> None:
        """A client with a key ring must verify the manager's signatures in a secured
        namespace (unless ``require_signed=False``): SigningRequired otherwise. ``secured``:
        already known (the host agent read it), else read now."""
        reader = self._credentials
        if reader is None or reader.verifies_signatures or self._require_signed is False:
            return
        if secured if secured is not None else acl.is_secured(self.zk):
            raise SigningRequired(
                signer_missing(self.client_id, f"namespace {self.namespace} is secured")
            )

    def _start_snapshot_writer(self) -> None:
        if self._snapshot_writer is not None:
            self._snapshot_writer.start()

    @property
    def staleness(self) -> float:
        """Seconds since the connection was lost (0.0 while connected)."""
        since = self.cache.disconnected_at
        return 0.0 if since is None else max(time.time() - since, 0.0)

    def _serve_snapshot(self, unavailable: ZooKeeperUnavailable) -> bool:
        """No server (or no agent) answered: serve the last-known-good snapshot and connect in
        the background. False when there is no snapshot to serve (the reason is logged).
        Called holding the lifecycle lock (see :meth:`_serve_restored`)."""
        if self._snapshot_writer is None:
            return False
        try:
            restored = load_snapshot(
                self._snapshot_writer.path, self.namespace, self.hosts, self._credentials
            )
        except SnapshotRejected as exc:
            log.warning("%s; not serving it", exc)
            return False
        self._serve_restored(restored.snapshots, restored.shard_maps, restored.written_at)
        log.warning(
            "%s; serving the snapshot %s written %.0fs ago (%d services) until it connects",
            unavailable,
            self._snapshot_writer.path,
            self.staleness,
            len(restored.snapshots),
        )
        return True

    def _serve_restored(
        self,
        snapshots: Mapping[str, ServiceSnapshot],
        shard_maps: Mapping[str, Any],
        stale_since: float,
    ) -> None:
        """Serve a state from elsewhere (a snapshot file, a parent process), marked stale
        since ``stale_since``, and connect in the background; the re-sync replaces it.

        Called holding the lifecycle lock: kazoo's start_async() builds the connection's
        sockets in steps and a stop() in between finds them half made, so close() waits for
        it. Begun here, a load queued from now on waits for the connection rather than
        failing on a client that is not connecting yet.
        """
        self.cache.restore(snapshots, shard_maps, stale_since)
        self.cache.start()
        self.started = True
        if self.agent_link is not None:
            return  # the link connects in the background, and the re-sync follows
        live = self.zk.start_async()
        threading.Thread(
            target=self._connect_later, args=(live,), name="sentinel-connect", daemon=True
        ).start()

    def start_connecting(self) -> None:
        """Start without waiting for a server: serve nothing, marked stale, and connect in
        the background (the host agent's session to another region, opened when a process
        first needs it: a region that does not answer never holds the agent up)."""
        self.check_fork()
        with self._lifecycle_lock:
            if not self.started:
                self._serve_restored({}, {}, time.time())

    def _connect_later(self, live: threading.Event) -> None:
        """While serving a snapshot: let kazoo keep connecting, then finish :meth:`start`."""
        while self.started:
            if not live.wait(0.2):
                continue
            try:
                # Under the lock, so a close() meanwhile either comes after the threads this
                # starts (and joins them) or before (and they never start).
                with self._lifecycle_lock:
                    if not self.started:
                        return
                    self._prepare(serving=True)
                    self._start_snapshot_writer()
            except Exception as exc:  # the connection dropped again: wait for the next one
                log.info("finishing the start failed (%s); retrying", exc)
                time.sleep(0.2)
                continue
            log.info("connected to %s%s; re-syncing the snapshot", self.hosts, self.namespace)
            return

    def close(self) -> bool:
        """End the session (the facade's :meth:`~sentinel.Sentinel.close`); True when this
        call closed it, False when it was closed already (or never started)."""
        if self._pid != os.getpid():
            self._renew_after_fork(serve=False)
        with self._lifecycle_lock:  # checked and set at once: one of two close() calls closes
            if not self.started:
                return False
            self.started = False
        # The session ends whatever stopping a thread raises: a second close() finds the
        # client closed and returns, so this one is the only chance. The threads finish what
        # they were given while the session serves them; one waiting on a session that cannot
        # reconnect (a partition, a server gone) would wait forever, so that wait is bounded
        # (and skipped while disconnected), and the session's end fails what still waits on
        # it before the threads are joined.
        drain = _CLOSE_DRAIN_SECONDS if self.cache.connection_state == "connected" else 0.0
        drain_until = time.monotonic() + drain
        try:
            self.publisher.close()  # no status write of a readiness check from here on
            if drain:  # shutting down is deregistering: marked, never protected from
                self.publisher.leave(timeout=drain)
            self.cache.close(timeout=max(0.0, drain_until - time.monotonic()))
            if self._snapshot_writer is not None:
                self._snapshot_writer.close()
            # Emptied, a lookup falls through to the load, which refuses on a closed client.
            self.cache.snapshots.clear()
            self.cache.shard_maps.clear()
            self.nodes.close(timeout=max(0.0, drain_until - time.monotonic()))
        finally:
            if self.agent_link is not None:
                self.agent_link.close()
            self.zk.stop()
            self.zk.close()
            for name, join in (("cache", self.cache.worker.join), ("ephemeral", self.nodes.join)):
                if not join(_CLOSE_JOIN_SECONDS):
                    log.warning("the %s thread did not stop after the session ended", name)
        return True

    @property
    def session_id(self) -> int | None:
        """The current ZooKeeper session id, None while not connected."""
        self.check_fork()
        return self.zk.client_id[0] if self.started and self.zk.client_id else None
