"""A follower of Curator registries: the JVM services of a ZooKeeper shop, in the same cache.

Apache Curator's x-discovery (and Spring Cloud Zookeeper, Dubbo 3) keeps a service's instances
at ``<basePath>/<service>/<instance id>`` (:mod:`sentinel.registry.curator`), outside the
client's namespace. :class:`CuratorFollower` follows such a service on the client's own session
with one persistent recursive watch given from the server's root
(:meth:`~sentinel.zk.protocol.PersistentWatches.add_watch` with ``absolute=True``), read with
multi-reads, and hands its changes to the cache as the native followers do: lookups, listeners,
policies and balancers cannot tell the two apart.

* A service is looked for under each base path in turn, after the namespace: a name the
  namespace holds is the namespace's.
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
from collections.abc import Iterable, Sequence

from kazoo.exceptions import NoNodeError, NoWatcherError
from kazoo.protocol.states import EventType, WatchedEvent, ZnodeStat

from sentinel.cache.reads import MAX_SECTION_NODES
from sentinel.cache.source import FollowedCache
from sentinel.cache.views import ServiceSnapshot
from sentinel.cache.worker import Task
from sentinel.errors import DecodeError, ServiceNotFound
from sentinel.registry.curator import CURATOR_PARTITION, CuratorInstance
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.layout import INSTANCE_SEPARATOR, sanitize_name
from sentinel.registry.records import ServiceSpec
from sentinel.telemetry import observe_propagation
from sentinel.zk.protocol import AddWatchMode, PersistentWatches, WatcherType

log = logging.getLogger(__name__)

# Nodes per multi-read, as the native follower reads them.
_BATCH = 256


def endpoint_name(instance_id: str) -> str:
    """The name the cache keeps a Curator instance under (its endpoint's ``name``)."""
    return f"{CURATOR_PARTITION}{INSTANCE_SEPARATOR}{sanitize_name(instance_id)}"


class CuratorFollower:
    """Follows the services found under Curator base paths (see the module)."""

    persistent = True

    def __init__(
        self, cache: FollowedCache, watches: PersistentWatches, base_paths: Sequence[str]
    ) -> None:
        self._cache = cache
        self._watches = watches
        self._base_paths = tuple(base_paths)
        self._parents: dict[str, str] = {}  # service -> <base>/<service> (the worker's)
        self._watched: set[str] = set()  # parents with a watch this session (kazoo pops)
        self._latest: dict[str, str] = {}  # node path -> its latest event not yet applied

    @property
    def services(self) -> frozenset[str]:
        """The services this follower feeds the cache."""
        return frozenset(self._parents)

    def load_service(self, service: str) -> ServiceSnapshot:
        """Follow ``service`` from the first base path that holds it and return its first
        snapshot; :class:`~sentinel.errors.ServiceNotFound` when none does."""
        for base in self._base_paths:
            parent = f"{base.rstrip('/')}/{service}"
            if self._listed(parent) is None:
                continue  # not here: no watch is set for nothing
            self._follow(service, parent)  # before the read: what changes from now is told
            read = self._read(service, parent)
            if read is None:  # deleted in between
                self._unfollow(parent)
                continue
            self._parents[service] = parent
            endpoints, invalid = read
            return ServiceSnapshot.first(ServiceSpec(service), endpoints, {}, invalid)
        raise ServiceNotFound(
            service, f"is not registered in the namespace nor under {', '.join(self._base_paths)}"
        )

    def resync(self) -> None:
        """Follow again, and read again, every service whose watch went with a session; with
        the watch in place nothing is read (the server reported what changed)."""
        for service, parent in list(self._parents.items()):
            if self._follow(service, parent):
                self._refresh(service)

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
            self._latest[event.path] = event.type
            self._cache.worker.merge(Task(self._apply, (service, event.path)))

    def _known(self, service: str, parent: str) -> list[str]:
        """The nodes the cache holds of ``service``, for the server to report which changed
        while the connection was down. On kazoo's connection thread: no I/O, no lock."""
        snapshot = self._cache.snapshots.get(service)
        if snapshot is None:
            return [parent]
        ids = (e.properties["curator"]["id"] for e in snapshot.endpoints.values())
        return [parent, *(f"{parent}/{i}" for i in ids), *snapshot.invalid]

    # --- the worker -----------------------------------------------------------------------------

    def _apply(self, service: str, path: str) -> None:
        """Apply the latest event of one instance node: a deletion with no read, else one read
        (the node may be gone again, or now undecodable)."""
        current = self._cache.snapshots.get(service)
        kind = self._latest.pop(path, EventType.CHANGED)
        if current is None or self._parents.get(service) != path.rsplit("/", 1)[0]:
            return  # dropped since the event
        instance_id = path.rsplit("/", 1)[1]
        value: Endpoint | None = None
        unreadable = False
        if kind != EventType.DELETED:
            found = self._watches.get_many(data=[path], absolute=True).data[path]
            if not isinstance(found, NoNodeError):
                if isinstance(found, Exception):
                    raise found
                value = self._decode(service, path, *found)
                unreadable = value is None
        invalid = current.invalid | {path} if unreadable else current.invalid - {path}
        self._cache.update(
            service, current, "endpoints", {endpoint_name(instance_id): value}, invalid
        )

    def _refresh(self, service: str) -> None:
        """Read the whole service again; drop it when its node is gone."""
        current = self._cache.snapshots.get(service)
        parent = self._parents.get(service)
        if current is None or parent is None:
            return
        read = self._read(service, parent)
        if read is None:
            self._unfollow(parent)
            del self._parents[service]
            self._cache.drop(service)
            return
        endpoints, invalid = read
        if endpoints != dict(current.endpoints) or invalid != current.invalid:
            self._cache.swap(service, current.rebuilt(endpoints=endpoints, invalid=invalid))

    def _read(self, service: str, parent: str) -> tuple[dict[str, Endpoint], frozenset[str]] | None:
        """Every instance of the service at ``parent``, by name, and the nodes that did not
        decode; None when ``parent`` does not exist."""
        children = self._listed(parent)
        if children is None:
            return None
        if len(children) > MAX_SECTION_NODES:
            self._cache.stats.over_limit += len(children) - MAX_SECTION_NODES
            log.warning(
                "%s has %d instances: reading the first %d",
                parent,
                len(children),
                MAX_SECTION_NODES,
            )
            children = sorted(children)[:MAX_SECTION_NODES]
        endpoints: dict[str, Endpoint] = {}
        invalid: set[str] = set()
        for path, found in self._read_nodes(f"{parent}/{child}" for child in children):
            if isinstance(found, NoNodeError):
                continue  # gone since the listing
            if isinstance(found, Exception):
                raise found
            endpoint = self._decode(service, path, *found)
            if endpoint is None:
                invalid.add(path)
            else:
                endpoints[endpoint.name] = endpoint
        return endpoints, frozenset(invalid)

    def _decode(self, service: str, path: str, data: bytes, stat: ZnodeStat) -> Endpoint | None:
        """The endpoint of one node, or None (logged and counted) when it does not decode; its
        propagation delay is observed as a native instance's is."""
        observe_propagation("instances", stat)
        try:
            instance = CuratorInstance.from_bytes(path, data)
            return instance.endpoint(service, joined=stat.czxid)
        except DecodeError as exc:
            self._cache.stats.decode_errors += 1
            log.warning("skipping %s", exc)
            return None

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
