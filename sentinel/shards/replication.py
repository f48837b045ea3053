"""The placement daemon's keys copied to the other regions' replicas of the map.

Shard maps are the same in every region (docs/decisions/shard-maps-replicated-per-region.md).
The shard manager's leader places a requested key in its own region; :class:`PlacementCopies`
then copies each placement to every other configured region with the same compare-and-set
(:func:`~sentinel.shards.placement.place_key`, which keeps an existing assignment and moves the
digest with the bucket). A placement stays pending for a region until that region holds it: a
region that is down or refuses is retried on every round of the daemon's loop, so it catches up
when it comes back, and a region that already holds the key in another partition is reported
(an ``alert``), never overwritten.

Each region's session is opened on the first placement to copy, and connects in the
background (kazoo retries by itself): a region that is down never blocks the daemon's loop or
the placements in its own region. Pending copies live in the leader's memory: a leader that
dies with some pending leaves those regions behind, which ``sentinel doctor --region all``
reports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from sentinel.errors import SentinelError
from sentinel.events import Reporter
from sentinel.shards.placement import place_key
from sentinel.shards.store import read_directory_spec

log = logging.getLogger(__name__)


class PlacementCopies:
    """Copies of one policy's placements to other regions: ``regions`` maps each region's name
    to a function returning a (not yet started) kazoo client rooted at its namespace."""

    def __init__(
        self, policy: str, regions: Mapping[str, Callable[[], KazooClient]], report: Reporter
    ) -> None:
        self.policy = policy
        self._connect = dict(regions)
        self._report = report
        self._clients: dict[str, KazooClient] = {}
        self._pending: dict[str, dict[str, str]] = {name: {} for name in regions}
        self._behind: set[str] = set()  # regions reported behind, until they catch up

    def add(self, key: str, partition: str) -> None:
        """Copy ``key -> partition`` to every other region (on the next :meth:`flush`)."""
        for pending in self._pending.values():
            pending[key] = partition

    def pending(self) -> dict[str, int]:
        """How many placements each region still lacks."""
        return {region: len(keys) for region, keys in self._pending.items()}

    def flush(self) -> None:
        """Copy what each region lacks, region by region; a region that cannot be written now
        keeps its copies for the next call. Called from the daemon's loop, never from
        kazoo's thread."""
        for region, keys in self._pending.items():
            if not keys:
                continue
            zk = self._client(region)
            if not zk.connected:
                self._fell_behind(region, "not connected")
                continue
            try:
                spec = read_directory_spec(zk, self.policy)
                for key, partition in list(keys.items()):
                    held = place_key(zk, spec, key, partition)
                    del keys[key]
                    if held != partition:
                        self._report(
                            "alert",
                            {
                                "region": region,
                                "key": key,
                                "partition": partition,
                                "problem": f"region {region} holds the key in {held}",
                            },
                        )
                    else:
                        self._report(
                            "replicated", {"region": region, "key": key, "partition": partition}
                        )
            except (SentinelError, KazooException, KazooTimeoutError) as exc:
                self._fell_behind(region, str(exc) or type(exc).__name__)
                continue
            if region in self._behind:
                self._behind.discard(region)
                self._report("caught up", {"region": region})

    def _client(self, region: str) -> KazooClient:
        zk = self._clients.get(region)
        if zk is None:
            zk = self._clients[region] = self._connect[region]()
            zk.start_async()  # connects in the background, retrying until it does
        return zk

    def _fell_behind(self, region: str, why: str) -> None:
        if region not in self._behind:
            self._behind.add(region)
            log.warning("region %s is behind: %s", region, why)
            self._report(
                "behind", {"region": region, "pending": len(self._pending[region]), "why": why}
            )

    def close(self) -> None:
        """Close the regions' sessions (what is still pending is dropped: doctor reports it)."""
        for zk in self._clients.values():
            zk.stop()
            zk.close()
        self._clients.clear()
