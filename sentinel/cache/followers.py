"""How a cache follows ZooKeeper: one follower per watch mode, chosen once per session.

* :class:`PersistentFollower` (ZooKeeper 3.6+, the default): one persistent recursive watch per
  followed subtree (a service's node and instances, its metrics, this client's credential
  node, a shard policy and its buckets), added before the subtree is read with multi-reads.
  Events are applied from their path: a deletion drops the node with no read, a creation or
  change reads that one node. The watches are kept across reconnections within the session,
  and the server reports what changed while the connection was down (the follower hands it
  the paths the cache holds), so an unchanged client reads nothing after a reconnection. A
  session's end takes the watches with it: each subtree is followed and read again.
* :class:`OneShotFollower` (older servers, or ``CacheConfig(persistent_watches=False)``):
  kazoo's watches, set again by each read; kazoo drops them all when the connection is
  suspended, so each reconnection re-syncs by re-reading everything the cache holds.

Both name a watch event's work by the node's path alone (a :class:`~sentinel.cache.worker.Task`,
so repeated events merge), read through the same :class:`~sentinel.cache.reads.ServiceReads`,
and hand what they read to the cache (:class:`~sentinel.cache.source.FollowedCache`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Concatenate, ParamSpec

from kazoo.client import KazooClient
from kazoo.exceptions import NoWatcherError
from kazoo.protocol.states import EventType, WatchedEvent

from sentinel.auth.reader import CredentialReader
from sentinel.cache.reads import Reply, ServiceReads, Watch, section_of
from sentinel.cache.source import FollowedCache, load_each
from sentinel.cache.views import ServiceSnapshot, directory_keys, key_changes
from sentinel.cache.worker import CacheWorker, Task
from sentinel.errors import DecodeError, ServiceNotFound
from sentinel.registry.layout import (
    AUTH,
    METRICS,
    SERVICES,
    SHARD_INFO,
    auth_path,
    departed_instance,
    service_path,
)
from sentinel.registry.reads import pipelined_reads
from sentinel.shards.maps import DirectoryMap, ShardMap, new_map
from sentinel.shards.spec import bucket_path, policy_path
from sentinel.zk.watches import AddWatchMode, PersistentWatches, WatcherType

# Nodes per multi-read: a reply of a few hundred KB at most for registry-sized nodes.
MULTI_READ_BATCH = 256

# Children read ahead for a prefetch's services at most (PersistentFollower.load_services):
# a few multi-reads before the first service is handed over, not one per child of all of them.
READ_AHEAD = 4 * MULTI_READ_BATCH

_SECTIONS = {SERVICES[1:]: "instances", METRICS[1:]: "metrics"}

# The kind of a deletion its owner's departure mark announced (beside kazoo's EventType
# values): a deregistration, which protection from mass loss never holds back.
DEREGISTERED = "DEREGISTERED"
_MAX_DEPARTING = 1_024

P = ParamSpec("P")


def _while_cached(
    apply: Callable[Concatenate[Any, ServiceSnapshot, str, P], None],
) -> Callable[Concatenate[Any, str, P], None]:
    """A task on one service, run with the service's current snapshot; skipped when the cache
    no longer holds the service (dropped since the event, or never followed)."""

    @functools.wraps(apply)
    def run(self: _ZooKeeperFollower, service: str, *args: P.args, **kwargs: P.kwargs) -> None:
        current = self._cache.snapshots.get(service)
        if current is not None:
            apply(self, current, service, *args, **kwargs)

    return run


def held_by_namespace(current: ServiceSnapshot, section: str) -> bool:
    """Whether the namespace holds ``section`` of the service: a spec naming a Curator registry
    leaves its instances to :mod:`sentinel.cache.curator`, and children written under its node
    are nobody's instances."""
    return section != "instances" or current.spec.curator is None


