"""Returning home after a failover, without flapping: the hold-down on the local region.

A client whose lookups of a service's partition failed over to another region (the local
region had no eligible instance there) marks the partition *away* (:meth:`ReturnHome.away`).
When the local region has instances with status ``up`` in it again, lookups do not return at
once: the cache holds the partition back (:attr:`ServiceSnapshot.held
<sentinel.cache.views.ServiceSnapshot.held>`, its ``up`` tuple empty, so lookups keep failing
over) until it has had an instance up for ``return_after`` seconds without a gap; then the
hold ends and lookups are local again. A local instance that comes and goes faster than that
never draws the clients back, and the bound is stated: a client returns within
``return_after`` (plus the change's propagation and a timer's wake-up) of the local region
having an instance up again, and not before.

The state is changed by lookups (``away``, on whatever thread fails over) and read on the
cache's worker (:meth:`apply`, from ``swap``), under a lock held for a few dictionary
operations; a lookup of a service that never failed over pays nothing, and neither does one
that is held (the snapshot says it). Only services with a failover rule are ever marked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sentinel.cache.views import ServiceSnapshot


class ReturnHome:
    """The partitions this client serves from another region, and their hold-downs.

    ``wake(service, delay)`` asks for :meth:`apply` to run again for ``service`` after
    ``delay`` seconds (the cache's timers), when a hold ends.
    """

    def __init__(
        self,
        wake: Callable[[str, float], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wake = wake
        self._clock = clock
        self._lock = threading.Lock()
        # service -> partition -> [return_after, since the local region is up again or None]
        self._away: dict[str, dict[str | None, list[float | None]]] = {}

    def away(self, service: str, partition: str | None, return_after: float) -> bool:
        """Mark ``partition`` of ``service`` served from another region; True when it was not
        already (a new failover episode)."""
        with self._lock:
            partitions = self._away.setdefault(service, {})
            if partition in partitions:
                return False
            partitions[partition] = [return_after, None]
            return True

    def is_away(self, service: str, partition: str | None) -> bool:
        """Whether lookups of ``partition`` go to another region now."""
        partitions = self._away.get(service)
        return partitions is not None and partition in partitions

    def holds(self, service: str) -> bool:
        """Whether any partition of ``service`` is served from another region now."""
        return service in self._away

    def holding(self, service: str, partition: str | None) -> float | None:
        """Seconds left before lookups of a held partition return home (None: not held)."""
        with self._lock:
            entry = self._away.get(service, {}).get(partition)
            if entry is None or entry[1] is None:
                return None
            return max(entry[0] - (self._clock() - entry[1]), 0.0)  # type: ignore[operator]

    def apply(self, service: str, snapshot: ServiceSnapshot) -> ServiceSnapshot:
        """``snapshot`` with the partitions held that must still be held (on the worker)."""
        if service not in self._away and not snapshot.held:
            return snapshot  # the common case costs this test
        now = self._clock()
        held: set[str | None] = set()
        wake_in: float | None = None
        with self._lock:
            partitions = self._away.get(service, {})
            for partition, entry in list(partitions.items()):
                return_after, since = entry
                if not any(e.status == "up" for e in snapshot.partitions.get(partition, ())):
                    entry[1] = None  # nothing up here: the hold starts again when one is
                    continue
                if since is None:
                    since = entry[1] = now
                left = return_after - (now - since)  # type: ignore[operator]
                if left <= 0:
                    del partitions[partition]  # home again
                    continue
                held.add(partition)
                wake_in = left if wake_in is None else min(wake_in, left)
            if not partitions:
                self._away.pop(service, None)
        if wake_in is not None:
            self._wake(service, wake_in)
        frozen = frozenset(held)
        return snapshot if frozen == snapshot.held else snapshot.rebuilt(held=frozen)

    def rule_changed(self, service: str, return_after: float | None) -> None:
        """The service's failover rule changed (on the worker, before :meth:`apply`): its
        partitions away now wait the new rule's ``return_after``; None (a rule that names no
        other region) ends every hold at once, since lookups held here could go nowhere else."""
        with self._lock:
            if return_after is None:
                self._away.pop(service, None)
                return
            for entry in self._away.get(service, {}).values():
                entry[0] = return_after

    def forget(self, service: str) -> None:
        """``service`` is no longer followed: nothing of it is away."""
        with self._lock:
            self._away.pop(service, None)
