"""The shard manager daemon: replicas elect a leader; the leader places requested keys.

Each replica registers itself as an instance of ``shard-manager-<policy>`` and follows that
service's :class:`~sentinel.topology.Topology`; the first member leads, and a follower takes
over when the leader's session ends. Clients ask for a key with ``request_placement``, which
leaves a request node under ``/shard_info/<policy>/requests``. The leader assigns each
requested key to the partition with the fewest keys (among the policy's declared partitions)
and only then deletes the request; the assignment is a compare-and-set that keeps an existing
assignment, so a key is placed once even if a leader dies between placing and deleting, or two
replicas briefly both believe they lead. The leader also raises an alert when a partition in
use loses its last live instance of a service sharded by the policy.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading

from kazoo.exceptions import NoNodeError
from kazoo.recipe.watchers import ChildrenWatch

from sentinel import telemetry
from sentinel.auth.grants import not_granted
from sentinel.client import Sentinel
from sentinel.errors import AccessDenied, DecodeError, SentinelError, ValidationError
from sentinel.events import ChangeEvent, InstancesChanged, Reporter
from sentinel.registry.layout import SHARD_MANAGER_SERVICE_PREFIX
from sentinel.registry.reads import services_sharded_by
from sentinel.registry.records import decode
from sentinel.shards.placement import place_key, requests_path
from sentinel.shards.replication import PlacementCopies
from sentinel.shards.store import iter_assignments, read_spec
from sentinel.topology import Topology, TopologyEvent

log = logging.getLogger(__name__)


def manager_service(policy: str) -> str:
    """The service the replicas of a policy's shard manager register as."""
    return f"{SHARD_MANAGER_SERVICE_PREFIX}{policy}"


class ShardManager:
    """One replica of the shard manager of ``policy``; ``report(kind, details)`` hears of
    ``leader``, ``follower``, ``placed`` and ``alert``. With ``copies``, each placement is also
    copied to the other regions (:class:`~sentinel.shards.replication.PlacementCopies`, which
    reports ``replicated``, ``behind`` and ``caught up``)."""

    def __init__(
        self,
        sentinel: Sentinel,
        policy: str,
        report: Reporter,
        copies: PlacementCopies | None = None,
    ) -> None:
        self._sentinel = sentinel
        self._copies = copies
        self._zk = sentinel.session.zk
        self.policy = policy
        self._report = report
        self._spec = read_spec(self._zk, policy)
        if self._spec.kind != "directory" or not self._spec.partitions:
            raise ValidationError(
                f"shard policy {policy!r} must be a directory policy with declared partitions "
                "for the shard manager to place keys"
            )
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._leading = threading.Event()
        self._alerted: set[tuple[str, str]] = set()
        self._alert_lock = threading.Lock()  # the loop and the cache's thread both check
        try:
            self.registration = sentinel.register(
                manager_service(policy),
                policy,
                socket.gethostname(),
                1 + os.getpid() % 65535,
                label=sentinel.client_id,
            )
        except AccessDenied as exc:
            raise not_granted("shard_manager", manager_service(policy)) from exc
        self._zk.ensure_path(requests_path(policy))
        self._topology = Topology(sentinel, manager_service(policy))
        self._topology.add_listener(self._on_topology)
        ChildrenWatch(self._zk, requests_path(policy), self._on_requests)
        self._watched_services: set[str] = set()

    def _on_topology(self, event: TopologyEvent) -> None:
        view = event.new_view
        if view is None:
            return
        leading = view.leader_is(self.registration)
        if leading and not self._leading.is_set():
            self._leading.set()
            telemetry.SHARD_LEADER.labels(self.policy).set(1)
            self._report("leader", {"view": view.id, "members": len(view.members)})
            self._wake.set()
        elif not leading and (self._leading.is_set() or event.old_view is None):
            self._leading.clear()
            telemetry.SHARD_LEADER.labels(self.policy).set(0)
            leader = view.leader.label if view.leader else None
            self._report("follower", {"leader": leader})

    def _on_requests(self, children: list[str]) -> None:
        self._wake.set()  # kazoo's thread: only wake the loop

    def stop(self) -> None:
        """Leave the replica set (the next one leads) and stop placing."""
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        """Place requested keys while leading, until :meth:`stop`."""
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if self._stop.is_set() or not self._leading.is_set():
                continue
            try:
                self._watch_users()
                self._place_pending()
                if self._copies is not None:
                    self._copies.flush()
            except SentinelError as exc:
                log.warning("placement round failed: %s", exc)
            except Exception as exc:  # ZooKeeper trouble: the loop retries within a second
                log.warning("placement round interrupted: %s", exc)
        self._sentinel.deregister(self.registration)
        if self._copies is not None:
            self._copies.close()

    def _place_pending(self) -> None:
        try:
            names = sorted(self._zk.get_children(requests_path(self.policy)))
        except NoNodeError:
            return
        if not names:
            return
        # Re-read every round: another leader may have placed keys since this one last led.
        counts = collections.Counter(p for _, p in iter_assignments(self._zk, self.policy))
        for name in names:
            if not self._leading.is_set() or self._stop.is_set():
                return
            path = f"{requests_path(self.policy)}/{name}"
            try:
                data, _ = self._zk.get(path)
                key = decode(path, data)["key"]
            except NoNodeError:
                continue
            except (DecodeError, KeyError):
                log.warning("dropping unreadable placement request %s", path)
                self._zk.delete(path)
                continue
            choice = min(self._spec.partitions, key=lambda p: (counts[p], p))
            placed = place_key(self._zk, self._spec, key, choice)
            if self._copies is not None:
                self._copies.add(key, placed)  # what this region holds, placed now or before
            if placed == choice:
                counts[choice] += 1
                telemetry.SHARD_PLACEMENTS.labels(self.policy).inc()
                self._report("placed", {"key": key, "partition": placed})
            self._zk.delete(path)  # only once the key is assigned: a crash before is retried

    def _watch_users(self) -> None:
        """Follow the services sharded by the policy, to alert on empty partitions."""
        for service in services_sharded_by(self._zk, self.policy):
            if service in self._watched_services:
                continue
            self._watched_services.add(service)
            self._sentinel.prefetch(service)
            self._sentinel.listen(service, self._on_service_change)
            self._check_partitions(service)

    def _on_service_change(self, event: ChangeEvent) -> None:
        if isinstance(event, InstancesChanged) and self._leading.is_set():
            self._check_partitions(event.service)

    def _check_partitions(self, service: str) -> None:
        live = {e.partition for e in self._sentinel.cached_instances(service) if e.status == "up"}
        with self._alert_lock:
            for partition in self._spec.partitions or ():
                if partition in live:
                    self._alerted.discard((service, partition))
                elif (service, partition) not in self._alerted:
                    self._alerted.add((service, partition))
                    telemetry.SHARD_ALERTS.labels(self.policy).inc()
                    self._report(
                        "alert",
                        {"service": service, "partition": partition, "problem": "no live instance"},
                    )
