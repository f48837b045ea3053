"""The client's view of the registry: the snapshots and shard maps lookups read, kept current
by one follower, served on one worker thread.

Readers never lock: a service's state is one immutable
:class:`~sentinel.cache.views.ServiceSnapshot`, replaced by a single dict store when anything
changes; directory shard maps are one flat dict updated a key at a time (see
:class:`~sentinel.shards.maps.DirectoryMap` for why). All loading and updating happens on the
worker (:mod:`sentinel.cache.worker`), which runs what the follower queued
(:mod:`sentinel.cache.followers`), swaps the new state in and tells the listeners.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import ConnectionLoss, KazooException, NoAuthError

from sentinel.auth.acl import ensure_clients_node, is_secured
from sentinel.auth.envelope import Credential
from sentinel.auth.reader import CredentialReader
from sentinel.cache.agent import AgentChannel, AgentFollower
from sentinel.cache.curator import CuratorFollower
from sentinel.cache.followers import OneShotFollower, PersistentFollower
from sentinel.cache.listeners import Listener, Listeners
from sentinel.cache.protection import MassLossProtection, Protection, Timers
from sentinel.cache.read_through import ReadThrough
from sentinel.cache.return_home import ReturnHome
from sentinel.cache.source import Follower
from sentinel.cache.stats import CacheStats
from sentinel.cache.views import ServiceSnapshot, endpoint_events
from sentinel.cache.worker import CacheWorker, Task
from sentinel.errors import ClientClosed, RegistryError, ServiceNotFound, ZooKeeperUnavailable
from sentinel.events import (
    AuthChanged,
    ChangeEvent,
    ConnectionChanged,
    InstancesChanged,
    ServiceSpecChanged,
    ShardKeysChanged,
)
from sentinel.registry.layout import client_path
from sentinel.registry.records import ClientRecord
from sentinel.shards.maps import ShardMap
from sentinel.telemetry import auth_version_applied, auth_version_forgotten
from sentinel.version import __version__
from sentinel.zk.ephemeral import EphemeralNodes
from sentinel.zk.errors import CONNECTION_ERRORS, translate
from sentinel.zk.watches import PersistentWatches

log = logging.getLogger(__name__)

# Services a prefetch of many loads in one worker task, their requests in flight together
# (about four nodes each: a multi-read of MULTI_READ_BATCH); the worker serves watch events
# between two such tasks.
LOADS_IN_FLIGHT = 64

SwapHook = Callable[[str, ServiceSnapshot, ServiceSnapshot | None, Collection[str] | None], None]


class RegistryCache:
    """The client's view of the registry, loaded per service on first use."""

    def __init__(
        self,
        zk: KazooClient,
        client_id: str,
        nodes: EphemeralNodes,
        *,
        load_timeout: float = 10.0,
        negative_ttl: float = 1.0,
        negative_size: int = 10_000,
        announce: bool = True,
        app: str | None = None,
        credentials: CredentialReader | None = None,
        resync_jitter: float = 0.5,
        read_through_rate: float = 100.0,
        watches: PersistentWatches | None = None,
        curator_base_paths: Sequence[str] = (),
        agent: AgentChannel | None = None,
        events_on_connection_thread: bool = True,
        protection: MassLossProtection | None = None,
    ) -> None:
        self._zk = zk
        self._watches = watches
        self._events_on_connection_thread = events_on_connection_thread
        self._curator_base_paths = tuple(curator_base_paths)
        self._curator: CuratorFollower | None = None  # made with the persistent follower
        self._credentials = credentials
        self._client_id = client_id
        self._nodes = nodes
        self._load_timeout = load_timeout
        self._announce = announce
        self._app = app
        self._announced_at: dict[str, float] = {}
        # Read without a lock by the hot path; written only by the worker.
        self.snapshots: dict[str, ServiceSnapshot] = {}
        self.shard_maps: dict[str, ShardMap | None] = {}
        self._policy_users: dict[str, set[str]] = {}
        self.stats = CacheStats()
        self.listeners = Listeners()
        # The worker's own requests fail at once while disconnected rather than wait for the
        # connection: the news of the connection itself is queued behind them.
        not_waiting = functools.partial(self._waiting_for_connection, False)
        self.worker = CacheWorker(self._resync, resync_jitter, around=not_waiting)
        self._loads_waiting: list[tuple[str, Future[ServiceSnapshot]]] = []  # worker only
        self._agent = agent
        self._announced_on = 1  # the agent connection this client's /clients entries are on
        self._follower: Follower | None = None  # chosen on first use, once per session
        self.read_through = ReadThrough(
            zk,
            self.shard_maps,
            self.stats,
            rate=read_through_rate,
            negative_ttl=negative_ttl,
            negative_size=negative_size,
        ).partition
        if agent is not None:  # the host agent's session follows, and reads through
            follower = AgentFollower(self, agent, credentials)
            self._follower, self.read_through = follower, follower.partition
            agent.on_state = self.connection_changed
        self.connection_state = "connected"
        self.disconnected_at: float | None = None
        # Services restore() served and no re-sync has re-read yet: stale, and not yet in
        # /clients under this client's id (the re-sync announces them).
        self._restored: frozenset[str] = frozenset()
        self._state_lock = threading.Lock()  # held for assignments only (kazoo's thread takes it)
        #: Called on the worker with every replaced snapshot, before the listeners hear of it:
        #: ``(service, old, new, names)``, ``new`` None when the service is dropped, ``names``
        #: the only instances or metrics nodes that may have changed (None: any). The host
        #: agent tells its processes what changed from it (:mod:`sentinel.agent.changes`).
        self.on_swap: SwapHook | None = None
        # Protection from mass loss (None: off); its hold ends are queued on the worker.
        self._hold_timers = Timers(self._wake_protection)
        #: The partitions served from another region and their hold-downs (a failover's
        #: return home, :mod:`sentinel.cache.return_home`); its ends are queued on the worker.
        self._return_timers = Timers(self._wake_protection)
        self.return_home = ReturnHome(self._return_timers.wake)
        self.protection = (
            None
            if protection is None
            else Protection(protection, self.stats, self._hold_timers.wake)
        )

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker and follow the connection state (the agent's, in agent mode)."""
        if self._agent is not None:
            self._agent.start()  # unless started already (the client's start)
        else:
            self._zk.add_listener(self._on_state)
        self.worker.start()

    def close(self, timeout: float | None = None) -> bool:
        """Stop the worker once it has run the tasks queued so far, waiting ``timeout``
        seconds at most (see :meth:`CacheWorker.stop`); whether it has stopped. A reader
        waiting for a load dropped meanwhile hears so at once rather than at its timeout."""
        self._zk.remove_listener(self._on_state)
        self._hold_timers.close()
        self._return_timers.close()
        stopped = self.worker.stop(self._dropped, timeout)
        if stopped:
            waiting, self._loads_waiting = self._loads_waiting, []
            for _, future in waiting:
                future.set_exception(ClientClosed("the client was closed"))
        return stopped

    def _dropped(self, task: Task) -> None:
        if task.run == self._serve_load:
            task.args[1].set_exception(ClientClosed("the client was closed"))
        elif task.run == self._serve_loads:
            for future in task.args[1]:
                future.set_exception(ClientClosed("the client was closed"))

    def on_worker(self) -> bool:
        """Whether the calling thread is the worker (a listener, or a task, is running)."""
        return self.worker.on_worker()

    @property
    def persistent(self) -> bool:
        """Whether the cache follows ZooKeeper with persistent recursive watches."""
        if self._follower is not None:
            return self._follower.persistent
        return self._watches is not None and self._watches.supported

    # --- called by readers ------------------------------------------------------------------

    def load(self, service: str, loading: Future[ServiceSnapshot] | None = None) -> ServiceSnapshot:
        """The snapshot of ``service``, loading it on the worker the first time (``loading``:
        its load queued already, by :meth:`load_many`).

        On the worker itself (a lookup made from a listener) the load runs there and then:
        queued, it would wait behind the listener that waits for it.
        """
        future: Future[ServiceSnapshot] = Future() if loading is None else loading
        if loading is None and self.on_worker():
            self._serve_load(service, future)
            return future.result()
        if loading is None:
            self.worker.put(Task(self._serve_load, (service, future, True)))
        try:
            return future.result(timeout=self._load_timeout)
        except FutureTimeout:
            raise ZooKeeperUnavailable(
                f"loading service {service!r} took longer than {self._load_timeout:g}s"
            ) from None

    def load_many(self, services: Sequence[str]) -> dict[str, Future[ServiceSnapshot]]:
        """Queue the loads of ``services`` on the worker, LOADS_IN_FLIGHT to a task (their
        requests in flight together: :meth:`Follower.load_services`), and return their
        futures for :meth:`load` to wait on (never on the worker itself: queued, they would
        wait behind the listener that waits for them)."""
        loading: dict[str, Future[ServiceSnapshot]] = {s: Future() for s in services}
        names = list(loading)
        for start in range(0, len(names), LOADS_IN_FLIGHT):
            batch = tuple(names[start : start + LOADS_IN_FLIGHT])
            self.worker.put(Task(self._serve_loads, (batch, tuple(loading[s] for s in batch))))
        return loading

    def prefetch(self, services: list[str]) -> None:
        """Load ``services`` on the worker, in the background (a forked child re-reading what
        its parent followed); a lookup meanwhile waits for its own service's load."""
        self.load_many(services)

    def restore(
        self,
        snapshots: Mapping[str, ServiceSnapshot],
        shard_maps: Mapping[str, ShardMap | None],
        written_at: float,
    ) -> None:
        """Serve a last-known-good state (call before :meth:`start`) until a connection
        re-syncs it; ``staleness`` counts from when it was written."""
        self.shard_maps.update(shard_maps)
        self.snapshots.update(snapshots)
        self.connection_state = "snapshot"
        self.disconnected_at = written_at
        self._restored = frozenset(snapshots)

    def adopt_listeners(self, inherited: RegistryCache) -> None:
        """Deliver to ``inherited``'s listeners (call before :meth:`start`): a forked child's
        new cache keeps the listeners the application added in the parent."""
        self.listeners.adopt(inherited.listeners)

    def listen(self, service: str | None, listener: Listener) -> Callable[[], None]:
        """Add a listener for ``service`` (None: every service); returns its remover."""
        return self.listeners.add(service, listener)

    # --- kazoo's thread ---------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        self.connection_changed(state)

    def connection_changed(self, state: str, since: float | None = None) -> None:
        """The session now is in kazoo's ``state``: serve stale, or re-sync. ``since``: when
        it was cut off, if earlier than now (the host agent's own session). On kazoo's
        thread, or the agent link's: nothing here waits."""
        now = time.time() if since is None else since
        reached = {KazooState.CONNECTED: "connected", KazooState.SUSPENDED: "suspended"}
        reached_state = reached.get(state, "lost")
        events = self.stats.session_events
        events[reached_state] = events.get(reached_state, 0) + 1
        with self._state_lock:
            if state == KazooState.CONNECTED and self._restored:
                # Still serving a restored state: stale until the re-sync has re-read it.
                self.worker.put(Task(self.worker.schedule_resync))
                self.worker.put(Task(self._retry_loads))
                return
            self.connection_state = reached_state
            if state == KazooState.CONNECTED:
                self.disconnected_at = None
            elif self.disconnected_at is None:
                self.disconnected_at = now
        # Listeners hear of the connection first, then of what the re-sync found.
        event = ConnectionChanged(reached_state, now)
        self.worker.put(Task(self._emit, (None, event), changes_cache=False))
        if state == KazooState.CONNECTED:
            self.worker.put(Task(self.worker.schedule_resync))
            self.worker.put(Task(self._retry_loads))

    # --- the worker -------------------------------------------------------------------------

    def _follower_now(self) -> Follower:
        """This session's follower, chosen on first use once the server has said whether it
        has ZooKeeper 3.6's watches (the connection learns it before any request)."""
        if self._follower is None:
            watches = self._watches
            # A client still connecting (a forked child's first load) waits for it to tell.
            supported = False if watches is None else watches.wait_supported(self._load_timeout)
            if supported is None:
                raise ConnectionLoss("not connected yet: the server's watch mode is not known")
            # A secured namespace serves ephemeral instance nodes only (a persistent one was
            # planted); read once, with the follower (docs/decisions/secured-namespaces-serve-
            # ephemeral-instances.md).
            try:
                secured = is_secured(self._zk)
            except NoAuthError:  # a root nobody unidentified may read is nobody's to write
                secured = True
            if supported:
                self._follower = PersistentFollower(
                    self,
                    self._zk,
                    self._credentials,
                    watches,
                    at_once=self._events_on_connection_thread,
                    secured=secured,
                )
                self._curator = CuratorFollower(
                    self, watches, self._curator_base_paths, secured=secured
                )
            else:
                self._follower = OneShotFollower(self, self._zk, self._credentials, secured=secured)
        return self._follower

    def _curator_now(self) -> CuratorFollower:
        """The follower of Curator base paths, made with the session's follower; there is
        none without ZooKeeper 3.6's watches."""
        self._follower_now()
        if self._curator is None:
            raise RegistryError(
                "Curator registries are followed with ZooKeeper 3.6's persistent watches, and "
                "this client has none (an older server, or "
                "CacheConfig(persistent_watches=False))"
            )
        return self._curator

    def _load_service(
        self, service: str, loaded: ServiceSnapshot | Exception | None = None
    ) -> ServiceSnapshot:
        """The namespace's service of that name (with a Curator registry's instances when its
        spec names one), else the first Curator base path's. ``loaded``: what the follower's
        load of it gave already (:meth:`_serve_loads`)."""
        follower = self._follower_now()
        try:
            if loaded is None:
                loaded = follower.load_service(service)
            if isinstance(loaded, Exception):
                raise loaded
            snapshot = loaded
        except ServiceNotFound:
            if not self._curator_base_paths or follower.complete:
                raise
            return self._curator_now().load_service(service)
        if snapshot.spec.curator is not None and not follower.complete:
            snapshot = self._curator_now().attach(service, snapshot)
        return snapshot

    def native_services(self) -> list[str]:
        """The services the namespace's follower feeds: every one whose spec the namespace
        holds (of those naming a Curator registry, all but the instances)."""
        unlisted = self.unlisted()
        return [service for service in self.snapshots if service not in unlisted]

    def unlisted(self) -> frozenset[str]:
        """The services the namespace holds no spec of (a Curator base path's alone): no
        ``/clients`` entry is kept for one, as there is no credential of it to rotate."""
        return self._curator.unlisted if self._curator is not None else frozenset()

    def foreign_services(self) -> frozenset[str]:
        """The services whose instances are read from Curator registries: not in the snapshot
        file, and not served by a forked child before its own session has read them."""
        return self._curator.services if self._curator is not None else frozenset()

    def _serve_loads(
        self, services: tuple[str, ...], futures: tuple[Future[ServiceSnapshot], ...]
    ) -> None:
        """:meth:`load_many`'s task: the services not cached loaded together by the follower,
        then each served as :meth:`_serve_load` serves one (a load the follower could not
        make together is made there on its own)."""
        futures_of = dict(zip(services, futures, strict=True))
        wanted = [service for service in services if service not in self.snapshots]
        with contextlib.suppress(Exception):  # e.g. the connection went: each on its own
            loading = self._follower_now().load_services(wanted) if wanted else iter(())
            for service, loaded in zip(wanted, loading, strict=True):
                self._serve_load(service, futures_of.pop(service), True, loaded)
        for service, future in futures_of.items():
            self._serve_load(service, future, True)

    def _serve_load(
        self,
        service: str,
        future: Future[ServiceSnapshot],
        queued: bool = False,
        loaded: ServiceSnapshot | Exception | None = None,
    ) -> None:
        """A reader's :meth:`load`: the cached snapshot, or the service loaded now (or as the
        follower's ``loaded`` it). A ``queued`` load the lost connection stopped runs again
        once connected (its reader waits, up to its timeout); one made from a listener fails
        at once."""
        try:
            snapshot = self.snapshots.get(service)
            if snapshot is None:
                snapshot = self._load_service(service, loaded)
                self._confirm(service, snapshot.auth)
                self.snapshots[service] = snapshot
            future.set_result(snapshot)
        except Exception as exc:
            error = translate(exc, f"loading service {service!r}")
            if queued and isinstance(error, ZooKeeperUnavailable) and not self._connected():
                self._loads_waiting.append((service, future))
                return
            future.set_exception(error)

    def _retry_loads(self) -> None:
        """Connected again: the loads the lost connection stopped."""
        waiting, self._loads_waiting = self._loads_waiting, []
        for service, future in waiting:
            self._serve_load(service, future, True)

    def _connected(self) -> bool:
        """Whether the session (the agent's, in agent mode) is connected now."""
        if self._agent is not None:
            return self._agent.connected
        return self._zk.state == KazooState.CONNECTED

    def _waiting_for_connection(self, wait: bool) -> AbstractContextManager[object]:
        """Whether the calling thread's requests wait for a connection while there is none
        (see :meth:`PersistentWatches.waiting_for_connection`)."""
        if self._watches is None:
            return contextlib.nullcontext()
        return self._watches.waiting_for_connection(wait)

    def _resync(self) -> None:
        """After a reconnection: the follower brings everything up to date; the first one
        after :meth:`restore` ends the restored state."""
        self._follower_now().resync()
        if self._curator is not None:
            self._curator.resync()
        self.stats.resyncs += 1
        if self._agent is not None and self._agent.connections != self._announced_on:
            # A new connection to the agent: the /clients entries it kept went with the old.
            self._announced_on = self._agent.connections
            for service in self.native_services():
                self._confirm(service, self.snapshots[service].auth)
        if self._restored:
            self._end_restored()

    def _end_restored(self) -> None:
        """The first re-sync after :meth:`restore` is done: announce the services restored
        (this client uses them, with their credential applied) and stop marking them stale."""
        for service in sorted(self._restored & self.snapshots.keys()):
            self._confirm(service, self.snapshots[service].auth)
        with self._state_lock:
            self._restored = frozenset()
            if not self._connected():
                return  # lost again meanwhile: connection_changed has said so
            self.connection_state = "connected"
            self.disconnected_at = None
        self._emit(None, ConnectionChanged("connected", time.time()))

    def _emit(self, service: str | None, event: ChangeEvent) -> None:
        with self._waiting_for_connection(True):  # the application's code: kazoo's way
            self.listeners.emit(service, event)

    # --- what the follower hands in, on the worker (see sentinel.cache.source) ----------------

    def swap(
        self,
        service: str,
        snapshot: ServiceSnapshot,
        names: Collection[str] | None = None,
        lost: Collection[str] = (),
    ) -> None:
        """Serve ``snapshot`` and tell the listeners what changed; ``names``: the only
        instances that may have (None: any); ``lost``: instances gone unmarked (see
        :mod:`sentinel.cache.protection`). Listeners hear the registry as it is: a protected
        instance is reported removed when it leaves the registry."""
        old = self.snapshots[service]
        moved = old.spec != snapshot.spec and (old.spec.curator or snapshot.spec.curator)
        if moved and not self._follower_now().complete:
            # Curator instances are decoded with their spec (its partition_from, scheme).
            snapshot, names = self._instances_read_again(service, old, snapshot), None
        if self.protection is not None:
            snapshot = self.protection.apply(service, old, snapshot, lost)
        rule = snapshot.spec.failover
        if rule != old.spec.failover:  # a held partition waits as the rule now says, or not
            self.return_home.rule_changed(
                service, None if rule is None or rule.local_only else rule.return_after
            )
        snapshot = self.return_home.apply(service, snapshot)
        self.snapshots[service] = snapshot
        # On the worker at once; after a task run off it (CacheWorker.run_now), on it next.
        self.worker.later(self._tell, service, old, snapshot, names)

    def _tell(
        self,
        service: str,
        old: ServiceSnapshot,
        snapshot: ServiceSnapshot,
        names: Collection[str] | None,
    ) -> None:
        """After a swap, on the worker: the listeners, the agent's hook and ``/clients``."""
        if bool(snapshot.protected) != bool(old.protected):
            # Operators see it (sentinel ls, doctor): one write when an episode begins and
            # one when it ends, never per change within it.
            self._confirm(service, snapshot.auth)
        if self.on_swap is not None:
            self.on_swap(service, old, snapshot, names)
        if old.spec != snapshot.spec:
            self._emit(service, ServiceSpecChanged(service, old.spec, snapshot.spec))
        before, after = old.endpoints, snapshot.endpoints
        if names is not None:  # a diff of what was touched, not of the whole service
            before = {n: before[n] for n in names if n in before}
            after = {n: after[n] for n in names if n in after}
        for event in endpoint_events(service, before, after):
            self._emit(service, event)
        if old.auth != snapshot.auth:
            versions = [None if a is None else a.version for a in (old.auth, snapshot.auth)]
            self._emit(service, AuthChanged(service, *versions, snapshot.auth))
            # Confirmed only now that the listeners (the application's pools) have it.
            self._confirm(service, snapshot.auth)

    def serves_at_once(self, service: str, lost: bool) -> bool:
        """Whether a change of ``service``'s instances or metrics may be served off the worker
        (:meth:`CacheWorker.run_now`, on kazoo's thread): whether serving it builds its
        snapshot and nothing more (no timer started, no write). Not while instances are
        protected or partitions held, nor for a loss protection from mass loss counts
        (``lost``: an instance gone without its departure mark)."""
        current = self.snapshots.get(service)
        if current is None or current.protected or current.held:
            return False
        if self.return_home.holds(service) or current.spec.curator is not None:
            return False
        protection = self.protection
        return (
            protection is None
            or not current.spec.mark_departures
            or not (lost or protection.counting(service))
        )

    def _instances_read_again(
        self, service: str, old: ServiceSnapshot, snapshot: ServiceSnapshot
    ) -> ServiceSnapshot:
        """``snapshot`` with its instances read as its new spec says: from the Curator
        registry it names, or from the namespace again."""
        if self._curator is not None:
            self._curator.detach(service)
        if snapshot.spec.curator is None:
            fresh = self._follower_now().load_service(service)
            return snapshot.rebuilt(endpoints=fresh.endpoints, invalid=fresh.invalid)
        invalid = snapshot.invalid
        if old.spec.curator is not None:  # the old registry's unreadable nodes go with it
            below = f"{old.spec.curator.parent(service)}/"
            invalid = frozenset(path for path in invalid if not path.startswith(below))
        return self._curator_now().attach(service, snapshot.rebuilt(endpoints={}, invalid=invalid))

    def update(
        self,
        service: str,
        current: ServiceSnapshot,
        field: str,
        changes: Mapping[str, Any],
        invalid: frozenset[str],
        lost: Collection[str] = (),
    ) -> None:
        """Serve ``current`` with a few children of one section (``field``) replaced, None
        for removed; nothing when that changes nothing. ``lost``: as :meth:`swap`'s."""
        snapshot = current.updated(invalid, **{field: changes})
        if snapshot is not current:
            self.swap(service, snapshot, changes, lost)

    def forget(self, service: str) -> None:
        """Stop following ``service`` (its watches, or the agent's frames) and serving it, in
        the background (on the worker): nothing needs it here any more. Its listeners hear it
        gone as for a removed service; a later lookup loads it again."""
        self.worker.put(Task(self._forget, (service,)))

    def _forget(self, service: str) -> None:
        if service in self.snapshots:
            self._follower_now().forget(service)
            self.drop(service)

    def drop(self, service: str) -> None:
        """Stop serving ``service``: its listeners hear that it and its instances are gone."""
        old = self.snapshots.pop(service, None)
        if self.protection is not None:
            self.protection.forget(service)
        if self._credentials is not None:  # its decrypted credential, not its version's floor
            self._credentials.forget(service)
            auth_version_forgotten(service)
        self.return_home.forget(service)
        if self._curator is not None:
            self._curator.detach(service)
        self._unannounce(service)
        if old is None:
            return
        if self.on_swap is not None:
            self.on_swap(service, old, None, None)
        self._emit(service, ServiceSpecChanged(service, old.spec, None))
        if old.endpoints:
            self._emit(service, InstancesChanged(service, removed=tuple(old.endpoints.values())))

    def _unannounce(self, service: str) -> None:
        """This client no longer uses ``service``: its ``/clients`` entry goes. Kept, it would
        be written again after every session expiry (and with it the ``/clients`` node of a
        service retired meanwhile), and what is kept of it would grow with every service ever
        followed. Bookkeeping never fails the caller: a delete the connection cut is logged,
        and the node goes with the session."""
        self._announced_at.pop(service, None)
        if self._agent is not None:  # the agent's entry, kept while this process is connected
            return
        try:
            self._nodes.remove(client_path(service, self._client_id))
        except (KazooException, *CONNECTION_ERRORS) as exc:
            log.info("%s: this client's /clients entry not deleted (%r)", service, exc)

    def _wake_protection(self, service: str) -> None:
        """A hold or a window ended (a timer's thread): re-apply the protection and the return
        home's hold-down on the worker."""
        self.worker.merge(Task(self._reapply_protection, (service,)))

    def _reapply_protection(self, service: str) -> None:
        current = self.snapshots.get(service)
        if current is not None:
            self.swap(service, current, ())

    def add_policy_user(self, policy: str, service: str) -> None:
        """``service`` is sharded by ``policy``: its listeners hear of the policy's keys."""
        self._policy_users.setdefault(policy, set()).add(service)

    def set_shard_map(
        self, policy: str, shard_map: ShardMap | None, changes: dict[str, tuple[Any, Any]]
    ) -> None:
        """Serve ``shard_map`` (None: the policy does not exist) and tell of ``changes``."""
        self.shard_maps[policy] = shard_map
        if changes:
            self.emit_keys(policy, changes)

    def emit_keys(self, policy: str, changes: dict[str, tuple[Any, Any]]) -> None:
        """Tell the users of ``policy`` which keys moved."""
        for service in sorted(self._policy_users.get(policy, ())):
            self._emit(service, ShardKeysChanged(service, policy, changes))

    # --- /clients -----------------------------------------------------------------------------

    def _confirm(self, service: str, auth: Credential | None) -> None:
        """Say that this client uses ``service`` with ``auth`` applied: in its ``/clients``
        node (which a rotation waits on, Procedure 2) and in its telemetry. A Curator service
        has no ``/clients`` node, and a reader never makes one."""
        if self._announce and service not in self.unlisted():
            self._register_client(service, auth)
        if auth is not None:
            auth_version_applied(service, auth.version)

    def _register_client(self, service: str, auth: Credential | None) -> None:
        """``/clients/<service>/<client_id>``: who uses the service, kept across sessions.

        Bookkeeping must never fail a lookup: a write refused (a secured namespace whose
        ``/clients/<service>`` is missing or shut) is logged once and retried in the
        background (:meth:`EphemeralNodes.put` with ``keep_trying``).
        """
        path = client_path(service, self._client_id)
        record = ClientRecord(
            service=service,
            client_id=self._client_id,
            app=self._app,
            host=socket.gethostname(),
            pid=os.getpid(),
            # When it began to use the service; confirmations of new credentials keep it.
            started=self._announced_at.setdefault(service, time.time()),
            sentinel_version=__version__,
            auth_client=None if self._credentials is None else self._credentials.client,
            auth_version=None if auth is None else auth.version,
            **self._protecting(service),
        )
        if self._agent is not None:  # kept by the agent while this process is connected
            self._agent.send(
                {"op": "announce", "service": service, "record": record.to_bytes(path).decode()}
            )
            return
        self._nodes.put(
            path,
            record.to_bytes(path),
            prepare=functools.partial(ensure_clients_node, self._zk, service),
            keep_trying=True,
            on_failure=self._count_clients_failure,
        )

    def _protecting(self, service: str) -> dict[str, Any]:
        """The ``/clients`` fields saying what ``service``'s snapshot serves protected."""
        snapshot = self.snapshots.get(service)
        if snapshot is None or not snapshot.protected:
            return {}
        since = min(e.unlisted_since or 0.0 for e in snapshot.protected.values())
        return {"protecting": len(snapshot.protected), "protecting_since": since}

    def _count_clients_failure(self) -> None:
        self.stats.clients_write_failures += 1
