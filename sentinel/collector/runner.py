"""The metric collector: collect each instance on its own schedule and publish to ``/metrics``.

Every collector is a member of a collector cluster: it registers as an instance of
``metric-collector-<cluster>`` and follows that service's :class:`~sentinel.topology.Topology`.
The instances to collect (every live instance of each configured service, from the client's
cache) are split among the live members by rendezvous hashing: a collector collects the
instances for which it has the highest score. When a member dies, ZooKeeper removes its node
after its session timeout and only its instances move, each to the member with the next
highest score; a newcomer takes only the instances it now scores highest for.

The members of a cluster must share one configuration, or they would split instances that
only some of them collect, and a member started with a broken or test configuration would
take the fleet's work. Each member publishes its configuration's digest with its
registration; the cluster's configuration is the one most members run (on a tie, the one
whose first member joined earliest), and a member whose digest differs joins but takes no
work: it reports ``refused`` (and logs why) until its configuration is the cluster's.

Each owned instance is collected every ``interval`` (plus or minus ``jitter``) on a worker
pool, never more than once at a time, so a slow or failing instance delays only itself. A
failure is counted (``sentinel_collector_scrape_errors_total``) and publishes nothing: the
instance's last good metrics keep their ``measured_at`` and grow old, so policies that limit
the age of metrics (``MinLag(max_age=...)``, ``FreshMetrics``) see them as stale.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sentinel import telemetry
from sentinel.auth.grants import not_granted
from sentinel.client import Sentinel
from sentinel.collector.config import CollectorConfig, ServiceCollection
from sentinel.errors import (
    AccessDenied,
    SentinelError,
    ServiceNotFound,
    SourceTimeout,
    ValidationError,
    ZooKeeperUnavailable,
)
from sentinel.events import ChangeEvent, InstancesChanged, Reporter, ServiceSpecChanged
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.layout import COLLECTOR_SERVICE_PREFIX, instance_name
from sentinel.rendezvous import rendezvous_score
from sentinel.topology import Topology

log = logging.getLogger(__name__)
# How often a configured service that does not exist yet is looked for again.
MISSING_SERVICE_RETRY = 1.0
# The member registration's property holding its configuration's digest.
CONFIG_PROPERTY = "config"


def member_service(cluster: str) -> str:
    """The service the members of a collector cluster register as."""
    return f"{COLLECTOR_SERVICE_PREFIX}{cluster}"


def _digest_of(member: Endpoint) -> str | None:
    """The configuration digest a member published; None when it published none or
    something else (whoever may register there writes the property): such a member neither
    counts towards a configuration nor takes work."""
    digest = member.properties.get(CONFIG_PROPERTY)
    return digest if isinstance(digest, str) else None


def owner(key: str, members: Sequence[str]) -> str | None:
    """The member (by node name) that collects ``key``: the highest rendezvous score."""
    return max(members, key=lambda member: rendezvous_score(key, member)) if members else None


@dataclass
class _Target:
    """An instance this collector owns: how to collect it and its scheduling state."""

    collection: ServiceCollection
    endpoint: Endpoint
    entry: int = 0  # the heap entry that is current; older ones are skipped
    failing: bool = False


class MetricCollector:
    """One member of a collector cluster; ``report(kind, details)`` hears of ``assigned``
    (the instances owned changed), ``refused`` (this member's configuration is not its
    cluster's, so it takes no work), ``failing`` and ``recovered`` (an instance's collections
    started or stopped failing).

    Use :meth:`run` in a daemon's main thread, or :meth:`start` / :meth:`stop` (also as a
    context manager) to run it in the background.
    """

    def __init__(
        self, sentinel: Sentinel, config: CollectorConfig, report: Reporter | None = None
    ) -> None:
        self._sentinel = sentinel
        self.config = config
        self._report = report or (lambda kind, details: None)
        self._lock = threading.Lock()  # targets, the heap and the in-flight set
        self._targets: dict[tuple[str, str], _Target] = {}
        self._due: list[tuple[float, int, tuple[str, str]]] = []
        self._entries = itertools.count(1)
        self._in_flight: set[tuple[str, str]] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._dirty = True
        self._followed: set[str] = set()
        self._listening: set[str] = set()
        self._last_assignment: dict[str, int] | None = None
        self._refused_for: str | None = None  # the cluster's configuration this member is not
        self._random = random.Random()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(config.workers, thread_name_prefix="sentinel-collect")
        try:
            self.registration = sentinel.register(
                member_service(config.cluster),
                config.cluster,
                socket.gethostname(),
                1 + os.getpid() % 65535,
                label=sentinel.client_id,
                properties={CONFIG_PROPERTY: config.digest},
            )
        except AccessDenied as exc:
            raise not_granted("collector", member_service(config.cluster)) from exc
        self.member = instance_name(config.cluster, sentinel.client_id)
        self._topology = Topology(sentinel, member_service(config.cluster))
        self._topology.add_listener(lambda _event: self._changed())

    def __enter__(self) -> MetricCollector:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def owned(self) -> frozenset[tuple[str, str]]:
        """The ``(service, instance name)`` pairs this member collects now."""
        with self._lock:
            return frozenset(self._targets)

    @property
    def members(self) -> tuple[str, ...]:
        """The node names of the cluster's live members, in joining order."""
        return tuple(m.name for m in self._topology.view.members)

    @property
    def peers(self) -> tuple[str, ...]:
        """The live members that run the cluster's configuration, in joining order: those
        that split the instances. The cluster's configuration is the one most members run;
        on a tie, the one whose first member joined earliest."""
        return tuple(m.name for m in self._cluster_members())

    def _cluster_members(self) -> tuple[Endpoint, ...]:
        groups: dict[str, list[Endpoint]] = {}
        for member in self._topology.view.members:  # in joining order
            digest = _digest_of(member)
            if digest is not None:  # a member without a digest runs no configuration
                groups.setdefault(digest, []).append(member)
        # max() keeps the first of equals: the group whose first member joined earliest.
        return tuple(max(groups.values(), key=len, default=()))

    def start(self) -> MetricCollector:
        """Run in a background thread; returns ``self``."""
        self._thread = threading.Thread(target=self.run, name="sentinel-collector", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop collecting and leave the cluster (the others take this member's instances)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def run(self) -> None:
        """Collect until :meth:`stop`."""
        try:
            while not self._stop.is_set():
                missing = self._follow_services()
                if self._dirty:
                    self._reassign()
                wait = self._dispatch()
                if missing:
                    wait = (
                        MISSING_SERVICE_RETRY if wait is None else min(wait, MISSING_SERVICE_RETRY)
                    )
                self._wake.wait(wait)
                self._wake.clear()
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._topology.close()
            try:
                self._sentinel.deregister(self.registration)
            except SentinelError as exc:
                log.info("could not leave the collector cluster: %s", exc)

    # --- membership and ownership ---------------------------------------------------------------

    def _changed(self, event: ChangeEvent | None = None) -> None:
        if event is None or isinstance(event, InstancesChanged | ServiceSpecChanged):
            self._dirty = True
            self._wake.set()

    def _follow_services(self) -> bool:
        """Load the configured services not loaded yet; True if some do not exist yet."""
        missing = False
        for collection in self.config.services:
            service = collection.service
            if service in self._followed:
                continue
            if service not in self._listening:
                self._sentinel.listen(service, self._changed)
                self._listening.add(service)
            try:
                self._sentinel.prefetch(service)
            except ServiceNotFound:
                missing = True
                continue
            except ZooKeeperUnavailable as exc:
                log.info("cannot load %s yet: %s", service, exc)
                missing = True
                continue
            self._followed.add(service)
            self._dirty = True
        return missing

    def _reassign(self) -> None:
        """Recompute the instances this member owns from the view and the cached instances."""
        self._dirty = False
        cluster = self._cluster_members()
        members = tuple(m.name for m in cluster)
        wanted: dict[tuple[str, str], tuple[ServiceCollection, Endpoint]] = {}
        self._check_agreement(cluster)
        if self.member in members:  # absent while re-registering, or refused
            for collection in self.config.services:
                for endpoint in self._sentinel.cached_instances(collection.service):
                    key = (collection.service, endpoint.name)
                    if collection.wants(endpoint.partition) and (
                        owner(f"{key[0]}/{key[1]}", members) == self.member
                    ):
                        wanted[key] = (collection, endpoint)
        now = time.monotonic()
        with self._lock:
            for key in self._targets.keys() - wanted.keys():
                del self._targets[key]
            for key, (collection, endpoint) in wanted.items():
                target = self._targets.get(key)
                if target is None:
                    target = self._targets[key] = _Target(collection, endpoint)
                    self._schedule(key, target, now + self._random.uniform(0, collection.jitter))
                else:
                    target.endpoint = endpoint  # host, port or status may have changed
        counts = {c.service: 0 for c in self.config.services}
        for service, _ in wanted:
            counts[service] += 1
        telemetry.COLLECTOR_MEMBERS.set(len(members))
        for service, count in counts.items():
            telemetry.COLLECTOR_INSTANCES.labels(service).set(count)
        if counts != self._last_assignment:
            self._last_assignment = counts
            self._report("assigned", {"members": len(members), "instances": counts})

    def _check_agreement(self, cluster: tuple[Endpoint, ...]) -> None:
        """Report ``refused`` when this member is live but not one of ``cluster`` (the
        members that run the cluster's configuration; once per change of that
        configuration), and log why."""
        live = any(m.name == self.member for m in self._topology.view.members)
        if not live or not cluster or any(m.name == self.member for m in cluster):
            self._refused_for = None
            return
        digest = _digest_of(cluster[0])
        if self._refused_for == digest:
            return
        self._refused_for = digest
        details = {
            "cluster": self.config.cluster,
            "config": self.config.digest,
            "cluster_config": digest,
            "members": len(cluster),
        }
        log.error(
            "collector cluster %r runs configuration %s (%d members); this member's is %s, so "
            "it takes no work: start it with the same configuration, or in another cluster "
            "(the 'cluster' setting)",
            details["cluster"],
            digest,
            len(cluster),
            self.config.digest,
        )
        self._report("refused", details)

    # --- scheduling -----------------------------------------------------------------------------

    def _schedule(self, key: tuple[str, str], target: _Target, when: float) -> None:
        """Put ``target``'s next collection on the heap (the lock is held)."""
        target.entry = next(self._entries)
        heapq.heappush(self._due, (when, target.entry, key))

    def _dispatch(self) -> float | None:
        """Start every collection that is due; return the seconds until the next one."""
        now = time.monotonic()
        with self._lock:
            while self._due and self._due[0][0] <= now:
                _, entry, key = heapq.heappop(self._due)
                target = self._targets.get(key)
                if target is None or target.entry != entry or key in self._in_flight:
                    continue  # no longer owned, or rescheduled since
                self._in_flight.add(key)
                self._pool.submit(self._collect, key, target)
            return max(self._due[0][0] - now, 0.0) if self._due else None

    def _collect(self, key: tuple[str, str], target: _Target) -> None:
        collection, endpoint = target.collection, target.endpoint
        labels = (collection.service, collection.source.type)
        telemetry.SCRAPES.labels(*labels).inc()
        started = time.monotonic()
        reason = problem = None
        try:
            values = collection.source.collect(endpoint, collection.timeout)
            elapsed = time.monotonic() - started
            if elapsed > collection.timeout:
                raise SourceTimeout(
                    f"took {elapsed:.3g}s, over the {collection.timeout:g}s timeout"
                )
            if not self._stop.is_set():
                self._sentinel.update_metrics(
                    collection.service,
                    endpoint.partition,
                    endpoint.label,
                    values,
                    measured_at=time.time(),
                )
        except SourceTimeout as exc:
            reason, problem = "timeout", str(exc)
        except ValidationError as exc:
            reason, problem = "invalid", str(exc)
        except ZooKeeperUnavailable as exc:
            reason, problem = "publish", str(exc)
        except Exception as exc:  # SourceError, or a plug-in's own bug: counted, never fatal
            reason, problem = "error", str(exc) or type(exc).__name__
        telemetry.SCRAPE_DURATION.labels(*labels).observe(time.monotonic() - started)
        if reason is not None:
            telemetry.SCRAPE_ERRORS.labels(*labels, reason).inc()
        self._note_outcome(target, key, reason, problem)
        with self._lock:
            self._in_flight.discard(key)
            if self._targets.get(key) is target:
                jitter = self._random.uniform(-collection.jitter, collection.jitter)
                self._schedule(key, target, started + collection.interval + jitter)
        self._wake.set()

    def _note_outcome(
        self, target: _Target, key: tuple[str, str], reason: str | None, problem: str | None
    ) -> None:
        """Report an instance's first failure and its recovery, not every collection."""
        details = {"service": key[0], "instance": key[1]}
        if reason is not None and not target.failing:
            target.failing = True
            log.warning("collecting %s/%s failed (%s): %s", *key, reason, problem)
            self._report("failing", {**details, "reason": reason, "problem": problem})
        elif reason is None and target.failing:
            target.failing = False
            self._report("recovered", details)