def node_at(path: str) -> tuple[str, tuple[Any, ...]] | None:
    """What the cache follows at ``path``: ``(kind, (service or policy, ...))``, or None.

    Kinds: ``service`` (a service's node), ``metrics`` (a service's metrics section),
    ``child`` (an instance or metrics node: service, section, name), ``auth`` (this client's
    credential node of a service), ``policy`` and ``bucket`` (policy, index).
    """
    parts = path.split("/")
    if len(parts) not in (3, 4):
        return None
    top, name = parts[1], parts[2]
    section = _SECTIONS.get(top)
    if len(parts) == 3:
        if section == "instances":
            return "service", (name,)
        if section == "metrics":
            return "metrics", (name,)
        return ("policy", (name,)) if top == SHARD_INFO[1:] else None
    child = parts[3]
    if section is not None:
        return "child", (name, section, child)
    if top == AUTH[1:]:
        return "auth", (name,)  # only this client's own node is followed
    if top == SHARD_INFO[1:] and len(child) == 4:
        with contextlib.suppress(ValueError):  # only buckets are followed; be sure anyway
            return "bucket", (name, int(child, 16))
    return None


class _ZooKeeperFollower:
    """What both watch modes share: the reads, and how what they read reaches the cache."""

    persistent: ClassVar[bool]
    complete = False  # a Curator registry's instances are the Curator follower's

    def __init__(
        self,
        cache: FollowedCache,
        zk: KazooClient,
        credentials: CredentialReader | None,
        *,
        secured: bool = False,
    ) -> None:
        self._cache = cache
        self._zk = zk
        self._credentials = credentials
        self._reads = ServiceReads(
            zk,
            cache.stats,
            credentials,
            watch=self._read_watch(),
            reads=self._read_many,
            watch_absent=self._watch_absent,
            ephemeral_instances=secured,
        )

    # --- what a watch mode decides -------------------------------------------------------

    def _read_watch(self) -> Watch | None:
        """The watch every read sets."""
        raise NotImplementedError

    def _read_many(
        self, items: Iterable[Any], path_of: Callable[[Any], str]
    ) -> Iterator[tuple[Any, Any]]:
        """``(item, result)`` for the node of each item (see
        :data:`sentinel.registry.reads.Reads`)."""
        raise NotImplementedError

    def _watch_absent(self, path: str) -> bool:
        """Learn when ``path`` (found absent) is created; True when it exists already."""
        raise NotImplementedError

    def _task_for(self, kind: str, path: str) -> Task | None:
        """The work one watch event of ``kind`` on ``path`` asks for."""
        raise NotImplementedError

    def _follow_service(self, service: str) -> bool:
        """Before ``service`` is read: have its changes reported; True when that is new."""
        raise NotImplementedError

    def _unfollow_service(self, service: str) -> None:
        raise NotImplementedError

    def _follow_policy(self, policy: str) -> None:
        raise NotImplementedError

    # --- services --------------------------------------------------------------------------

    def load_service(self, service: str) -> ServiceSnapshot:
        """Follow ``service`` (before any read: what changes from now on is reported), read it
        and return its first snapshot."""
        self._follow_service(service)
        try:
            state = self._reads.service(service)
        except ServiceNotFound:
            self._unfollow_service(service)
            raise
        self._use_policy(state.spec.shard_policy, service)
        return ServiceSnapshot.first(*state)

    def load_services(self, services: Sequence[str]) -> Iterator[ServiceSnapshot | Exception]:
        """:meth:`load_service` of each, one at a time (one-shot: each read sets its watch)."""
        return load_each(self.load_service, services)

    @_while_cached
    def _refresh_service(self, current: ServiceSnapshot, service: str) -> None:
        """Read the whole service again (setting the watches again, one-shot)."""
        try:
            state = self._reads.service(service, current.spec)
        except ServiceNotFound:
            self._drop_service(service)
            return
        self._use_policy(state.spec.shard_policy, service)
        fields = state._asdict()
        curator = state.spec.curator
        if curator is not None and curator == current.spec.curator:
            # The instances, and their unreadable nodes, are the Curator follower's.
            below = f"{curator.parent(service)}/"
            fields["endpoints"] = current.endpoints
            fields["invalid"] = state.invalid | {p for p in current.invalid if p.startswith(below)}
        self._cache.swap(
            service, current.rebuilt(**fields), lost=self._unmarked(current, fields["endpoints"])
        )

    @_while_cached
    def _refresh_spec(self, current: ServiceSnapshot, service: str) -> None:
        """After an event on the service's node alone: read its spec again."""
        try:
            spec = self._reads.spec(service, current.spec)
        except ServiceNotFound:
            self._drop_service(service)
            return
        self._use_policy(spec.shard_policy, service)
        if spec != current.spec:
            self._cache.swap(service, current.rebuilt(spec=spec))

    @_while_cached
    def _refresh_children(self, current: ServiceSnapshot, service: str, section: str) -> None:
        """After a children event: read the new children of one section."""
        if not held_by_namespace(current, section):
            return
        parent, field, _ = section_of(section, service)
        try:
            children, bad = self._reads.section(section, service, current)
        except ServiceNotFound:
            self._drop_service(service)
            return
        known = getattr(current, field)
        changes = dict.fromkeys(known.keys() - children.keys())  # removed: None
        changes.update((n, children[n]) for n in children.keys() - known.keys())
        others = {path for path in current.invalid if not path.startswith(f"{parent}/")}
        lost = self._unmarked(current, children) if field == "endpoints" else ()
        self._cache.update(service, current, field, changes, frozenset(others | bad), lost)

    def _unmarked(self, current: ServiceSnapshot, listed: Mapping[str, Any]) -> frozenset[str]:
        """The instances ``current`` holds that a listing no longer shows, if they count as
        losses for protection from mass loss. The one-shot watches hear no departure mark
        (they watch the nodes read, and a mark is never read): every vanish counts as a
        deregistration, and nothing is protected."""
        return frozenset()

    @_while_cached
    def _refresh_child(
        self, current: ServiceSnapshot, service: str, section: str, name: str, read: Any = None
    ) -> None:
        """After a data event (one-shot: a deletion too): read one child again (it may be
        gone, created again, or now invalid); ``read``: its read, already sent."""
        if not held_by_namespace(current, section):
            return
        outcome = self._reads.child(section, current, service, name, read)
        if outcome is None:  # a flooded section's newcomer: left unread
            return
        value, unreadable = outcome
        parent, field, _ = section_of(section, service)
        path = f"{parent}/{name}"
        invalid = current.invalid | {path} if unreadable else current.invalid - {path}
        self._cache.update(service, current, field, {name: value}, invalid)

    @_while_cached
    def _forget_section(self, current: ServiceSnapshot, service: str, section: str) -> None:
        """After a section's parent was deleted: drop its children, no read."""
        parent, field, _ = section_of(section, service)
        invalid = {path for path in current.invalid if not path.startswith(f"{parent}/")}
        changes = dict.fromkeys(getattr(current, field))
        self._cache.update(service, current, field, changes, frozenset(invalid))

    @_while_cached
    def _forget_child(
        self, current: ServiceSnapshot, service: str, section: str, name: str, marked: bool
    ) -> None:
        """After a deletion under a recursive watch: drop the child, no read (the watch
        reports the node if it is created again); ``marked``: its owner's departure mark
        came just before (a deregistration), else it is a loss protection counts."""
        if not held_by_namespace(current, section):
            return
        parent, field, _ = section_of(section, service)
        invalid = current.invalid - {f"{parent}/{name}"}
        lost = () if marked or field != "endpoints" else (name,)
        self._cache.update(service, current, field, {name: None}, invalid, lost)

    @_while_cached
    def _refresh_auth(self, current: ServiceSnapshot, service: str, gone: bool = False) -> None:
        """After an event on this client's credential node; ``gone``: it was deleted (no
        read: there is no credential)."""
        if gone:
            self._reads.forget_auth(service)
        auth = None if gone else self._reads.auth(service)
        if auth != current.auth:
            self._cache.swap(service, current.rebuilt(auth=auth))

    def forget(self, service: str) -> None:
        """Stop following ``service`` (the cache drops it): its watches go."""
        self._unfollow_service(service)

    @_while_cached
    def _drop_service(self, current: ServiceSnapshot, service: str) -> None:
        self._unfollow_service(service)
        self._cache.drop(service)

    # --- shard maps --------------------------------------------------------------------------

    def _use_policy(self, policy: str | None, service: str) -> None:
        if policy is None:
            return
        self._cache.add_policy_user(policy, service)
        if policy not in self._cache.shard_maps:
            self._load_policy(policy)

    def _reload_policy(self, policy: str, gone: bool = False) -> None:
        """After an event on a policy's node: read it again if the cache still holds it;
        ``gone``: it was deleted (no read)."""
        if policy in self._cache.shard_maps:
            self._load_policy(policy, gone)

    def _load_policy(self, policy: str, gone: bool = False) -> None:
        """(Re-)read a policy's spec and, for a directory, every bucket."""
        self._follow_policy(policy)
        old = self._cache.shard_maps.get(policy)
        try:
            spec = None if gone else self._reads.policy(policy)
        except DecodeError:
            if old is not None:
                return  # as with a service spec: one bad write must not unshard everyone
            spec = None
        if spec is None:
            self._cache.set_shard_map(policy, None, key_changes(directory_keys(old), {}))
            return
        keep = isinstance(old, DirectoryMap) and old.spec == spec
        shard_map: ShardMap = old if keep else new_map(spec)  # type: ignore[assignment]
        changes: dict[str, tuple[Any, Any]] = {}
        if isinstance(shard_map, DirectoryMap):
            for index, keys in self._reads.buckets(spec):
                if keys is None:
                    continue  # not valid (counted): the bucket as held before, if it was
                bucket_changes = shard_map.apply_bucket(index, keys)
                if keep:
                    changes.update(bucket_changes)
        if not keep and policy in self._cache.shard_maps:
            # A first load has nobody to tell; diffing a million keys would only cost memory.
            changes = key_changes(directory_keys(old), directory_keys(shard_map))
        self._cache.set_shard_map(policy, shard_map, changes)

    def _refresh_bucket(self, policy: str, index: int, gone: bool = False) -> None:
        """After an event on a bucket: read it again; ``gone``: it was deleted (no read)."""
        shard_map = self._cache.shard_maps.get(policy)
        if not isinstance(shard_map, DirectoryMap) or index >= shard_map.spec.buckets:
            return
        keys = {} if gone else self._reads.bucket(shard_map.spec, index)
        if keys is None:
            return  # not valid (counted): the bucket as held before
        changes = shard_map.apply_bucket(index, keys)
        if changes:
            self._cache.emit_keys(policy, changes)


