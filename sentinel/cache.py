"""The watch-driven cache behind ``get_service``: per-service snapshots and shard maps.

Readers never lock: a service's state is one immutable :class:`ServiceSnapshot`, replaced by a
single dict store when anything changes. A change to one instance or its metrics derives the
new snapshot from the old one (:meth:`ServiceSnapshot.updated`): only its partition's tuples
are spliced and only it is diffed for the listeners (the rest is copied by reference, at C
speed). Directory shard maps are one flat dict updated a key at a time (see
:class:`~sentinel.shards.maps.DirectoryMap` for why).

All loading and updating happens on one worker thread. ZooKeeper watch callbacks run on kazoo's
thread, which must never block, so they only queue a task naming what changed; the worker
applies it, builds the new state, swaps it in and tells the listeners. Repeated events for the
same node coalesce into one task.

How ZooKeeper is followed depends on the server (see :mod:`sentinel.zkprotocol`):

* persistent mode (ZooKeeper 3.6+, the default): one persistent recursive watch per followed
  subtree (a service's node and instances, its metrics, this client's credential node, a shard
  policy and its buckets), added before the subtree is read with multi-reads. Events are
  applied from their path: a deletion drops the node with no read, a creation or change reads
  that one node. The watches are kept across reconnections within the session, and the server
  reports what changed while the connection was down (the cache hands it the paths it holds),
  so an unchanged client reads nothing after a reconnection. A session's end takes the watches
  with it: each subtree is followed and read again.
* one-shot mode (older servers, or ``persistent_watches=False``): kazoo's watches, set again by
  each read; kazoo drops them all when the connection is suspended, so each reconnection queues
  a full re-sync that re-reads everything this client uses and reports exactly what changed.

The re-sync starts after a random delay of up to ``resync_jitter`` seconds, so a fleet that
reconnects together does not read together, and reconnections within that delay share one.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import logging
import operator
import os
import queue
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from cachetools import TTLCache
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoNodeError, NoWatcherError
from kazoo.protocol.states import EventType, WatchedEvent

from sentinel.auth.acl import ensure_clients_node
from sentinel.auth.envelope import Credential
from sentinel.auth.reader import CredentialReader
from sentinel.endpoint import NO_METRICS, Endpoint
from sentinel.ephemeral import EphemeralNodes
from sentinel.errors import (
    ClientClosed,
    DecodeError,
    PartitionNotFound,
    ReadThroughThrottled,
    ServiceNotFound,
    ZooKeeperUnavailable,
)
from sentinel.events import (
    AuthChanged,
    ChangeEvent,
    ConnectionChanged,
    InstancesChanged,
    MetricsChanged,
    ServiceSpecChanged,
    ShardKeysChanged,
)
from sentinel.layout import (
    AUTH,
    METRICS,
    SERVICES,
    SHARD_INFO,
    auth_path,
    client_path,
    service_path,
)
from sentinel.ratelimit import TokenBucket
from sentinel.records import ClientRecord, InstanceRecord, MetricsRecord, ServiceSpec, fields_of
from sentinel.registry import ReadBudget, decode_children, pipelined_reads
from sentinel.shards.maps import DirectoryMap, ShardMap, new_map
from sentinel.shards.spec import (
    ShardPolicySpec,
    bucket_path,
    decode_bucket,
    policy_path,
    validate_key,
)
from sentinel.shards.store import read_key
from sentinel.strategies import Balancer, RoundRobin
from sentinel.telemetry import LookupCounts, auth_version_applied, observe_propagation
from sentinel.version import __version__
from sentinel.zkerrors import translate
from sentinel.zkprotocol import AddWatchMode, PersistentWatches, WatcherType

log = logging.getLogger(__name__)

Listener = Callable[[ChangeEvent], None]

_NO_CHANGES: Mapping[str, Any] = MappingProxyType({})
# Nodes per multi-read: a reply of a few hundred KB at most for registry-sized nodes.
MULTI_READ_BATCH = 256
# What a follower reads of one section of a service (its instances, or its metrics), at most.
# Registries hold thousands of instances per service (10,000 measured in the benchmarks), each
# node well under a KB; past these bounds a writer is flooding the section, and reading all of
# it would stall every new client's first lookup. The excess is skipped, counted and logged.
MAX_SECTION_NODES = 20_000
MAX_SECTION_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ServiceSnapshot:
    """Everything a lookup needs about one service, immutable.

    ``partitions`` holds every instance per partition and ``up`` the ones with status ``up``
    (sorted by label); the key ``None`` holds all of them, for services that are not sharded.
    ``metrics`` holds every metrics node by instance name (an instance's endpoint carries its
    own); ``invalid`` names the nodes that could not be decoded and are skipped.
    ``balancer`` is the service's default balancer and ``lookups`` its lookup counter, both
    carried from snapshot to snapshot; ``built_at`` is when this snapshot was built.
    ``auth`` is this client's decrypted credential, attached to every endpoint.
    """

    spec: ServiceSpec
    endpoints: Mapping[str, Endpoint]
    metrics: Mapping[str, MetricsRecord]
    partitions: Mapping[str | None, tuple[Endpoint, ...]]
    up: Mapping[str | None, tuple[Endpoint, ...]]
    invalid: frozenset[str]
    balancer: Balancer
    lookups: LookupCounts
    built_at: float
    auth: Credential | None = None

    @classmethod
    def build(
        cls,
        spec: ServiceSpec,
        endpoints: Mapping[str, Endpoint],
        metrics: Mapping[str, MetricsRecord],
        invalid: frozenset[str],
        balancer: Balancer,
        lookups: LookupCounts,
        auth: Credential | None = None,
    ) -> ServiceSnapshot:
        """Attach metrics and auth and index by partition, once per change, not per lookup."""
        endpoints = {name: _attach(e, metrics.get(name), auth) for name, e in endpoints.items()}
        groups: dict[str, list[Endpoint]] = {}
        for endpoint in endpoints.values():
            groups.setdefault(endpoint.partition, []).append(endpoint)
        partitions = {p: tuple(sorted(g, key=_LABEL)) for p, g in groups.items()}
        return cls(
            spec=spec,
            endpoints=endpoints,
            metrics=dict(metrics),
            partitions=_with_all(partitions),
            up=_with_all(
                {p: tuple(e for e in g if e.status == "up") for p, g in partitions.items()}
            ),
            invalid=invalid,
            balancer=balancer,
            auth=auth,
            lookups=lookups,
            built_at=time.time(),
        )

    def rebuilt(self, **changes: Any) -> ServiceSnapshot:
        """A new snapshot with some of spec, endpoints, metrics, invalid or auth replaced."""
        fields = {
            "spec": self.spec,
            "endpoints": self.endpoints,
            "metrics": self.metrics,
            "invalid": self.invalid,
            "balancer": self.balancer,
            "auth": self.auth,
            "lookups": self.lookups,
        }
        return ServiceSnapshot.build(**(fields | changes))

    def updated(
        self,
        invalid: frozenset[str],
        endpoints: Mapping[str, Endpoint | None] = _NO_CHANGES,
        metrics: Mapping[str, MetricsRecord | None] = _NO_CHANGES,
    ) -> ServiceSnapshot:
        """This snapshot with a few instances or metrics replaced (None: removed), or itself
        when that changes nothing.

        A change costs what it touches: untouched endpoints stay the same objects, and so do
        the tuples of untouched partitions (a policy's or balancer's memo of them stays valid);
        a touched partition's tuples are spliced at the changed labels. Only the copies of the
        name maps and of the key None's tuple (every instance) grow with the service, at C
        speed.
        """
        all_metrics = self.metrics
        metrics = {n: r for n, r in metrics.items() if r != all_metrics.get(n)}
        if metrics:
            all_metrics = dict(all_metrics)
            for name, record in metrics.items():
                if record is None:
                    del all_metrics[name]
                else:
                    all_metrics[name] = record
        touched: dict[str, tuple[Endpoint | None, Endpoint | None]] = {}
        for name in endpoints.keys() | metrics.keys():
            old = self.endpoints.get(name)
            bare = endpoints.get(name, old)  # None: the instance is gone
            new = None if bare is None else _attach(bare, all_metrics.get(name), self.auth)
            if not (new is old or new == old):
                touched[name] = (old, new)
        if not touched:
            if not metrics and invalid == self.invalid:
                return self
            return replace(self, metrics=all_metrics, invalid=invalid, built_at=time.time())
        all_endpoints = dict(self.endpoints)
        gone: dict[str, list[Endpoint]] = {}
        came: dict[str, list[Endpoint]] = {}
        for name, (old, new) in touched.items():
            if new is None:
                del all_endpoints[name]
            else:  # replaced in place: a dict without deleted slots copies at memcpy speed
                all_endpoints[name] = new
                came.setdefault(new.partition, []).append(new)
            if old is not None:
                gone.setdefault(old.partition, []).append(old)
        partitions = _spliced_index(self.partitions, gone, came)
        return replace(
            self,
            endpoints=all_endpoints,
            metrics=all_metrics,
            partitions=partitions,
            up=_spliced_index(self.up, _up(gone), _up(came), partitions),
            invalid=invalid,
            built_at=time.time(),
        )


_LABEL = operator.attrgetter("label")
_PLACE = operator.attrgetter("partition", "label")


def _with_all(
    by_partition: Mapping[str, tuple[Endpoint, ...]],
) -> dict[str | None, tuple[Endpoint, ...]]:
    """``by_partition`` in partition order, under the key None every endpoint by partition
    and label (the one partition's own tuple when there is one)."""
    order = sorted(by_partition)
    everything = by_partition[order[0]] if len(order) == 1 else ()
    if len(order) > 1:
        everything = tuple(itertools.chain.from_iterable(by_partition[p] for p in order))
    return {None: everything} | {p: by_partition[p] for p in order}


def _up(by_partition: Mapping[str, list[Endpoint]]) -> dict[str, list[Endpoint]]:
    """The endpoints with status ``up``, by partition (every partition kept)."""
    return {p: [e for e in group if e.status == "up"] for p, group in by_partition.items()}


def _spliced_index(
    index: Mapping[str | None, tuple[Endpoint, ...]],
    gone: Mapping[str, list[Endpoint]],
    came: Mapping[str, list[Endpoint]],
    partitions: Mapping[str | None, object] | None = None,
) -> dict[str | None, tuple[Endpoint, ...]]:
    """A partition index (``partitions``, or ``up`` given the new ``partitions``) with
    endpoints removed and added; untouched partitions keep their tuples. A partition with no
    instance left goes; one whose instances are all down keeps an empty ``up`` tuple."""
    by_partition = dict(index)
    everything = by_partition.pop(None)
    appeared = False
    for partition in gone.keys() | came.keys():
        appeared |= partition not in by_partition
        members = _spliced(
            by_partition.get(partition, ()),
            gone.get(partition, ()),
            came.get(partition, ()),
            _LABEL,
        )
        if members if partitions is None else partition in partitions:
            by_partition[partition] = members
        else:
            by_partition.pop(partition, None)
    if appeared:
        by_partition = dict(sorted(by_partition.items()))
    if len(by_partition) <= 1:
        everything = next(iter(by_partition.values()), ())
    else:  # spliced too: slicing copies references, where a concatenation iterates
        flat = itertools.chain.from_iterable
        everything = _spliced(everything, flat(gone.values()), flat(came.values()), _PLACE)
    return {None: everything} | by_partition


def _spliced(
    members: tuple[Endpoint, ...],
    removed: Iterable[Endpoint],
    added: Iterable[Endpoint],
    key: Callable[[Endpoint], Any],
) -> tuple[Endpoint, ...]:
    """``members`` (in ``key`` order) without ``removed``, with ``added``.

    The key is unique: a label within its partition (it names the node), or
    ``(partition, label)`` within the service.
    """
    spliced = list(members)
    for endpoint in removed:
        del spliced[bisect.bisect_left(spliced, key(endpoint), key=key)]
    for endpoint in added:
        bisect.insort(spliced, endpoint, key=key)
    return tuple(spliced)


def _attach(endpoint: Endpoint, record: MetricsRecord | None, auth: Credential | None) -> Endpoint:
    values, at = (NO_METRICS, None) if record is None else (record.values, record.measured_at)
    if endpoint.metrics == values and endpoint.metrics_at == at and endpoint.auth is auth:
        return endpoint
    return replace(endpoint, metrics=values, metrics_at=at, auth=auth)


@dataclass
class CacheStats:
    """Counters of the cache's work, for tests, benchmarks and operators."""

    decode_errors: int = 0
    read_throughs: int = 0
    negative_hits: int = 0
    resyncs: int = 0
    watch_events: int = 0
    auth_errors: int = 0
    session_events: dict[str, int] = field(default_factory=dict)  # by state reached
    throttled_reads: int = 0
    clients_write_failures: int = 0  # /clients entries refused; retried in the background
    over_limit: int = 0  # nodes left unread: their section passed MAX_SECTION_NODES or _BYTES


def _diff(
    service: str, old: Mapping[str, Endpoint], new: Mapping[str, Endpoint]
) -> list[ChangeEvent]:
    """The events between two endpoint maps: membership and state, then metrics alone.

    Auth is the same on every endpoint and has an event of its own (:class:`AuthChanged`).
    """
    added = tuple(new[n] for n in sorted(new.keys() - old.keys()))
    removed = tuple(old[n] for n in sorted(old.keys() - new.keys()))
    updated, metrics = [], []
    for name in sorted(old.keys() & new.keys()):
        before, after = old[name], new[name]
        # The same credential object on both sides unless the auth changed: copy only then.
        same_auth = before if before.auth is after.auth else replace(before, auth=after.auth)
        if same_auth == after:
            continue
        if replace(same_auth, metrics=after.metrics, metrics_at=after.metrics_at) == after:
            metrics.append((before, after))
        else:
            updated.append((before, after))
    events: list[ChangeEvent] = []
    if added or removed or updated:
        events.append(InstancesChanged(service, added, removed, tuple(updated)))
    if metrics:
        events.append(MetricsChanged(service, tuple(metrics)))
    return events


def _timed(section: str, decode: Callable[..., Any]) -> Callable[..., Any]:
    """``decode``, observing each node's propagation delay first."""

    def timed(name: str, path: str, data: bytes, stat: Any) -> Any:
        observe_propagation(section, stat)
        return decode(name, path, data, stat)

    return timed


def _directory_keys(shard_map: ShardMap | None) -> Mapping[str, str]:
    return shard_map.keys if isinstance(shard_map, DirectoryMap) else {}


def _key_diff(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, tuple[Any, Any]]:
    changes: dict[str, tuple[Any, Any]] = {k: (p, None) for k, p in old.items() if k not in new}
    changes.update((k, (old.get(k), p)) for k, p in new.items() if old.get(k) != p)
    return changes


@dataclass(frozen=True, slots=True)
class _Read:
    """One node of a multi-read, with a kazoo async result's ``get``."""

    outcome: Any  # (data, stat), or the exception of that node

    def get(self) -> Any:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


@dataclass(frozen=True, slots=True)
class _Task:
    """One piece of the worker's work: a bound method of the cache and its arguments.

    Equal tasks are equal values (a bound method equals another of the same object and
    function), so repeated events for one node merge while the first is still queued.
    ``changes_cache`` is False for work that only tells listeners.
    """

    run: Callable[..., None]
    args: tuple[Any, ...] = ()
    changes_cache: bool = True

    def __str__(self) -> str:
        return f"{self.run.__name__}{self.args}"


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
    ) -> None:
        self._zk = zk
        self._watches = watches
        # Persistent mode: the subtrees this session has a recursive watch on (a session's
        # end pops them on kazoo's thread), and the last event of each node not yet applied.
        self._followed: dict[str, bool] = {}
        self._latest: dict[str, str] = {}
        self._credentials = credentials
        self._announced_at: dict[str, float] = {}
        self._client_id = client_id
        self._nodes = nodes
        self._load_timeout = load_timeout
        self._announce = announce
        self._app = app
        # Read without a lock by the hot path; written only by the worker.
        self.snapshots: dict[str, ServiceSnapshot] = {}
        self.shard_maps: dict[str, ShardMap | None] = {}
        self._policy_users: dict[str, set[str]] = {}
        self._listeners: dict[str | None, list[Listener]] = {}
        self._negative: TTLCache[tuple[str, str], bool] = TTLCache(negative_size, negative_ttl)
        self._negative_lock = threading.Lock()
        self._tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()  # None: stop
        self._pending: set[_Task] = set()
        self._pending_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self.stats = CacheStats()
        self.connection_state = "connected"
        self.disconnected_at: float | None = None
        # Services restore() served and no re-sync has re-read yet: stale, and not yet in
        # /clients under this client's id (the re-sync announces them).
        self._restored: frozenset[str] = frozenset()
        self._state_lock = threading.Lock()  # held for assignments only (kazoo's thread takes it)
        self._resync_jitter = resync_jitter
        self._resync_at: float | None = None  # monotonic; only the worker touches it
        self._read_through_rate = read_through_rate
        self._read_budgets: dict[str, TokenBucket] = {}
        self._over_limit: set[str] = set()  # sections reported past the bounds (worker only)
        # Called on the worker after every task that may have changed the cache (the
        # last-known-good snapshot writer's mark_dirty); must not block.
        self.on_change: Callable[[], None] | None = None

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker and follow the connection state."""
        self._zk.add_listener(self._on_state)
        self._worker = threading.Thread(target=self._run, name="sentinel-cache", daemon=True)
        self._worker.start()

    def close(self) -> None:
        """Stop the worker, once it has run the tasks queued so far.

        Called on the worker itself (a listener closing the client), it stops after the task
        it is running, unwaited for: a thread cannot join itself, and the tasks queued behind
        it would only read from the session being closed.
        """
        self._zk.remove_listener(self._on_state)
        if self.on_worker():
            self._worker = None  # no longer the worker: it stops after this task (see _run)
            self._drop_queued()
            return
        self._tasks.put(None)
        if self._worker is not None:
            self._worker.join()
            self._worker = None

    def _drop_queued(self) -> None:
        """Closing on the worker: the tasks queued behind it will not run, and a reader
        waiting for a load hears so at once rather than at its timeout."""
        with contextlib.suppress(queue.Empty):
            while True:
                task = self._tasks.get_nowait()
                if task is None:
                    continue
                with self._pending_lock:  # queued again after a start(), it must be queued
                    self._pending.discard(task)
                if task.run == self._serve_load:
                    task.args[1].set_exception(ClientClosed("the client was closed"))

    def on_worker(self) -> bool:
        """Whether the calling thread is the worker (a listener, or a task, is running)."""
        return self._worker is threading.current_thread()

    # --- called by readers ------------------------------------------------------------------

    def load(self, service: str) -> ServiceSnapshot:
        """The snapshot of ``service``, loading it on the worker the first time.

        On the worker itself (a lookup made from a listener) the load runs there and then:
        queued, it would wait behind the listener that waits for it.
        """
        future: Future[ServiceSnapshot] = Future()
        if self.on_worker():
            self._serve_load(service, future)
            return future.result()
        self._tasks.put(_Task(self._serve_load, (service, future)))
        try:
            return future.result(timeout=self._load_timeout)
        except FutureTimeout:
            raise ZooKeeperUnavailable(
                f"loading service {service!r} took longer than {self._load_timeout:g}s"
            ) from None

    def prefetch(self, services: list[str]) -> None:
        """Load ``services`` on the worker, in the background (a forked child re-reading what
        its parent followed); a lookup meanwhile waits for its own service's load."""
        for service in services:
            self._tasks.put(_Task(self._serve_load, (service, Future())))

    def read_through(self, service: str, policy: str, key: object) -> str:
        """Procedure 1: a key the cached map does not hold, read from ZooKeeper directly.

        The answer is not written to the cache: the bucket's watch brings it, so the cache
        sees writes in ZooKeeper's order. Misses are remembered for a short while, so a flood
        of unknown keys does not become a flood of reads.
        """
        shard_map = self.shard_maps.get(policy)
        if isinstance(shard_map, DirectoryMap):
            text = validate_key(key)
            partition = shard_map.keys.get(text)  # an int key is cached under its string
            if partition is not None:
                return partition
            negative_key = (policy, text)
            with self._negative_lock:
                known_miss = negative_key in self._negative
            if known_miss:
                self.stats.negative_hits += 1
            elif not self._read_budget(service).take():
                self.stats.throttled_reads += 1
                raise ReadThroughThrottled(service, key, self._read_through_rate)
            else:
                self.stats.read_throughs += 1
                try:
                    partition = read_key(self._zk, shard_map.spec, text)
                except Exception as exc:
                    raise translate(exc, "a shard key read") from exc
                if partition is not None:
                    return partition
                with self._negative_lock:
                    self._negative[negative_key] = True
        if shard_map is None:
            reason = f"shard policy {policy!r} does not exist"
        elif isinstance(shard_map, DirectoryMap):
            reason = f"shard policy {policy!r} has no such key"
        else:
            reason = (
                f"it is below the first boundary of range policy {policy!r}, "
                f"or not a {shard_map.spec.key_type}"
            )
        raise PartitionNotFound(service, key, policy, reason)

    def _read_budget(self, service: str) -> TokenBucket:
        budget = self._read_budgets.get(service)
        if budget is None:  # a race creates two buckets; one wins, which is harmless
            budget = self._read_budgets.setdefault(service, TokenBucket(self._read_through_rate))
        return budget

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
        self._listeners = inherited._listeners

    def listen(self, service: str | None, listener: Listener) -> Callable[[], None]:
        """Add a listener for ``service`` (None: every service); returns its remover."""
        self._listeners.setdefault(service, []).append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):  # removing twice is harmless
                self._listeners.get(service, []).remove(listener)

        return remove

    # --- kazoo's thread: only queue work ------------------------------------------------------

    def _enqueue(self, task: _Task) -> None:
        with self._pending_lock:
            if task in self._pending:
                return
            self._pending.add(task)
        self._tasks.put(task)

    def _watch(self, event: WatchedEvent) -> None:
        if event.type == EventType.NONE:
            return  # the connection changed; the re-sync after reconnecting covers it
        self.stats.watch_events += 1
        task = self._task_for(event.type, event.path)
        if task is not None:
            self._enqueue(task)

    def _on_persistent(self, root: str, event: WatchedEvent) -> None:
        """An event of the recursive watch on ``root``'s subtree (persistent mode).

        A node's events are applied in one task that reads the latest event's kind when it
        runs: events queued meanwhile (changed, deleted, created again) coalesce into what is
        true last, with at most one read.
        """
        if event.type == EventType.NONE:  # the session ended and took the watch with it
            self._followed.pop(root, None)
            self._enqueue(_Task(self._follow_all))
            return
        self.stats.watch_events += 1
        if event.type == EventType.CHILD:  # a re-sync's report: a parent's children changed
            task = self._task_for(event.type, event.path, persistent=True)
        else:
            self._latest[event.path] = event.type
            task = _Task(self._apply_event, (event.path,))
        if task is not None:
            self._enqueue(task)

    def _task_for(self, kind: str, path: str, persistent: bool = False) -> _Task | None:
        """The work one watch event asks for, named by the node's path alone.

        ``persistent``: the node stays watched, so a deletion is applied with no read (a
        one-shot watch must be set again, by a read or an ``exists``), and a service's node
        changing is its spec alone (its children report their own changes).
        """
        parts = path.split("/")
        section = {SERVICES[1:]: "instances", METRICS[1:]: "metrics"}.get(parts[1])
        gone = persistent and kind == EventType.DELETED
        deleted = (True,) if gone else ()  # the ``gone`` argument of the no-read deletions
        if len(parts) == 3 and section == "instances":
            if kind == EventType.CHILD:
                return _Task(self._refresh_children, ("instances", parts[2]))
            if persistent:
                return _Task(self._drop_service if gone else self._refresh_spec, (parts[2],))
            return _Task(self._refresh_service, (parts[2],))
        if len(parts) == 3 and section == "metrics":  # children changed, or the section appeared
            if gone:
                return _Task(self._forget_section, ("metrics", parts[2]))
            return _Task(self._refresh_children, ("metrics", parts[2]))
        if len(parts) == 4 and section is not None:
            if gone:  # the recursive watch reports a creation again: nothing to read
                return _Task(self._forget_child, (section, parts[2], parts[3]))
            # One-shot, a deletion is read too: the node may exist again under its name (a
            # restart), and only this read sets a watch on the new node. The parent's
            # children watch cannot be relied on for it: a re-read of the children queued
            # before this event finds the name again and trusts it watched (see
            # _read_section), and its own watch may be spent, its re-read merged into that.
            return _Task(self._refresh_child, (section, parts[2], parts[3]))
        if len(parts) == 4 and parts[1] == AUTH[1:]:
            # only this client's own node is watched
            return _Task(self._refresh_auth, (parts[2], *deleted))
        if len(parts) == 3 and parts[1] == SHARD_INFO[1:]:
            if persistent and kind == EventType.CHILD:
                return None  # every bucket is watched itself; the rest is not the cache's
            return _Task(self._reload_policy, (parts[2], *deleted))
        if len(parts) == 4 and parts[1] == SHARD_INFO[1:] and len(parts[3]) == 4:
            with contextlib.suppress(ValueError):  # only buckets are watched; be sure anyway
                return _Task(self._refresh_bucket, (parts[2], int(parts[3], 16), *deleted))
        return None

    def _on_state(self, state: str) -> None:
        now = time.time()
        reached = {KazooState.CONNECTED: "connected", KazooState.SUSPENDED: "suspended"}
        reached_state = reached.get(state, "lost")
        events = self.stats.session_events
        events[reached_state] = events.get(reached_state, 0) + 1
        with self._state_lock:
            if state == KazooState.CONNECTED and self._restored:
                # Still serving a restored state: stale until the re-sync has re-read it.
                self._tasks.put(_Task(self._schedule_resync))
                return
            self.connection_state = reached_state
            if state == KazooState.CONNECTED:
                self.disconnected_at = None
            elif self.disconnected_at is None:
                self.disconnected_at = now
        # Listeners hear of the connection first, then of what the re-sync found.
        event = ConnectionChanged(reached_state, now)
        self._tasks.put(_Task(self._emit, (None, event), changes_cache=False))
        if state == KazooState.CONNECTED:
            self._tasks.put(_Task(self._schedule_resync))

    # --- the worker ---------------------------------------------------------------------------

    def _next_task(self) -> _Task | None:
        """The next queued task, or the re-sync once its jittered time has come."""
        if self._resync_at is None:
            return self._tasks.get()
        wait = self._resync_at - time.monotonic()
        with contextlib.suppress(queue.Empty):
            if wait > 0:
                return self._tasks.get(timeout=wait)
        self._resync_at = None
        return _Task(self._resync)

    def _run(self) -> None:
        worker = threading.current_thread()
        # Until close(), or a close() from a listener on this thread (then a start() may
        # have begun another worker already).
        while self._worker is worker and (task := self._next_task()) is not None:
            with self._pending_lock:
                self._pending.discard(task)
            try:
                task.run(*task.args)
                if self.on_change is not None and task.changes_cache:
                    self.on_change()
            except Exception as exc:
                if isinstance(translate(exc, ""), ZooKeeperUnavailable):
                    log.info("%s interrupted by the connection; the re-sync will cover it", task)
                else:
                    log.exception("cache task %s failed", task)

    def _serve_load(self, service: str, future: Future[ServiceSnapshot]) -> None:
        """A reader's :meth:`load`: the cached snapshot, or the service loaded now."""
        try:
            future.set_result(self.snapshots.get(service) or self._load_service(service))
        except Exception as exc:
            future.set_exception(translate(exc, f"loading service {service!r}"))

    def _schedule_resync(self) -> None:
        """After a reconnection: re-sync after the jitter; reconnections meanwhile share it."""
        if self._resync_at is None:
            self._resync_at = time.monotonic() + random.uniform(0, self._resync_jitter)

    def _emit(self, service: str | None, event: ChangeEvent) -> None:
        listeners = list(self._listeners.get(None, ()))
        if service is not None:
            listeners += self._listeners.get(service, ())
        else:  # connection events go to every listener
            for key, extra in list(self._listeners.items()):
                if key is not None:
                    listeners += extra
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                log.exception("listener %r failed on %r", listener, event)

    def _skip(self, exc: DecodeError) -> None:
        self.stats.decode_errors += 1
        log.warning("skipping %s", exc)

    # --- how ZooKeeper is followed: one-shot watches, or persistent recursive ones ------------

    @property
    def persistent(self) -> bool:
        """Persistent mode: the server has ZooKeeper 3.6's watches and they are not refused."""
        return self._watches is not None and self._watches.supported

    @property
    def _one_shot(self) -> Callable[[WatchedEvent], None] | None:
        """The watch a read sets: kazoo's one-shot one, or none under a recursive watch."""
        return None if self.persistent else self._watch

    def _watch_absent(self, path: str) -> None:
        """Learn when ``path`` (absent) is created: a recursive watch above it tells already."""
        if not self.persistent:
            self._zk.exists(path, watch=self._watch)

    def _reads(
        self, items: Iterable[Any], path_of: Callable[[Any], str]
    ) -> Iterator[tuple[Any, Any]]:
        """``(item, result)`` for the node of each item, setting one-shot watches in fallback
        mode; multi-reads of MULTI_READ_BATCH nodes each in persistent mode."""
        if not self.persistent:
            yield from pipelined_reads(self._zk, items, path_of, self._watch)
            return
        assert self._watches is not None
        pending = list(items)
        for start in range(0, len(pending), MULTI_READ_BATCH):
            batch = pending[start : start + MULTI_READ_BATCH]
            paths = [path_of(item) for item in batch]
            results = self._watches.get_many(data=paths).data
            for item, path in zip(batch, paths, strict=True):
                yield item, _Read(results[path])

    def _service_roots(self, service: str) -> list[str]:
        """The subtrees one recursive watch each follows for ``service``."""
        roots = [service_path(service), f"{METRICS}/{service}"]
        if self._credentials is not None:
            roots.append(auth_path(service, self._credentials.client))
        return roots

    def _follow(self, root: str) -> bool:
        """Persistent mode: watch ``root``'s subtree, unless this session does already; True
        when the watch is new (what it covers must be read now)."""
        if not self.persistent or root in self._followed:
            return False
        assert self._watches is not None
        self._followed[root] = True  # before the request: a session ending meanwhile pops it
        try:
            self._watches.add_watch(
                root,
                functools.partial(self._on_persistent, root),
                AddWatchMode.PERSISTENT_RECURSIVE,
                known=functools.partial(self._known_paths, root),
            )
        except BaseException:
            self._followed.pop(root, None)
            raise
        return True

    def _unfollow(self, roots: Iterable[str]) -> None:
        """Persistent mode: stop watching subtrees the cache no longer holds."""
        for root in roots:
            if self._followed.pop(root, None) and self._watches is not None:
                with contextlib.suppress(NoWatcherError):  # gone with a session meanwhile
                    self._watches.remove_watches(root, WatcherType.PERSISTENT_RECURSIVE)

    def _follow_all(self) -> None:
        """Persistent mode: watch again every subtree in use whose watch went with a session,
        and re-read those; with every watch in place (a resumed session) nothing is read."""
        for policy in list(self.shard_maps):
            if self._follow(policy_path(policy)):
                self._load_policy(policy)
        for service in list(self.snapshots):
            # every root is followed before the service is read (a list, not any())
            if any([self._follow(root) for root in self._service_roots(service)]):
                self._refresh_service(service)

    def _known_paths(self, root: str) -> list[str]:
        """The nodes the cache holds under ``root``, for the server to report which changed
        while the connection was down (see :meth:`PersistentWatches.add_watch`). Called on
        kazoo's connection thread: reads the immutable snapshots, no I/O, no lock."""
        _, top, name, *_ = root.split("/")
        if top == SHARD_INFO[1:]:
            shard_map = self.shard_maps.get(name)
            buckets = shard_map.spec.buckets if isinstance(shard_map, DirectoryMap) else 0
            return [root, *(bucket_path(name, i) for i in range(buckets))]
        snapshot = self.snapshots.get(name)
        if snapshot is None or top == AUTH[1:]:
            return [root]
        held = snapshot.endpoints if top == SERVICES[1:] else snapshot.metrics
        below = f"{root}/"
        invalid = [path for path in snapshot.invalid if path.startswith(below)]
        return [root, *(below + child for child in list(held)), *invalid]

    def _apply_event(self, path: str) -> None:
        """Persistent mode: apply the latest event of one node (see :meth:`_on_persistent`)."""
        kind = self._latest.pop(path, EventType.CHANGED)  # popped by a run meanwhile: read it
        task = self._task_for(kind, path, persistent=True)
        if task is not None:
            task.run(*task.args)

    # --- services -----------------------------------------------------------------------------

    def _read_spec(self, service: str, last_good: ServiceSpec | None = None) -> ServiceSpec:
        """The service's spec, watched. An unreadable one is skipped: a service already
        served keeps its ``last_good`` spec (one bad write must not unlist it everywhere)."""
        path = service_path(service)
        try:
            data, _ = self._zk.get(path, watch=self._one_shot)
        except NoNodeError:
            raise ServiceNotFound(service) from None
        try:
            return ServiceSpec.from_bytes(service, path, data)
        except DecodeError as exc:
            self._skip(exc)
            if last_good is not None:
                return last_good
            raise ServiceNotFound(service, f"has an unreadable spec: {exc}") from None

    def _read_section(
        self,
        section: str,
        service: str,
        known: ServiceSnapshot | None = None,
        first: Iterable[str] = (),
    ) -> tuple[dict[str, Any], set[str]]:
        """Decode the children of one section of ``service``, setting watches.

        ``section`` is ``instances`` (``/services/<service>``, as Endpoints) or ``metrics``
        (``/metrics/<service>``, as MetricsRecords). With ``known`` (a children event while
        watches are in place) only new children are read: the others' data watches report
        their own changes. A known name may be a new node (deleted and created again); its
        old node's watch fired with the deletion, and that event's task reads the new one.
        Returns the decoded children by name and the paths that failed. At most
        MAX_SECTION_NODES children and MAX_SECTION_BYTES of data are read (``first`` before
        the others: a metrics read takes the instances' own nodes first), the rest skipped
        and counted.
        """
        parent, field, decode = self._section(section, service)
        try:
            names = self._zk.get_children(parent, watch=self._one_shot)
        except NoNodeError:
            if section == "instances":
                raise ServiceNotFound(service) from None
            if self.persistent:  # followed since before the listing: its creation will tell
                return {}, set()
            if self._zk.exists(parent, watch=self._watch) is None:  # to learn when it appears
                return {}, set()
            # Created between the two reads: its data watch would never report the children.
            return self._read_section(section, service, known)
        decoded: dict[str, Any] = {}
        invalid: set[str] = set()
        unread = names
        if known is not None:
            current = getattr(known, field)
            decoded = {n: current[n] for n in names if n in current}
            invalid = {f"{parent}/{n}" for n in names if f"{parent}/{n}" in known.invalid}
            unread = [n for n in names if n not in decoded and f"{parent}/{n}" not in invalid]
            decode = _timed(section, decode)  # new children of a live service: a change
        preferred = set(first)
        if preferred:  # the preferred names first, the rest in their order
            unread = sorted(unread, key=lambda name: name not in preferred)
        room = max(MAX_SECTION_NODES - len(decoded) - len(invalid), 0)
        budget = ReadBudget(MAX_SECTION_BYTES, skipped=len(unread) - min(room, len(unread)))
        fresh, failed = decode_children(
            self._zk, parent, unread[:room], decode, reads=self._reads, budget=budget
        )
        if budget.skipped:
            self.stats.over_limit += budget.skipped
        if budget.skipped and parent not in self._over_limit:  # once, not per event
            self._over_limit.add(parent)
            log.warning(
                "%s has more than a follower reads (%d nodes, %d MiB): %d left unread; "
                "'sentinel doctor' names what is flooding it",
                parent,
                MAX_SECTION_NODES,
                MAX_SECTION_BYTES >> 20,
                budget.skipped,
            )
        for exc in failed.values():
            self._skip(exc)
        decoded.update(fresh)
        invalid.update(f"{parent}/{n}" for n in failed)
        return decoded, invalid

    @staticmethod
    def _section(section: str, service: str) -> tuple[str, str, Callable[..., Any]]:
        """Parent path, snapshot field and decoder of a section of ``service``."""
        if section == "instances":
            return (
                service_path(service),
                "endpoints",
                lambda name, path, data, stat: Endpoint.from_record(
                    InstanceRecord.from_bytes(service, name, path, data), joined=stat.czxid
                ),
            )
        return (
            f"{METRICS}/{service}",
            "metrics",
            lambda name, path, data, _: MetricsRecord.from_bytes(service, name, path, data),
        )

    def _decode(
        self, decode: Callable[..., Any], name: str, path: str, data: bytes, stat: Any
    ) -> Any:
        try:
            with fields_of(path):
                return decode(name, path, data, stat)
        except DecodeError as exc:
            self._skip(exc)
            return None

    def _load_service(self, service: str) -> ServiceSnapshot:
        roots = self._service_roots(service)
        for root in roots:  # before any read: what changes from now on is reported
            self._follow(root)
        try:
            spec = self._read_spec(service)
        except ServiceNotFound:
            self._unfollow(roots)
            raise
        endpoints, bad_instances = self._read_section("instances", service)
        metrics, bad_metrics = self._read_section("metrics", service, first=endpoints)
        if spec.shard_policy is not None:
            self._use_policy(spec.shard_policy, service)
        auth = self._read_auth(service)
        snapshot = ServiceSnapshot.build(
            spec,
            endpoints,
            metrics,
            frozenset(bad_instances | bad_metrics),
            RoundRobin(),
            LookupCounts(),
            auth,
        )
        self._confirm(service, auth)
        self.snapshots[service] = snapshot
        return snapshot

    def _confirm(self, service: str, auth: Credential | None) -> None:
        """Say that this client uses ``service`` with ``auth`` applied: in its ``/clients``
        node (which a rotation waits on, Procedure 2) and in its telemetry."""
        if self._announce:
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
        )
        self._nodes.put(
            path,
            record.to_bytes(path),
            prepare=functools.partial(ensure_clients_node, self._zk, service),
            keep_trying=True,
            on_failure=self._count_clients_failure,
        )

    def _count_clients_failure(self) -> None:
        self.stats.clients_write_failures += 1

    def _swap(
        self, service: str, snapshot: ServiceSnapshot, names: Iterable[str] | None = None
    ) -> None:
        """Serve ``snapshot`` and tell the listeners what changed; ``names``: the only
        instances that may have (None: any)."""
        old = self.snapshots[service]
        self.snapshots[service] = snapshot
        if old.spec != snapshot.spec:
            self._emit(service, ServiceSpecChanged(service, old.spec, snapshot.spec))
        before, after = old.endpoints, snapshot.endpoints
        if names is not None:  # a diff of what was touched, not of the whole service
            before = {n: before[n] for n in names if n in before}
            after = {n: after[n] for n in names if n in after}
        for event in _diff(service, before, after):
            self._emit(service, event)
        if old.auth != snapshot.auth:
            versions = [None if a is None else a.version for a in (old.auth, snapshot.auth)]
            self._emit(service, AuthChanged(service, *versions, snapshot.auth))
            # Confirmed only now that the listeners (the application's pools) have it.
            self._confirm(service, snapshot.auth)

    def _update(
        self,
        service: str,
        current: ServiceSnapshot,
        field: str,
        changes: Mapping[str, Any],
        invalid: frozenset[str],
    ) -> None:
        """Swap in ``current`` with a few children of one section (``field``) replaced, None
        for removed; nothing when that changes nothing."""
        snapshot = current.updated(invalid, **{field: changes})
        if snapshot is not current:
            self._swap(service, snapshot, changes)

    # --- auth ---------------------------------------------------------------------------------

    def _read_auth(self, service: str) -> Credential | None:
        """This client's newest readable credential for ``service``, setting the watch.

        Never one older than a credential applied before (see :mod:`sentinel.auth.reader`):
        a replayed old version is logged, counted in ``auth_errors``, and the applied one kept.
        """
        if self._credentials is None:
            return None
        path = auth_path(service, self._credentials.client)
        try:
            data, stat = self._zk.get(path, watch=self._one_shot)
        except NoNodeError:
            self._watch_absent(path)
            self._credentials.forget(service)
            return None
        observe_propagation("auth", stat)
        try:
            credential, errors = self._credentials.newest(service, path, data)
        except DecodeError as exc:
            credential, errors = None, [exc]
        for error in errors:
            self.stats.auth_errors += 1
            log.warning("skipping a credential: %s", error)  # messages hold no secrets
        return credential

    def _refresh_auth(self, service: str, gone: bool = False) -> None:
        """After an event on this client's credential node; ``gone``: it was deleted (no
        read: there is no credential)."""
        current = self.snapshots.get(service)
        if current is None:  # dropped since the event (or never followed)
            return
        if gone and self._credentials is not None:
            self._credentials.forget(service)
        auth = None if gone else self._read_auth(service)
        if auth != current.auth:
            self._swap(service, current.rebuilt(auth=auth))

    def _refresh_service(self, service: str) -> None:
        """Re-read the spec and every node of the service, setting the watches again."""
        current = self.snapshots.get(service)
        if current is None:  # dropped since the event (or never followed)
            return
        try:
            spec = self._read_spec(service, current.spec)
            endpoints, bad_instances = self._read_section("instances", service)
        except ServiceNotFound:
            self._drop_service(service)
            return
        metrics, bad_metrics = self._read_section("metrics", service, first=endpoints)
        if spec.shard_policy is not None:
            self._use_policy(spec.shard_policy, service)
        self._swap(
            service,
            current.rebuilt(
                spec=spec,
                endpoints=endpoints,
                metrics=metrics,
                invalid=frozenset(bad_instances | bad_metrics),
                auth=self._read_auth(service),
            ),
        )

    def _refresh_children(self, section: str, service: str) -> None:
        """After a children event: read the new children of one section."""
        current = self.snapshots.get(service)
        if current is None:  # dropped since the event (or never followed)
            return
        parent, field, _ = self._section(section, service)
        try:
            children, bad = self._read_section(section, service, current)
        except ServiceNotFound:
            self._drop_service(service)
            return
        known = getattr(current, field)
        changes = dict.fromkeys(known.keys() - children.keys())  # removed: None
        changes.update((n, children[n]) for n in children.keys() - known.keys())
        others = {path for path in current.invalid if not path.startswith(f"{parent}/")}
        self._update(service, current, field, changes, frozenset(others | bad))

    def _refresh_child(self, section: str, service: str, name: str) -> None:
        """After a data event (one-shot: a deletion too): read one child again (it may be
        gone, created again, or now invalid), setting its watch."""
        current = self.snapshots.get(service)
        if current is None:  # dropped since the event (or never followed)
            return
        parent, field, decode = self._section(section, service)
        path = f"{parent}/{name}"
        known = getattr(current, field)
        if name not in known and len(known) >= MAX_SECTION_NODES:
            self.stats.over_limit += 1  # a flooded section's newcomer: left unread
            return
        invalid = current.invalid - {path}
        try:
            data, stat = self._zk.get(path, watch=self._one_shot)
        except NoNodeError:
            value = None
        else:
            observe_propagation(section, stat)
            value = self._decode(decode, name, path, data, stat)
            if value is None:
                invalid |= {path}
        self._update(service, current, field, {name: value}, invalid)

    def _refresh_spec(self, service: str) -> None:
        """Persistent mode, after an event on the service's node: re-read its spec alone."""
        current = self.snapshots.get(service)
        if current is None:  # dropped since the event (or never followed)
            return
        try:
            spec = self._read_spec(service, current.spec)
        except ServiceNotFound:
            self._drop_service(service)
            return
        if spec.shard_policy is not None:
            self._use_policy(spec.shard_policy, service)
        if spec != current.spec:
            self._swap(service, current.rebuilt(spec=spec))

    def _forget_section(self, section: str, service: str) -> None:
        """Persistent mode, after a section's parent was deleted: drop its children, no read."""
        current = self.snapshots.get(service)
        if current is None:  # dropped since the event (or never followed)
            return
        parent, field, _ = self._section(section, service)
        invalid = {path for path in current.invalid if not path.startswith(f"{parent}/")}
        changes = dict.fromkeys(getattr(current, field))
        self._update(service, current, field, changes, frozenset(invalid))

    def _forget_child(self, section: str, service: str, name: str) -> None:
        """Persistent mode, after a deletion event: drop the child, with no round trip to
        ZooKeeper (the recursive watch reports the node if it is created again)."""
        current = self.snapshots.get(service)
        if current is None:  # dropped since the event (or never followed)
            return
        parent, field, _ = self._section(section, service)
        invalid = current.invalid - {f"{parent}/{name}"}
        self._update(service, current, field, {name: None}, invalid)

    def _drop_service(self, service: str) -> None:
        old = self.snapshots.pop(service, None)
        if old is None:
            return
        self._unfollow(self._service_roots(service))
        self._emit(service, ServiceSpecChanged(service, old.spec, None))
        if old.endpoints:
            self._emit(service, InstancesChanged(service, removed=tuple(old.endpoints.values())))

    # --- shard maps ---------------------------------------------------------------------------

    def _use_policy(self, policy: str, service: str) -> None:
        self._policy_users.setdefault(policy, set()).add(service)
        if policy not in self.shard_maps:
            self._load_policy(policy)

    def _reload_policy(self, policy: str, gone: bool = False) -> None:
        """After an event on a policy's node: re-read it if the cache still holds it;
        ``gone``: it was deleted (no read)."""
        if policy in self.shard_maps:
            self._load_policy(policy, gone)

    def _load_policy(self, policy: str, gone: bool = False) -> None:
        """(Re-)read a policy's spec and, for a directory, every bucket, setting watches
        (following the policy's subtree first in persistent mode)."""
        path = policy_path(policy)
        self._follow(path)
        old = self.shard_maps.get(policy)
        try:
            if gone:
                raise NoNodeError
            data, _ = self._zk.get(path, watch=self._one_shot)
            spec = ShardPolicySpec.from_bytes(policy, path, data)
        except NoNodeError:
            self._watch_absent(path)
            spec = None
        except DecodeError as exc:
            self._skip(exc)
            if old is not None:
                return  # as with a service spec: one bad write must not unshard everyone
            spec = None
        if spec is None:
            self.shard_maps[policy] = None
            changes = _key_diff(_directory_keys(old), {})
            if changes:
                self._emit_keys(policy, changes)
            return
        keep = isinstance(old, DirectoryMap) and old.spec == spec
        shard_map: ShardMap = old if keep else new_map(spec)  # type: ignore[assignment]
        changes: dict[str, tuple[Any, Any]] = {}
        if isinstance(shard_map, DirectoryMap):
            reads = self._reads(range(spec.buckets), lambda i: bucket_path(policy, i))
            for index, result in reads:
                bucket_changes = shard_map.apply_bucket(
                    index, self._bucket_keys(policy, index, result)
                )
                if keep:
                    changes.update(bucket_changes)
        if not keep and policy in self.shard_maps:
            # A first load has nobody to tell; diffing a million keys would only cost memory.
            changes = _key_diff(_directory_keys(old), _directory_keys(shard_map))
        self.shard_maps[policy] = shard_map
        if changes:
            self._emit_keys(policy, changes)

    def _bucket_keys(self, policy: str, index: int, result: Any) -> dict[str, str]:
        path = bucket_path(policy, index)
        try:
            data, _ = result.get()
            return decode_bucket(path, data)
        except NoNodeError:
            return {}
        except DecodeError as exc:
            self._skip(exc)
            return {}

    def _refresh_bucket(self, policy: str, index: int, gone: bool = False) -> None:
        """After an event on a bucket: re-read it; ``gone``: it was deleted (no read)."""
        shard_map = self.shard_maps.get(policy)
        if not isinstance(shard_map, DirectoryMap) or index >= shard_map.spec.buckets:
            return
        keys: dict[str, str] = {}
        if not gone:
            result = self._zk.get_async(bucket_path(policy, index), watch=self._one_shot)
            keys = self._bucket_keys(policy, index, result)
            if result.successful():
                observe_propagation("shard_info", result.value[1])
        changes = shard_map.apply_bucket(index, keys)
        if changes:
            self._emit_keys(policy, changes)

    def _emit_keys(self, policy: str, changes: dict[str, tuple[Any, Any]]) -> None:
        for service in sorted(self._policy_users.get(policy, ())):
            self._emit(service, ShardKeysChanged(service, policy, changes))

    # --- re-sync ------------------------------------------------------------------------------

    def _resync(self) -> None:
        """After a reconnection: re-read what the connection may have missed and report only
        real changes. One-shot watches were dropped: everything in use is read. Persistent
        watches are kept within the session (the server reported what changed meanwhile, and
        those events are applied as any): only subtrees whose watch went with an ended session
        are read again."""
        if self.persistent:
            self._follow_all()
        else:
            for policy in list(self.shard_maps):
                self._load_policy(policy)
            for service in list(self.snapshots):
                self._refresh_service(service)
        self.stats.resyncs += 1
        if self._restored:
            self._end_restored()

    def _end_restored(self) -> None:
        """The first re-sync after :meth:`restore` is done: announce the services restored
        (this client uses them, with their credential applied) and stop marking them stale."""
        for service in sorted(self._restored & self.snapshots.keys()):
            self._confirm(service, self.snapshots[service].auth)
        with self._state_lock:
            self._restored = frozenset()
            if self._zk.state != KazooState.CONNECTED:
                return  # lost again meanwhile: _on_state has said so
            self.connection_state = "connected"
            self.disconnected_at = None
        self._emit(None, ConnectionChanged("connected", time.time()))
