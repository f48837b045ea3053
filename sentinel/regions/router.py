"""Failover across regions: which region answers a lookup the local one cannot, and why.

The facade calls :meth:`Router.resolve` only when the local region has no eligible instance
for the key's partition (after status, feedback and policy), and only for a service whose
rule (its spec's, or the call's) names other regions: a lookup the local region answers
never reaches this module, and a client without such a rule never opens a remote session.

For each region of the rule, in order (the ``nearest`` N by measured round-trip time first,
then the listed ones; a region known to be down goes after those that are not), the region's
client resolves the same key with the same policy in its own cache (its own shard map, its own
instances, the service the rule names there): the first region with an eligible instance
answers. One hop only: a remote region's own rule is not followed. The partition is then
marked away in the local cache (:mod:`sentinel.cache.return_home`), so that lookups return
home only once the local region has been eligible for the rule's ``return_after``.

Lookups that fail over read the other region's immutable snapshots without a lock, as local
ones do; the first one to a region (cold) waits for its session and its load.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sentinel.cache.return_home import ReturnHome
from sentinel.errors import SentinelError
from sentinel.regions.config import Region, Regions
from sentinel.regions.remotes import RemoteClient, Remotes
from sentinel.registry.failover import Failover

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """A lookup answered by another region: its eligible endpoints, the region, and why."""

    candidates: Any
    region: str
    why: str


class Router:
    """The other regions of one client and the failover lookups that go to them.

    ``connect(region)`` makes (does not start) a client of ``region``; ``connect_timeout``
    bounds the first wait for a region's session.
    """

    def __init__(
        self,
        regions: Regions,
        connect: Callable[[Region], RemoteClient],
        connect_timeout: float,
    ) -> None:
        #: This client's region.
        self.local = regions.local
        #: The other regions' sessions and round-trip times.
        self.remotes = Remotes(regions.others, connect, connect_timeout)
        #: Failover episodes begun, by (service, region that answered first).
        self.failovers: dict[tuple[str, str], int] = {}
        #: Lookups answered by another region, by (service, region).
        self.answered: dict[tuple[str, str], int] = {}

    def order(self, rule: Failover) -> list[str]:
        """The regions a lookup under ``rule`` tries, in order."""
        names: list[str] = []
        if rule.nearest:
            others = [n for n in self.remotes.by_name if n != self.local]
            self.remotes.open_all(others)  # nearest needs every region's distance
            names = self.remotes.nearest(rule.nearest, exclude=(self.local,))
        names += [n for n in rule.regions if n not in names and n != self.local]
        by_name = self.remotes.by_name
        # A region known to be down (opened, and not connected now) goes last, in order.
        return sorted(names, key=lambda n: n in by_name and by_name[n].down)

    def resolve(
        self,
        service: str,
        key: object,
        partition: str | None,
        policy: object,
        rule: Failover,
        home: ReturnHome,
    ) -> Answer | list[str]:
        """The first other region's answer under ``rule``, or why each region could not
        answer (one line per region tried)."""
        target = rule.service or service
        tried: list[str] = []
        for name, client in self._reachable(rule, tried):
            try:
                candidates = client.eligible_instances(target, key, policy)
            except SentinelError as exc:
                tried.append(f"{name}: {exc}")
                continue
            if not home.is_away(service, partition) and home.away(
                service, partition, rule.return_after
            ):
                self.failovers[(service, name)] = self.failovers.get((service, name), 0) + 1
                log.info(
                    "service %r%s: no eligible instance in region %r; failing over to %r (%s)",
                    service,
                    "" if partition is None else f" partition {partition!r}",
                    self.local,
                    name,
                    rule.describe(),
                )
            self.answered[(service, name)] = self.answered.get((service, name), 0) + 1
            return Answer(candidates, name, self._why(rule, name, tried))
        return tried

    def _reachable(self, rule: Failover, tried: list[str]) -> Iterator[tuple[str, RemoteClient]]:
        """The regions of ``rule`` in order, with their clients; those that cannot be reached
        are skipped, each said in ``tried``."""
        for name in self.order(rule):
            client = self.remotes.open(name)
            if client is not None:
                yield name, client
            elif name in self.remotes.by_name:
                tried.append(f"{name}: no connection")
            else:
                tried.append(f"{name}: not configured")

    def _why(self, rule: Failover, name: str, tried: list[str]) -> str:
        remote = self.remotes.by_name[name]
        how = (
            f"nearest by round-trip time ({remote.rtt * 1000:.1f} ms)"
            if name not in rule.regions
            else f"listed {rule.regions.index(name) + 1} of {len(rule.regions)}"
        )
        skipped = f"; skipped {'; '.join(tried)}" if tried else ""
        return f"failover rule {rule.describe()}: {name} is {how}{skipped}"

    def explain(
        self, service: str, key: object, policy: object, rule: Failover
    ) -> tuple[Any, str, str] | list[str]:
        """What :meth:`resolve` would do, as the answering region's own explanation, its
        name and why (or why no region could answer). Reads like a lookup; changes nothing."""
        target = rule.service or service
        tried: list[str] = []
        for name, client in self._reachable(rule, tried):
            try:
                explanation = client.explain(target, key, policy)
            except SentinelError as exc:
                tried.append(f"{name}: {exc}")
                continue
            if explanation.eligible:
                return explanation, name, self._why(rule, name, tried)
            tried.append(f"{name}: nothing eligible")
        return tried

    def warm(self, service: str, rule: Failover) -> None:
        """Follow ``service`` in the regions of ``rule`` before it is needed (a thread: the
        load that asked for it does not wait)."""

        def follow() -> None:
            for name, client in self._reachable(rule, []):
                try:
                    client.prefetch(rule.service or service)
                except SentinelError as exc:
                    log.info("warm failover of %r: region %r: %s", service, name, exc)

        threading.Thread(target=follow, name="sentinel-region-warm", daemon=True).start()

    def states(self) -> dict[str, tuple[float, float]]:
        """``(round-trip time, staleness)`` in seconds of each region opened so far (math.inf:
        not answering; a region never connected is stale for as long as it was opened)."""
        now = time.monotonic()
        states = {}
        for name, remote in self.remotes.by_name.items():
            if remote.deadline is None:
                continue  # never needed: nothing to say, nothing followed
            client = remote.client
            staleness = client.staleness if client is not None else max(now - remote.deadline, 0.0)
            states[name] = (remote.rtt, staleness)
        return states

    def close(self) -> None:
        """Close every other region's session."""
        self.remotes.close()