class OneShotFollower(_ZooKeeperFollower):
    """kazoo's one-shot watches, set again by each read; everything re-read after a
    reconnection (kazoo drops the watches when the connection is suspended)."""

    persistent = False

    def resync(self) -> None:
        """Read every policy and service the cache holds again, reporting real changes."""
        for policy in list(self._cache.shard_maps):
            self._load_policy(policy)
        for service in self._cache.native_services():
            self._refresh_service(service)

    def _on_event(self, event: WatchedEvent) -> None:
        """kazoo's thread: queue the event's work, nothing more."""
        if event.type == EventType.NONE:
            return  # the connection changed; the re-sync after reconnecting covers it
        self._cache.stats.watch_events += 1
        task = self._task_for(event.type, event.path)
        if task is not None:
            self._cache.worker.merge(task)

    def _task_for(self, kind: str, path: str) -> Task | None:
        node = node_at(path)
        if node is None:
            return None
        what, args = node
        if what == "service":
            if kind == EventType.CHILD:
                return Task(self._refresh_children, (*args, "instances"))
            return Task(self._refresh_service, args)
        if what == "metrics":  # children changed, or the section appeared
            return Task(self._refresh_children, (*args, "metrics"))
        if what == "child":
            # A deletion is read too: the node may exist again under its name (a restart),
            # and only this read sets a watch on the new node. The parent's children watch
            # cannot be relied on for it: a re-read of the children queued before this event
            # finds the name again and trusts it watched (see ServiceReads.section), and its
            # own watch may be spent, its re-read merged into that.
            return Task(self._refresh_child, args)
        if what == "auth":
            return Task(self._refresh_auth, args)
        if what == "policy":
            return Task(self._reload_policy, args)
        return Task(self._refresh_bucket, args)

    def _read_watch(self) -> Watch:
        return self._on_event

    def _read_many(
        self, items: Iterable[Any], path_of: Callable[[Any], str]
    ) -> Iterator[tuple[Any, Any]]:
        return pipelined_reads(self._zk, items, path_of, self._on_event)

    def _watch_absent(self, path: str) -> bool:
        return self._zk.exists(path, watch=self._on_event) is not None

    def _follow_service(self, service: str) -> bool:
        return False  # the reads set the watches

    def _unfollow_service(self, service: str) -> None:
        pass  # a one-shot watch that fires for a service no longer held asks for nothing

    def _follow_policy(self, policy: str) -> None:
        pass  # the reads set the watches


