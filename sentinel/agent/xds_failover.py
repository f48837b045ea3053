"""Which region serves a cluster of the agent's xDS clients: the library's failover.

Every surface says the same of the registry: a gRPC client resolving ``xds:///<service>``
through the agent is served what :meth:`Sentinel.get_service <sentinel.Sentinel.get_service>`
would serve: the agent's region's instances while the cluster's partition has an eligible one
there (status ``up``, not held back), else, under the service's failover rule, the instances of
the first region of the rule that has one, and the agent's region's again once it has been
eligible for the rule's ``return_after``. The decisions are the library's own: the regions'
order and the first that answers (:meth:`Router.resolve_partition
<sentinel.regions.router.Router.resolve_partition>`), and the hold-down before returning home
(:class:`~sentinel.cache.return_home.ReturnHome`). What this module adds is where they run: the
agent's sessions to other regions are the ones its processes fail over through
(:class:`~sentinel.agent.regions.RegionServers`, one per region, opened when first needed),
and a region's changes of a service served from there rebuild that service's resources.

Threads: :meth:`Elsewhere.apply`, :meth:`Elsewhere.failing_over` and
:meth:`Elsewhere.forget` run on the xDS server's loop and never wait; :meth:`Elsewhere.served`
may wait (a region's first opening, the service's first load there) and runs on a load worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sentinel.agent.regions import regions_of
from sentinel.agent.served import partitions_of
from sentinel.cache.return_home import ReturnHome
from sentinel.cache.views import ServiceSnapshot
from sentinel.regions.router import Answer, Router
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.failover import Failover

if TYPE_CHECKING:
    from sentinel.client import Sentinel

#: What :meth:`Elsewhere.served` answers: by partition, the region serving it and its
#: instances there.
Served = dict[str | None, tuple[str, tuple[Endpoint, ...]]]

_UNSEEN = object()  # a service whose rule this module has not seen yet


class Elsewhere:
    """The xDS server's failovers: one client's state, as a library client keeps its own.

    ``home``: the agent's own session's client (the xDS server's); ``changed(service)``, from
    any thread: the service's resources must be rebuilt (another region changed it);
    ``wake(service, delay)``, on the loop: rebuild it after ``delay`` seconds (a hold ends).
    """

    def __init__(
        self,
        home: Sentinel,
        changed: Callable[[str], None],
        wake: Callable[[str, float], None],
    ) -> None:
        self._home = home
        self._changed = changed
        #: The partitions served from another region and their hold-downs.
        self.return_home = ReturnHome(wake)
        self._router: Router | None = None
        self._rules: dict[str, object] = {}  # service -> the rule last seen in its spec
        self._heard: dict[str, list[Callable[[], None]]] = {}  # service -> its removers

    def _router_now(self) -> Router | None:
        """The router over the agent's other regions, made on first need; None while no
        agent server of this session has other regions (its xDS fails over nowhere)."""
        if self._router is None:
            regions = regions_of(self._home)
            if regions is not None and regions.configured.others:
                self._router = Router(regions.configured, regions.client, regions.connect_timeout)
        return self._router

    def apply(self, service: str, snapshot: ServiceSnapshot) -> ServiceSnapshot:
        """``snapshot`` with its partitions held back that must still be (the loop's), as the
        library's cache applies them at each change; a warm rule's regions follow the
        service from its first snapshot on."""
        rule = snapshot.spec.failover
        old = self._rules.get(service, _UNSEEN)
        if old != rule:
            self._rules[service] = rule
            if old is not _UNSEEN:  # a held partition waits as the rule now says, or not
                self.return_home.rule_changed(
                    service, None if rule is None or rule.local_only else rule.return_after
                )
            router = self._router_now()
            if router is not None:
                router.follow(service, rule)
        return self.return_home.apply(service, snapshot)

    def failing_over(self, service: str, snapshot: ServiceSnapshot) -> bool:
        """Whether a cluster of ``service`` has nothing eligible here while its rule names
        other regions the agent has (the loop's); from then on, the changes of the service in
        those regions are heard (``changed``)."""
        rule = snapshot.spec.failover
        if rule is None or rule.local_only:
            return False
        if all(snapshot.up.get(p) for p in partitions_of(snapshot)):
            return False
        router = self._router_now()
        if router is None:
            return False
        if service not in self._heard:
            self._heard[service] = [
                router.listen(service, lambda _event: self._changed(service), region)
                for region in router.remotes.by_name
            ]
        return True

    def served(self, service: str, snapshot: ServiceSnapshot) -> Served:
        """The partitions of ``service`` another region serves (on a load worker): each
        one with nothing eligible in ``snapshot``, from the first region of the rule that has
        an instance up there. A partition no region can serve is left to the agent's region
        (whose assignment then has no healthy endpoint: its calls fail, as lookups do)."""
        rule = snapshot.spec.failover
        router = self._router
        if router is None or not isinstance(rule, Failover):
            return {}
        served: Served = {}
        for partition in partitions_of(snapshot):
            if snapshot.up.get(partition):
                continue
            answer = router.resolve_partition(service, partition, rule, self.return_home)
            if isinstance(answer, Answer):
                served[partition] = (answer.region, tuple(answer.candidates))
        return served

    def forget(self, service: str) -> None:
        """No stream follows ``service`` any more (the loop's): nothing of it is kept."""
        self.return_home.forget(service)
        self._rules.pop(service, None)
        for remove in self._heard.pop(service, ()):
            remove()

    def close(self) -> None:
        """Stop hearing the other regions (their sessions stay the agent's)."""
        for removers in self._heard.values():
            for remove in removers:
                remove()
        self._heard.clear()
        if self._router is not None:
            self._router.close()
