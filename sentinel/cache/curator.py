"""A follower of Curator registries: the JVM services of a ZooKeeper shop, in the same cache.

Apache Curator's x-discovery (and Spring Cloud Zookeeper, Dubbo 3) keeps a service's instances
at ``<basePath>/<service>/<instance id>`` (:mod:`sentinel.registry.curator`), outside the
client's namespace. :class:`CuratorFollower` follows such a service on the client's own session
with one persistent recursive watch given from the server's root
(:meth:`~sentinel.zk.watches.PersistentWatches.add_watch` with ``absolute=True``), read with
multi-reads, and hands its changes to the cache as the native followers do: lookups, listeners,
policies and balancers cannot tell the two apart.

* A service is looked for under each base path in turn, after the namespace: a name the
  namespace holds is the namespace's. A namespace spec may itself name a Curator registry
  (:class:`~sentinel.registry.records.CuratorSource`): then the namespace's follower keeps the
  spec, metrics and credential, and this one the instances (:meth:`CuratorFollower.attach`),
  each instance in the partition its properties name.
* An event of an instance node is applied with one read of that node, the latest event of a
  node winning (events queued meanwhile coalesce, as in the native follower).
* Within a session the watch is kept across reconnections, and the server reports what changed
  meanwhile (the follower hands it the nodes the cache holds); a reported change of the
  service's children re-reads the service. A session's end takes the watch: the service is
  followed and read again.
* Each node read is observed in ``sentinel_propagation_delay_seconds{section="instances"}``,
  as the native followers' are.
* Curator 5 requires ZooKeeper 3.6, and so does this follower: on an older server, or with
  ``CacheConfig(persistent_watches=False)``, a Curator service is refused with
  :class:`~sentinel.errors.RegistryError`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
from collections.abc import Iterable, Sequence

from kazoo.exceptions import NoNodeError, NoWatcherError
from kazoo.protocol.states import EventType, WatchedEvent, ZnodeStat

from sentinel.cache.reads import MAX_SECTION_BYTES, MAX_SECTION_NODES
from sentinel.cache.source import FollowedCache
from sentinel.cache.views import ServiceSnapshot
from sentinel.cache.worker import Task
from sentinel.errors import DecodeError, PersistentInstance, ServiceNotFound
from sentinel.registry.curator import decode_endpoint
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.records import CuratorSource, ServiceSpec
from sentinel.telemetry import observe_propagation
from sentinel.zk.watches import AddWatchMode, PersistentWatches, WatcherType

log = logging.getLogger(__name__)

# Nodes per multi-read, as the native follower reads them.
_BATCH = 256
# The instances (served or unreadable) a follower holds of one service, and the nodes it
# reads to choose them when a base path holds more (anyone may write one: a flood).
MAX_INSTANCES = MAX_SECTION_NODES
MAX_SCANNED = 5 * MAX_SECTION_NODES


class CuratorFollower:
    """Follows the services found under Curator base paths, and the instances of namespace
    services whose spec names a Curator registry (see the module)."""

    persistent = True

    def __init__(
        self,
        cache: FollowedCache,
        watches: PersistentWatches,
        base_paths: Sequence[str],
        *,
        secured: bool = False,
    ) -> None:
        self._cache = cache
        self._watches = watches
        self._base_paths = tuple(base_paths)
        self._secured = secured  # serve ephemeral instance nodes only (see the module)
        # service -> the spec its instances are decoded with (spec.curator: where they are)
        self._specs: dict[str, ServiceSpec] = {}
        self._unlisted: set[str] = set()  # of those, the ones the namespace does not hold
        self._watched: set[str] = set()  # parents with a watch this session (kazoo pops)
        self._latest: dict[str, str] = {}  # node path -> its latest event not yet applied
        # service -> node path -> the name its endpoint is served under (its partition's)
        self._names: dict[str, dict[str, str]] = {}
        # service -> the paths it holds (served or unreadable) whose node is persistent: the
        # first to make room for an ephemeral newcomer when the bound applies
        self._pinned: dict[str, set[str]] = {}
        # services with more node events queued than a read of the whole service costs: the
        # next events queue one re-read instead (a flood, or a flood going)
        self._flooded: set[str] = set()
        self._over_limit: set[str] = set()  # parents reported past the bound (logged once)

    @property
    def services(self) -> frozenset[str]:
        """The services whose instances this follower feeds the cache."""
        return frozenset(self._specs)

    @property
    def unlisted(self) -> frozenset[str]:
        """Of those, the ones the namespace holds no spec of (this follower feeds them all)."""
        return frozenset(self._unlisted)

    def load_service(self, service: str) -> ServiceSnapshot:
        """Follow ``service`` from the first base path that holds it and return its first
        snapshot; :class:`~sentinel.errors.ServiceNotFound` when none does."""
        for base in self._base_paths:
            spec = ServiceSpec(service, curator=CuratorSource(base))
            if self._listed(spec.curator.parent(service)) is None:  # type: ignore[union-attr]
                continue  # not here: no watch is set for nothing
            read = self._start(spec)
            if read is None:  # deleted in between
                self.detach(service)
                continue
            self._unlisted.add(service)
            endpoints, invalid = read
            return ServiceSnapshot.first(spec, endpoints, {}, invalid)
        raise ServiceNotFound(
            service, f"is not registered in the namespace nor under {', '.join(self._base_paths)}"
        )

    def attach(self, service: str, snapshot: ServiceSnapshot) -> ServiceSnapshot:
        """``snapshot`` of a namespace service whose spec names a Curator registry, with that
        registry's instances (none while its node does not exist: the watch reports it)."""
        self.detach(service)  # followed with an older spec, if at all
        endpoints, invalid = self._start(snapshot.spec) or ({}, frozenset())
        return snapshot.rebuilt(endpoints=endpoints, invalid=snapshot.invalid | invalid)

    def detach(self, service: str) -> None:
        """Stop following ``service``'s instances (the cache dropped it, or its spec no longer
        names this registry)."""
        spec = self._specs.pop(service, None)
        self._unlisted.discard(service)
        self._names.pop(service, None)
        self._pinned.pop(service, None)
        if spec is not None:
            self._unfollow(_parent(spec))

    def resync(self) -> None:
        """Follow again, and read again, every service whose watch went with a session; with
        the watch in place nothing is read (the server reported what changed)."""
        for service, spec in list(self._specs.items()):
            if self._follow(service, _parent(spec)):
                self._refresh(service)

    def _start(self, spec: ServiceSpec) -> tuple[dict[str, Endpoint], frozenset[str]] | None:
        """Follow ``spec``'s service (before the read: what changes from now is told) and
        read it; None when its node does not exist."""
        self._specs[spec.service] = spec
        self._follow(spec.service, _parent(spec))
        return self._read(spec)

    # --- kazoo's thread -------------------------------------------------------------------------

    def _on_event(self, service: str, parent: str, event: WatchedEvent) -> None:
        """Queue an event's work, nothing more (kazoo's thread must not block)."""
        if event.type == EventType.NONE:  # the session ended and took the watch with it
            self._watched.discard(parent)
            self._cache.worker.merge(Task(self.resync))
            return
        self._cache.stats.watch_events += 1
        if event.path == parent or event.type == EventType.CHILD:
            # The service's node itself, or a reconnection's report that its children changed.
            self._cache.worker.merge(Task(self._refresh, (service,)))
        elif event.path.rsplit("/", 1)[0] == parent:
            if service in self._flooded or len(self._latest) >= _BATCH:
                # More events waiting than one read of the whole service costs (a flood
                # arriving or going): one re-read, bounded, replaces their reads.
                self._flooded.add(service)
                self._cache.worker.merge(Task(self._refresh, (service,)))
                return
            self._latest[event.path] = event.type
            self._cache.worker.merge(Task(self._apply, (service, event.path)))

    def _known(self, service: str, parent: str) -> list[str]:
        """The nodes the cache holds of ``service``, for the server to report which changed
        while the connection was down. On kazoo's connection thread: no I/O, no lock."""
        snapshot = self._cache.snapshots.get(service)
        if snapshot is None:
            return [parent]
        ids = (e.properties["curator"]["id"] for e in snapshot.endpoints.values())
        invalid = (path for path in snapshot.invalid if path.startswith(f"{parent}/"))
        return [parent, *(f"{parent}/{i}" for i in ids), *invalid]

    # --- the worker -----------------------------------------------------------------------------

    def _apply(self, service: str, path: str) -> None:
        """Apply the latest event of one instance node: a deletion with no read, else one read
        (the node may be gone again, or now undecodable). Past the bound a newcomer is held
        only in the place of a node a whole read would hold after it (:meth:`_read`)."""
        current = self._cache.snapshots.get(service)
        kind = self._latest.pop(path, EventType.CHANGED)
        spec = self._specs.get(service)
        if current is None or spec is None or _parent(spec) != path.rsplit("/", 1)[0]:
            return  # dropped since the event
        if service in self._flooded:
            return  # a re-read of the whole service is queued
        names = self._names.setdefault(service, {})
        pinned = self._pinned.setdefault(service, set())
        parent = _parent(spec)
        value: Endpoint | None = None
        unreadable = ephemeral = False
        if kind != EventType.DELETED:
            found = self._watches.get_many(data=[path], absolute=True).data[path]
            if not isinstance(found, NoNodeError):
                if isinstance(found, Exception):
                    raise found
                data, stat = found
                ephemeral = bool(stat.ephemeralOwner)
                try:
                    value = self._decode(spec, path, data, stat)
                except PersistentInstance as exc:
                    self._skip(exc)  # not held: it takes no room
                else:
                    unreadable = value is None
        invalid = set(current.invalid)
        changes: dict[str, Endpoint | None] = {}
        held = path in names or path in invalid
        below = [p for p in invalid if p.startswith(f"{parent}/")] if not held else []
        full = len(names) + len(below) >= MAX_INSTANCES
        if not held and (value is not None or unreadable) and full:
            # A readable newcomer takes an unreadable node's place, an ephemeral one a
            # persistent instance's; anything else stays out.
            evicted = below[0] if below and value is not None else None
            if evicted is None and value is not None and ephemeral:
                evicted = next((p for p in pinned if p in names), None)
            if evicted is None:
                self._cache.stats.over_limit += 1
                return
            invalid.discard(evicted)
            pinned.discard(evicted)
            if evicted in names:
                changes[names.pop(evicted)] = None
        # The node's endpoint goes from the name it was served under: its partition may have
        # changed with its payload.
        old = names.pop(path, None)
        if old is not None:
            changes[old] = None
        pinned.discard(path)
        if unreadable:
            invalid.add(path)
        else:
            invalid.discard(path)
        if value is not None:
            names[path] = value.name
            changes[value.name] = value
        if (value is not None or unreadable) and not ephemeral:
            pinned.add(path)
        self._cache.update(service, current, "endpoints", changes, frozenset(invalid))

    def _refresh(self, service: str) -> None:
        """Read the whole service again. When its node is gone a service the namespace does
        not hold is dropped; a namespace service has no instances until it is back."""
        self._flooded.discard(service)  # events from now on are applied one by one again
        current = self._cache.snapshots.get(service)
        spec = self._specs.get(service)
        if current is None or spec is None:
            return
        read = self._read(spec)
        if read is None and service in self._unlisted:
            self.detach(service)
            self._cache.drop(service)
            return
        endpoints, invalid = read or ({}, frozenset())
        below = f"{_parent(spec)}/"
        invalid |= {path for path in current.invalid if not path.startswith(below)}
        if endpoints != dict(current.endpoints) or invalid != current.invalid:
            self._cache.swap(service, current.rebuilt(endpoints=endpoints, invalid=invalid))

    def _read(self, spec: ServiceSpec) -> tuple[dict[str, Endpoint], frozenset[str]] | None:
        """The instances of ``spec``'s service, by name, and the nodes that did not decode;
        None when its node does not exist.

        At most MAX_INSTANCES nodes are held (served or unreadable): of the nodes read, the
        readable ones first, of those the ones the cache held already, then ephemeral ones
        (never the first names in sorted order, which whoever floods the path chooses). At
        most MAX_SCANNED nodes and MAX_SECTION_BYTES of data are read: past that, the nodes
        the cache holds first, then the others in random order. A listing says nothing but
        names; whether a node is ephemeral is in its stat, which comes with its read (a
        multi-read returns each node's data and stat), so choosing costs one read per node.
        """
        parent = _parent(spec)
        children = self._listed(parent)
        if children is None:
            return None
        service = spec.service
        known = set(self._names.get(service, {}))  # the nodes the cache holds
        current = self._cache.snapshots.get(service)
        if current is not None:
            known |= current.invalid
        if len(children) > MAX_SCANNED:
            first = [c for c in children if f"{parent}/{c}" in known]
            rest = [c for c in children if f"{parent}/{c}" not in known]
            random.shuffle(rest)
            children = first + rest
        nodes, unread = self._scan(parent, children)
        refusals = 0
        first_refused: PersistentInstance | None = None  # for the log
        ranked = []
        for path, data, stat in nodes:
            try:
                endpoint = self._decode(spec, path, data, stat, quiet=True)
            except PersistentInstance as exc:
                refusals += 1  # not held: it takes no room
                first_refused = first_refused or exc
                continue
            ephemeral = bool(stat.ephemeralOwner)
            # Readable first; of those, what the cache held already, then ephemeral ones.
            rank = (endpoint is None, path not in known, not ephemeral)
            ranked.append((rank, path, endpoint, ephemeral))
        ranked.sort(key=lambda item: item[0])  # stable: the order read within a rank
        unread += max(len(ranked) - MAX_INSTANCES, 0)
        endpoints: dict[str, Endpoint] = {}
        names: dict[str, str] = {}
        pinned: set[str] = set()
        invalid: set[str] = set()
        for _, path, endpoint, ephemeral in ranked[:MAX_INSTANCES]:
            if endpoint is None:
                invalid.add(path)
            else:
                endpoints[endpoint.name] = endpoint
                names[path] = endpoint.name
            if not ephemeral:
                pinned.add(path)
        self._cache.stats.decode_errors += refusals
        if refusals:
            log.warning(
                "skipping %d persistent instance node(s) under %s (a secured namespace serves "
                "ephemeral ones only), such as %s",
                refusals,
                parent,
                first_refused,
            )
        if unread:
            self._cache.stats.over_limit += unread
            if parent not in self._over_limit:  # once, not per read
                self._over_limit.add(parent)
                log.warning(
                    "%s has %d nodes, more than a follower holds (%d): %d left unread or "
                    "unheld, the instances it held and ephemeral ones kept first; "
                    "'sentinel doctor --curator-path' names what is there",
                    parent,
                    len(children),
                    MAX_INSTANCES,
                    unread,
                )
        self._names[service] = names
        self._pinned[service] = pinned
        return endpoints, frozenset(invalid)

    def _scan(
        self, parent: str, children: list[str]
    ) -> tuple[list[tuple[str, bytes, ZnodeStat]], int]:
        """Read ``children`` in their order, at most MAX_SCANNED nodes and MAX_SECTION_BYTES
        of data: ``(path, data, stat)`` of each node read (not gone meanwhile), and how many
        were left unread."""
        nodes: list[tuple[str, bytes, ZnodeStat]] = []
        spent = 0
        scanned = children[:MAX_SCANNED]
        read = 0
        for path, found in self._read_nodes(f"{parent}/{child}" for child in scanned):
            read += 1
            if isinstance(found, NoNodeError):
                continue  # gone since the listing
            if isinstance(found, Exception):
                raise found
            data, stat = found
            nodes.append((path, data, stat))
            spent += len(data or b"")
            if spent >= MAX_SECTION_BYTES:
                break
        return nodes, len(children) - read

    def _decode(
        self, spec: ServiceSpec, path: str, data: bytes, stat: ZnodeStat, *, quiet: bool = False
    ) -> Endpoint | None:
        """The endpoint of one node, or None (logged and counted) when it does not decode; its
        propagation delay is observed as a native instance's is. In a secured namespace a
        persistent node is refused (:class:`~sentinel.errors.PersistentInstance`, raised for
        the caller to count: it is not held). ``quiet``: each skip is counted, not logged
        (a whole read logs a summary)."""
        owner = stat.ephemeralOwner if self._secured else None
        try:
            endpoint = decode_endpoint(spec, path, data, stat.czxid, owner)
        except PersistentInstance:
            raise  # before observing: a flood of them costs no more than a check each
        except DecodeError as exc:
            observe_propagation("instances", stat)
            if quiet:
                self._cache.stats.decode_errors += 1
            else:
                self._skip(exc)
            return None
        observe_propagation("instances", stat)
        return endpoint

    def _skip(self, exc: DecodeError) -> None:
        self._cache.stats.decode_errors += 1
        log.warning("skipping %s", exc)

    def _read_nodes(self, paths: Iterable[str]) -> Iterable[tuple[str, object]]:
        pending = list(paths)
        for start in range(0, len(pending), _BATCH):
            batch = pending[start : start + _BATCH]
            results = self._watches.get_many(data=batch, absolute=True).data
            yield from ((path, results[path]) for path in batch)

    def _listed(self, parent: str) -> list[str] | None:
        found = self._watches.get_many(children=[parent], absolute=True).children[parent]
        if isinstance(found, NoNodeError):
            return None
        if isinstance(found, Exception):
            raise found
        return list(found)

    def _follow(self, service: str, parent: str) -> bool:
        """Watch ``parent``'s subtree unless this session does already; True when new."""
        if parent in self._watched:
            return False
        self._watched.add(parent)  # before the request: a session ending meanwhile pops it
        try:
            self._watches.add_watch(
                parent,
                functools.partial(self._on_event, service, parent),
                AddWatchMode.PERSISTENT_RECURSIVE,
                known=functools.partial(self._known, service, parent),
                absolute=True,
            )
        except BaseException:
            self._watched.discard(parent)
            raise
        return True

    def _unfollow(self, parent: str) -> None:
        if parent in self._watched:
            self._watched.discard(parent)
            with contextlib.suppress(NoWatcherError):  # gone with a session meanwhile
                self._watches.remove_watches(
                    parent, WatcherType.PERSISTENT_RECURSIVE, absolute=True
                )


def _parent(spec: ServiceSpec) -> str:
    """The server path of the instances of a service whose spec names a Curator registry."""
    assert spec.curator is not None
    return spec.curator.parent(spec.service)