class PersistentFollower(_ZooKeeperFollower):
    """One persistent recursive watch per followed subtree, kept across reconnections within
    the session (see :class:`~sentinel.zk.watches.PersistentWatches`)."""

    persistent = True

    def __init__(
        self,
        cache: FollowedCache,
        zk: KazooClient,
        credentials: CredentialReader | None,
        watches: PersistentWatches,
        *,
        at_once: bool = True,
        secured: bool = False,
    ) -> None:
        self._watches = watches
        # Events taken on the connection thread and children's reads sent there (False: on
        # kazoo's callback thread, every read sent by the worker): CacheConfig's
        # events_on_connection_thread.
        self.at_once = at_once
        # The subtrees this session has a recursive watch on (a session's end pops them on
        # kazoo's thread), and the last event of each node not yet applied, with the node's
        # read sent as it arrived (None: the worker reads).
        self._followed: dict[str, bool] = {}
        self._latest: dict[str, tuple[str, Any]] = {}
        # Instance nodes whose departure mark was heard and whose deletion has not been yet
        # (the next event of the node, in the same notification batch, is its deletion);
        # bounded, since anyone who may write a service can create marks without deleting.
        self._departing: set[str] = set()
        self._in_order = _InOrder(cache.worker, self._applied_now)
        super().__init__(cache, zk, credentials, secured=secured)

    def resync(self) -> None:
        """Watch again every subtree in use whose watch went with a session, and read those
        again; with every watch in place (a resumed session) nothing is read: the server
        reported what changed meanwhile, and those events are applied as any."""
        self._follow_all()

    def _follow_all(self) -> None:
        for policy in list(self._cache.shard_maps):
            if self._follow(policy_path(policy)):
                self._load_policy(policy)
        for service in self._cache.native_services():
            if self._follow_service(service):
                self._refresh_service(service)

    def load_services(self, services: Sequence[str]) -> Iterator[ServiceSnapshot | Exception]:
        """:meth:`load_service` of each, their requests in flight together rather than a
        round trip at a time: first every service's watches, all of them answered before any
        read is sent (what a change does from then on is reported, as for one service); then
        each service's node, credential and listings in multi-reads, and the children of every
        section of at most MULTI_READ_BATCH nodes, READ_AHEAD nodes at most, in multi-reads of
        MULTI_READ_BATCH. Each service is then read as :meth:`load_service` reads one,
        answered from those replies (the children not read ahead it reads itself, within the
        section's bounds), and handed over as soon as it is made."""
        self._follow_many([root for service in services for root in self._service_roots(service)])
        with self._reads.reading_ahead(self._read_ahead(services)):
            yield from load_each(self.load_service, services)

    def _follow_many(self, roots: list[str]) -> None:
        """:meth:`_follow` of each root, the requests in flight together. A root whose watch
        failed is left unfollowed: its service's load follows it again, and fails as one."""
        sent = []
        for root in dict.fromkeys(roots):
            if root in self._followed:
                continue
            self._followed[root] = True  # before the request, as in _follow
            try:
                sent.append((root, self._add_watch(root, wait=False)))
            except Exception:
                self._followed.pop(root, None)
        for root, result in sent:
            try:
                result.get()
            except Exception:
                self._followed.pop(root, None)

    def _read_ahead(self, services: Sequence[str]) -> dict[tuple[str, str], Any]:
        """The replies :meth:`load_services` answers the services' reads from (see
        :meth:`ServiceReads.reading_ahead`), read in multi-reads of MULTI_READ_BATCH nodes."""
        data: list[str] = []
        listed: list[str] = []
        for service in services:
            nodes, parents = self._reads.first_paths(service)
            data += nodes
            listed += parents
        replies: dict[tuple[str, str], Any] = {}
        children = []
        step = MULTI_READ_BATCH // 2
        for start in range(0, max(len(data), len(listed)), step):
            read = self._watches.get_many(data[start : start + step], listed[start : start + step])
            replies.update((("data", path), reply) for path, reply in read.data.items())
            for parent, names in read.children.items():
                replies["children", parent] = names
                small = isinstance(names, list) and len(names) <= MULTI_READ_BATCH
                if small and len(children) + len(names) <= READ_AHEAD:
                    children += [f"{parent}/{name}" for name in names]
        for start in range(0, len(children), MULTI_READ_BATCH):
            read = self._watches.get_many(data=children[start : start + MULTI_READ_BATCH])
            replies.update((("data", path), reply) for path, reply in read.data.items())
        return replies

    def _on_event(self, root: str, event: WatchedEvent) -> None:
        """kazoo's connection thread: an event of the recursive watch on ``root``'s subtree.

        A node's events are applied in one task that reads the latest event's kind when it
        runs: events queued meanwhile (changed, deleted, created again) coalesce into what is
        true last, with at most one read by the worker. An instance's or metrics node's
        creation or change has its read sent here, as the event arrives, and its task queued
        when the reply is in: the worker wakes once, to a reply in hand. A node with an event
        already waiting (a burst) is read by the worker, once, as before. Tasks reach the
        worker in the order of their events (:class:`_InOrder`): a deletion applied from its
        event alone waits for an earlier creation's read, or a replacement (a new instance,
        then the old one removed) would leave the snapshot with neither for a round trip.
        """
        if event.type == EventType.NONE:  # the session ended and took the watch with it
            self._followed.pop(root, None)
            self._in_order.add(Task(self._follow_all))
            return
        self._cache.stats.watch_events += 1
        departed = departed_instance(event.path)
        if departed is not None:  # a deregistration's mark: its node's deletion comes next
            if len(self._departing) >= _MAX_DEPARTING:
                self._departing.clear()
            self._departing.add(departed)
            return
        if event.type == EventType.CHILD:  # a reconnection's report: a parent's children
            task = self._task_for(event.type, event.path)
            if task is not None:
                self._in_order.add(task)
            return
        task = _Held(self._in_order, Task(self._apply_event, (event.path,)))
        waiting = event.path in self._latest
        read = None if waiting else self._read_at_once(event, task)
        kind = event.type
        if event.path in self._departing:
            self._departing.discard(event.path)
            if kind == EventType.DELETED:
                kind = DEREGISTERED
        self._latest[event.path] = (kind, read)
        # Placed once nothing here can fail: a task placed and never released would hold
        # back every later one. The read is sent, and released, after this call returns.
        self._in_order.place(task, waits=read is not None)

    def _read_at_once(self, event: WatchedEvent, task: _Held) -> Any:
        """The read of a child node created or changed, sent now, ``task`` released when it
        completes; None when the worker decides (not such an event, not on the connection
        thread, or a node the worker would not read: a service not held, a section past its
        bound, where a flood must cost no reads)."""
        if event.type == EventType.DELETED:
            return None
        node = node_at(event.path)
        if node is None or node[0] != "child":
            return None
        service, section, name = node[1]
        current = self._cache.snapshots.get(service)
        if current is None or not held_by_namespace(current, section):
            return None
        if not self._reads.has_room(section, current, name):
            return None
        return self._watches.read_now(event.path, task.release)

    def _applied_now(self, task: Task) -> bool:
        """On the thread that released ``task`` (kazoo's: an event, or its read's reply): apply
        it there and then if it needs no read and the worker is idle, leaving the listeners to
        the worker (:meth:`CacheWorker.run_now`): a removal, or a child's read with its reply
        in hand. The snapshot is served without waiting for the worker to wake. False: queue
        it."""
        worker = self._cache.worker
        if task.run != self._apply_event or not worker.idle:
            return False
        path = task.args[0]
        kind, read = self._latest.get(path, (EventType.CHANGED, None))
        gone = kind in (EventType.DELETED, DEREGISTERED)
        if not gone and (read is None or not read.successful()):
            return False  # the worker reads (again), or retries after the re-sync
        node = node_at(path)
        if node is None or node[0] != "child":
            return False
        service, section, _ = node[1]
        lost = kind == EventType.DELETED and section == "instances"
        if not self._cache.serves_at_once(service, lost):
            return False
        return worker.run_now(task, wake=self._watches.after_message)

    def _apply_event(self, path: str) -> None:
        """Apply the latest event of one node (see :meth:`_on_event`)."""
        # popped by a run meanwhile: read it
        kind, read = self._latest.pop(path, (EventType.CHANGED, None))
        node = node_at(path)  # the path's one parse on this way
        if node is None:
            return
        if read is not None:  # a child's, sent by _read_at_once
            self._refresh_child(*node[1], read=read)
            return
        task = self._task_of(kind, node)
        if task is not None:
            task.run(*task.args)

    def _task_for(self, kind: str, path: str) -> Task | None:
        node = node_at(path)
        return None if node is None else self._task_of(kind, node)

    def _task_of(self, kind: str, node: tuple[str, tuple[Any, ...]]) -> Task | None:
        """The node stays watched: a deletion is applied with no read, and a service's node
        changing is its spec alone (its children report their own changes)."""
        what, args = node
        gone = kind in (EventType.DELETED, DEREGISTERED)
        if what == "service":
            if kind == EventType.CHILD:
                return Task(self._refresh_children, (*args, "instances"))
            return Task(self._drop_service if gone else self._refresh_spec, args)
        if what == "metrics":
            run = self._forget_section if gone else self._refresh_children
            return Task(run, (*args, "metrics"))
        if what == "child":
            if gone:
                return Task(self._forget_child, (*args, kind == DEREGISTERED))
            return Task(self._refresh_child, args)
        if what == "policy" and kind == EventType.CHILD:
            return None  # every bucket is watched itself; the rest is not the cache's
        deleted = (True,) if gone else ()  # the ``gone`` argument of the no-read deletions
        by_kind = {"auth": self._refresh_auth, "policy": self._reload_policy}
        return Task(by_kind.get(what, self._refresh_bucket), (*args, *deleted))

    def _unmarked(self, current: ServiceSnapshot, listed: Mapping[str, Any]) -> frozenset[str]:
        """Found gone by a read of the whole section (after a reconnection, or the session's
        end): no departure mark was heard for them, so they count as losses."""
        return frozenset(current.endpoints.keys() - listed.keys())

    def _read_watch(self) -> None:
        return None  # the recursive watch above every read node reports its changes

    def _read_many(
        self, items: Iterable[Any], path_of: Callable[[Any], str]
    ) -> Iterator[tuple[Any, Any]]:
        """Multi-reads of MULTI_READ_BATCH nodes each."""
        pending = list(items)
        for start in range(0, len(pending), MULTI_READ_BATCH):
            batch = pending[start : start + MULTI_READ_BATCH]
            paths = [path_of(item) for item in batch]
            results = self._watches.get_many(data=paths).data
            for item, path in zip(batch, paths, strict=True):
                yield item, Reply(results[path])

    def _watch_absent(self, path: str) -> bool:
        return False  # followed since before the read: its creation will be reported

    def _service_roots(self, service: str) -> list[str]:
        """The subtrees one recursive watch each follows for ``service``."""
        roots = [service_path(service), f"{METRICS}/{service}"]
        if self._credentials is not None:
            roots.append(auth_path(service, self._credentials.client))
        return roots

    def _follow_service(self, service: str) -> bool:
        # every root is followed (a list, not any()) before the service is read
        return any([self._follow(root) for root in self._service_roots(service)])

    def _unfollow_service(self, service: str) -> None:
        for root in self._service_roots(service):
            if self._followed.pop(root, None):
                with contextlib.suppress(NoWatcherError):  # gone with a session meanwhile
                    self._watches.remove_watches(root, WatcherType.PERSISTENT_RECURSIVE)

    def _follow_policy(self, policy: str) -> None:
        self._follow(policy_path(policy))

    def _follow(self, root: str) -> bool:
        """Watch ``root``'s subtree, unless this session does already; True when the watch is
        new (what it covers must be read now)."""
        if root in self._followed:
            return False
        self._followed[root] = True  # before the request: a session ending meanwhile pops it
        try:
            self._add_watch(root)
        except BaseException:
            self._followed.pop(root, None)
            raise
        return True

    def _add_watch(self, root: str, wait: bool = True) -> Any:
        return self._watches.add_watch(
            root,
            functools.partial(self._on_event, root),
            AddWatchMode.PERSISTENT_RECURSIVE,
            known=functools.partial(self._known_paths, root),
            on_connection_thread=self.at_once,
            wait=wait,
        )

    def _known_paths(self, root: str) -> list[str]:
        """The nodes the cache holds under ``root``, for the server to report which changed
        while the connection was down (see :meth:`PersistentWatches.add_watch`). Called on
        kazoo's connection thread: reads the immutable snapshots, no I/O, no lock."""
        _, top, name, *_ = root.split("/")
        if top == SHARD_INFO[1:]:
            shard_map = self._cache.shard_maps.get(name)
            buckets = shard_map.spec.buckets if isinstance(shard_map, DirectoryMap) else 0
            return [root, *(bucket_path(name, i) for i in range(buckets))]
        snapshot = self._cache.snapshots.get(name)
        if snapshot is None or top == AUTH[1:]:
            return [root]
        if not held_by_namespace(snapshot, _SECTIONS[top]):
            return [root]  # the instances are a Curator registry's
        held = snapshot.endpoints if top == SERVICES[1:] else snapshot.metrics
        below = f"{root}/"
        invalid = [path for path in snapshot.invalid if path.startswith(below)]
        return [root, *(below + child for child in list(held)), *invalid]


