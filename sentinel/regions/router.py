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

What a client opened in another region changes like anything else: :meth:`Router.listen`
(``Sentinel.listen(service, callback, region=...)``) hears the changes of a service in one of
the other regions from the moment this client opens it, in the shape of the local region's
listeners, so that what holds resources on an instance there (the PostgreSQL pools) lets go
of it when it leaves, as for a local instance.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sentinel.cache.listeners import Listener
from sentinel.cache.return_home import ReturnHome
from sentinel.errors import SentinelError, ValidationError
from sentinel.events import ChangeEvent
from sentinel.regions.config import Region, Regions
from sentinel.regions.remotes import RemoteClient, Remotes
from sentinel.registry.failover import LOCAL_ONLY, Failover

log = logging.getLogger(__name__)

#: What a lookup on a listener's thread says of a region it did not wait for.
OPENING = "{}: being opened in the background (a listener's thread does not wait for it); retry"


@dataclass(frozen=True)
class Answer:
    """A lookup answered by another region: its eligible endpoints and the region."""

    candidates: Any
    region: str


class Router:
    """The other regions of one client and the failover lookups that go to them.

    ``connect(region)`` makes (does not start) a client of ``region``; ``connect_timeout``
    bounds the first wait for a region's session. ``on_listener_thread()`` says whether the
    caller is the local cache's worker (a listener runs there): a lookup there never waits for
    a region's session (see :meth:`resolve`).
    """

    def __init__(
        self,
        regions: Regions,
        connect: Callable[[Region], RemoteClient],
        connect_timeout: float,
        on_listener_thread: Callable[[], bool] = lambda: False,
    ) -> None:
        #: This client's region.
        self.local = regions.local
        self._on_local_listener_thread = on_listener_thread
        # Both replaced under the lock, never mutated: events read them without it.
        self._listeners: tuple[tuple[str, str | None, Listener], ...] = ()
        self._changing = threading.Lock()
        # service -> the other names (rules' ``service``) its lookups asked for elsewhere
        self._targets: dict[str, frozenset[str]] = {}
        # service -> the rule its spec holds, of each service this client follows with one
        self._rules: dict[str, Failover] = {}
        #: The other regions' sessions and round-trip times.
        self.remotes = Remotes(
            regions.others, connect, connect_timeout, self._opened, self._forked, self._needed
        )
        #: Failover episodes begun, by (service, region that answered first).
        self.failovers: dict[tuple[str, str], int] = {}
        #: Lookups answered by another region, by (service, region).
        self.answered: dict[tuple[str, str], int] = {}

    def _forked(self) -> None:
        """In a forked child, at the fork: a new lock (a thread that is gone may hold it)."""
        self._changing = threading.Lock()

    def _needed(self, region: str) -> bool:
        """Whether a rule of a followed service names ``region`` now."""
        return any(_names(rule, region) for rule in self._rules.values())

    def order(self, rule: Failover) -> list[str]:
        """The regions a lookup under ``rule`` tries, in order."""
        names: list[str] = []
        if rule.nearest:
            others = [n for n in self.remotes.by_name if n != self.local]
            # nearest needs every region's distance; a listener's thread ranks those it has
            if not all(self.remotes.by_name[n].ready.is_set() for n in others):
                self.remotes.open_all(others, wait=not self._on_listener_thread())
            names = self.remotes.nearest(rule.nearest, exclude=(self.local,))
        names += [n for n in rule.regions if n not in names and n != self.local]
        if len(names) < 2:
            return names
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
        answer (one line per region tried).

        A region not opened yet (a cold rule's first failover) is waited for up to
        ``connect_timeout``, except on a listener's thread (the cache worker of this client
        or of one of its regions): waiting there would hold every other event back, so the
        region is opened in the background and said to be (``west: being opened in the
        background ...; retry``): the caller's NoInstanceAvailable, retried, finds it open.
        """
        target = self._target(service, rule)
        # LOCAL_ONLY: one hop. The region is asked on this client's behalf, so its own rule
        # (and what it would say of failing over from there) is not this lookup's.
        return self._answer(
            service,
            partition,
            rule,
            home,
            lambda client: client.eligible_instances(target, key, policy, LOCAL_ONLY),
        )

    def resolve_partition(
        self, service: str, partition: str | None, rule: Failover, home: ReturnHome
    ) -> Answer | list[str]:
        """:meth:`resolve` for a caller that routes by partition rather than by key (the
        host agent's xDS server: a cluster per partition): the instances with status ``up``
        in ``partition`` (None: the whole service) of the rule's service, in the first region
        of the rule that has one. A partition is the same in every region: shard maps are
        replicated (docs/regions.md, "What is global and what is regional")."""
        target = self._target(service, rule)

        def up(client: RemoteClient) -> tuple[Any, ...] | None:
            client.prefetch(target)
            found = tuple(
                e
                for e in client.cached_instances(target)
                if e.status == "up" and (partition is None or e.partition == partition)
            )
            return found or None

        return self._answer(service, partition, rule, home, up)

    def _target(self, service: str, rule: Failover) -> str:
        """The service ``rule`` asks for in other regions, remembered for :meth:`listen`."""
        target = rule.service or service
        if target != service and target not in self._targets.get(service, ()):
            with self._changing:  # once per (service, target): two lookups must not lose one
                self._targets = {
                    **self._targets,
                    service: self._targets.get(service, frozenset()) | {target},
                }
        return target

    def _answer(
        self,
        service: str,
        partition: str | None,
        rule: Failover,
        home: ReturnHome,
        ask: Callable[[RemoteClient], Any],
    ) -> Answer | list[str]:
        """The first region's answer to ``ask`` under ``rule``, the partition marked away
        at home when it is; else what each region said."""
        found = self._first(rule, ask)
        if isinstance(found, list):
            return found
        name, candidates, _ = found
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
        return Answer(candidates, name)  # why is explain()'s to say: no string per lookup

    def _first(
        self, rule: Failover, ask: Callable[[RemoteClient], Any]
    ) -> tuple[str, Any, list[str]] | list[str]:
        """The first region of ``rule`` whose client ``ask`` answers (not None, no error):
        its name, the answer and what the regions before it said; else what each said."""
        tried: list[str] = []
        for name, client in self._reachable(rule, tried):
            try:
                answer = ask(client)
            except SentinelError as exc:
                tried.append(f"{name}: {exc}")
                continue
            if answer is None:
                tried.append(f"{name}: nothing eligible")
                continue
            return name, answer, tried
        return tried

    def _reachable(self, rule: Failover, tried: list[str]) -> Iterator[tuple[str, RemoteClient]]:
        """The regions of ``rule`` in order, with their clients; those that cannot be reached
        are skipped, each said in ``tried``."""
        waits: bool | None = None  # whether this thread may wait: asked once a region is not open
        order = self.order(rule)
        for name in order:
            client = self.remotes.open(name, wait=False)
            if client is None and name in self.remotes.by_name:
                if waits is None:
                    waits = not self._on_listener_thread()
                if waits:
                    client = self.remotes.open(name)
            if client is not None:
                self.remotes.by_name[name].uses += 1
                yield name, client
            elif name not in self.remotes.by_name:
                tried.append(f"{name}: not configured")
            elif not waits and self.remotes.opening(name):
                tried.append(OPENING.format(name))
            else:
                tried.append(f"{name}: no connection")
        if rule.nearest:  # not ranked: those still opening (nobody waited for them) not tried
            tried.extend(
                OPENING.format(name)
                for name in self.remotes.by_name
                if name not in order and self.remotes.opening(name)
            )

    def _on_listener_thread(self) -> bool:
        """Whether the caller runs listeners: the local cache's worker, or a region's."""
        if self._on_local_listener_thread():
            return True
        return any(
            r.client is not None and r.client.session.on_listener_thread()
            for r in self.remotes.by_name.values()
        )

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

        def eligible(client: RemoteClient) -> Any:
            explanation = client.explain(target, key, policy)
            return explanation if explanation.eligible else None

        found = self._first(rule, eligible)
        if isinstance(found, list):
            return found
        name, explanation, tried = found
        return explanation, name, self._why(rule, name, tried)

    def follow(self, service: str, rule: Failover | None) -> None:
        """``service`` is followed here with ``rule`` in its spec (at its load): a warm rule's
        regions follow it now."""
        self.rule_changed(service, None, rule)

    def rule_changed(self, service: str, old: Failover | None, new: Failover | None) -> None:
        """The spec's rule of ``service`` went from ``old`` to ``new`` (None: no rule, or the
        service gone), on the local cache's worker: nothing here waits.

        A warm ``new`` rule's regions follow the service now (a thread, as at its load);
        lookups read the new rule from the snapshot by themselves. A region ``old`` named
        that no rule of a followed service names now (``nearest`` names every region) stops
        following ``old``'s target there, so that what a client reads remotely stays what its
        rules may need: its watches go and its listeners hear its instances leave.
        """
        with self._changing:
            rules = dict(self._rules)
            if new is None or new.local_only:
                rules.pop(service, None)
            else:
                rules[service] = new
            self._rules = rules
        if new is not None and new.warm and not new.local_only:
            self.warm(service, new)
        if old is None or old.local_only:
            return
        target = old.service or service
        for name, remote in self.remotes.by_name.items():
            client = remote.client
            if client is None or not _names(old, name):
                continue
            if any(_names(r, name) and (r.service or s) == target for s, r in rules.items()):
                continue  # another service's rule (or this one's new one) still needs it there
            log.info("service %r: region %r no longer in its failover rule", target, name)
            client.session.cache.forget(target)

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

    def listen(self, service: str | None, callback: Listener, region: str) -> Callable[[], None]:
        """Call ``callback(event)`` on every change of ``service`` (None: of every service;
        else also of the service its failover rule names there) in ``region``, one of the
        other regions, from the moment this client opens it; returns the remover. This is
        ``Sentinel.listen(service, callback, region=region)``: callbacks run on that region's
        cache worker, in order, and must not block. An unknown region raises
        :class:`~sentinel.errors.ValidationError`.
        """
        if region not in self.remotes.by_name:
            raise ValidationError(
                f"region {region!r} is not another region of this client "
                f"(this one is {self.local!r}; others: {', '.join(sorted(self.remotes.by_name))})"
            )
        entry = (region, service, callback)
        with self._changing:
            self._listeners = (*self._listeners, entry)

        def remove() -> None:
            with self._changing:
                self._listeners = tuple(e for e in self._listeners if e is not entry)

        return remove

    def _opened(self, region: str, client: RemoteClient) -> None:
        """A region's client has connected: forward its events to :meth:`listen`'s callbacks."""

        def forward(event: ChangeEvent) -> None:
            name = getattr(event, "service", None)  # a ConnectionChanged is no service's
            for where, service, callback in self._listeners:
                if where == region and (
                    service is None or name == service or name in self._targets.get(service, ())
                ):
                    try:  # one failing callback must not cost the others their event
                        callback(event)
                    except Exception:
                        log.exception("region listener %r failed on %r", callback, event)

        client.listen(None, forward)

    def region_of(self, endpoint: Any) -> str:
        """The region ``endpoint`` is registered in as this client sees it: another region
        whose cached instances of its service hold its URI, else this client's own."""
        for name, remote in self.remotes.by_name.items():
            client = remote.client
            if client is not None and any(
                e.uri == endpoint.uri for e in client.cached_instances(endpoint.service)
            ):
                return name
        return self.local

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


def _names(rule: Failover, region: str) -> bool:
    """Whether a lookup under ``rule`` may go to ``region`` (any region may be nearest)."""
    return bool(rule.nearest) or region in rule.regions