class _Held:
    """One event's task for :class:`_InOrder`, queued once released and every task before
    it has been."""

    __slots__ = ("_order", "released", "task")

    def __init__(self, order: _InOrder, task: Task) -> None:
        self._order = order
        self.task = task
        self.released = False

    def release(self) -> None:
        """The task may run: its read's reply (or the connection's loss, which fails it) is
        in."""
        self._order.released(self)


class _InOrder:
    """Hands the persistent follower's tasks to the worker in the order of their events.

    A task whose event's read is on its way (sent at once from the connection thread) is
    queued when the reply is in; the tasks of later events wait behind it, so the worker
    applies changes in the order the server made them. Every read sent completes, with its
    reply or with the connection's loss, so a task waits one round trip at most. Events and
    replies arrive on one thread (the connection's, or kazoo's callback thread, where no read
    is sent at once); the lock only guards against a session's end delivered elsewhere.
    """

    def __init__(self, worker: CacheWorker, now: Callable[[Task], bool]) -> None:
        self._worker = worker
        self._now = now  # runs a released task at once when it can (True), else it is queued
        self._lock = threading.Lock()
        self._waiting: deque[_Held] = deque()  # in the order of their events

    def add(self, task: Task) -> None:
        """Queue ``task`` now, or after the tasks still waiting for their reads."""
        self.place(_Held(self, task), waits=False)

    def place(self, held: _Held, waits: bool) -> None:
        """Place ``held`` after every task before it; with ``waits``, it waits for its
        :meth:`_Held.release` too."""
        with self._lock:
            held.released = held.released or not waits
            self._waiting.append(held)
            self._flush()

    def released(self, held: _Held) -> None:
        """``held``'s read is done: queue its task, and those after it, once nothing before
        them waits."""
        with self._lock:
            held.released = True
            self._flush()

    def _flush(self) -> None:
        waiting = self._waiting
        while waiting and waiting[0].released:
            task = waiting.popleft().task
            if not self._now(task):
                self._worker.merge(task)
