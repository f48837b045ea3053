"""How a lookup would go, step by step (``Sentinel.explain``), and why one found nothing: no
eligible instance, or no such service.

A role of the client, as its writers are (docs/decisions/facade-by-role.md): bound to the
client's cache, feedback and regions by what it is given, so it imports nothing above it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kazoo.exceptions import KazooException, NoNodeError

from sentinel.cache.protection import MassLossProtection, eligible_verdict, unprotected_note
from sentinel.cache.return_home import ReturnHome
from sentinel.cache.views import ServiceSnapshot
from sentinel.eligibility import NOT_UP, nothing_up, status_verdict
from sentinel.errors import NamespaceNotFound, NoInstanceAvailable, SentinelError, ServiceNotFound
from sentinel.feedback import InstanceFeedback
from sentinel.freshness import STALE
from sentinel.plugins import as_policy
from sentinel.regions.config import Regions
from sentinel.regions.router import Router
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.failover import Failover
from sentinel.registry.layout import SERVICES
from sentinel.session import Session
from sentinel.suggestions import close_matches


@dataclass(frozen=True)
class ExplainStep:
    """One filter of a resolution and the endpoints it excluded.

    ``verdict`` is what those endpoints are: ``"stale"`` when the step excluded them for the
    age of their metrics (see :mod:`sentinel.freshness`), ``"status not up"`` for the status
    step (:data:`sentinel.eligibility.NOT_UP`), else ``"excluded by <name>"``;
    ``reasons`` gives one endpoint (by name) a verdict of its own: the status step says each
    one's status, and the readiness check that set it (:mod:`sentinel.eligibility`).
    """

    name: str
    excluded: tuple[Endpoint, ...]
    verdict: str = ""
    reasons: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.verdict:
            object.__setattr__(self, "verdict", f"excluded by {self.name}")


@dataclass(frozen=True)
class Explanation:
    """How a lookup would go: the partition, its instances, each filter, what is left."""

    service: str
    key: object
    shard_policy: str | None
    partition: str | None
    instances: tuple[Endpoint, ...]
    steps: tuple[ExplainStep, ...]
    eligible: tuple[Endpoint, ...]
    #: The partition is in panic: reported failures eject so many of its instances that
    #: lookups ignore the ejections there (see :class:`~sentinel.feedback.OutlierDetection`).
    panic: bool = False
    #: Why protection from mass loss, configured for this client, does not apply to the
    #: service (its spec does not mark departures); None when it applies or is not configured.
    unprotected: str | None = None
    #: The region whose instances these are (None: a client of one region), and why it is
    #: that region: the local one answers whenever it has an eligible instance.
    region: str | None = None
    region_reason: str = ""
    #: When another region answered: the local region's own explanation (why it could not).
    home: Explanation | None = None

    @property
    def verdicts(self) -> dict[str, str]:
        """Each instance's verdict by endpoint name: ``"eligible"``, ``"stale"``, its status
        (``"status down: failing its readiness check ..."``, :mod:`sentinel.eligibility`), or
        ``"excluded by <filter>"``; an instance the registry no longer lists, served under
        protection from mass loss, says so (``"eligible, protected: ..."``)."""
        verdicts = {e.name: eligible_verdict(e) for e in self.instances}
        for step in self.steps:  # each step sees only what the ones before kept
            for endpoint in step.excluded:
                verdicts[endpoint.name] = step.reasons.get(endpoint.name, step.verdict)
        return verdicts


class Explainer:
    """``Sentinel.explain`` and the message of a lookup that found nothing eligible.

    ``snapshot`` loads a service as a lookup does, ``cached`` only reads the cache,
    ``partition_of`` maps a key as a lookup does, ``return_home`` is the session's current
    cache's (a forked child's is another).
    """

    def __init__(
        self,
        *,
        snapshot: Callable[[str], ServiceSnapshot],
        cached: Callable[[str], ServiceSnapshot | None],
        partition_of: Callable[[str, str, object], str],
        return_home: Callable[[], ReturnHome],
        feedback: InstanceFeedback,
        protection: MassLossProtection | None,
        regions: Regions | None,
        router: Router | None,
    ) -> None:
        self._snapshot = snapshot
        self._cached = cached
        self._partition_of = partition_of
        self._return_home = return_home
        self._feedback = feedback
        self._protection = protection
        self._regions = regions
        self._router = router

    def explain(
        self,
        service: str,
        key: object = None,
        policy: object = None,
        failover: Failover | None = None,
    ) -> Explanation:
        """:meth:`Sentinel.explain <sentinel.Sentinel.explain>`: here, else the region that
        answers, with this region's explanation as ``home``."""
        local = self.here(service, key, policy)
        if self._regions is None:
            return local
        snapshot = self._snapshot(service)
        rule = snapshot.spec.failover if failover is None else failover
        here = self._regions.local
        if local.eligible:
            return dataclasses.replace(
                local, region=here, region_reason="the local region has eligible instances"
            )
        router = self._router
        if rule is None or rule.local_only or router is None:
            why = "no other region to try" if rule and not rule.local_only else "local only"
            return dataclasses.replace(
                local, region=here, region_reason=f"nothing eligible locally; failover: {why}"
            )
        answer = router.explain(service, key, policy, rule)
        if isinstance(answer, list):
            return dataclasses.replace(
                local,
                region=here,
                region_reason="nothing eligible locally, nor in another region: "
                + "; ".join(answer),
            )
        remote, name, why = answer
        home = dataclasses.replace(local, region=here, region_reason="nothing eligible locally")
        return dataclasses.replace(remote, region=name, region_reason=why, home=home)

    def here(self, service: str, key: object, policy: object) -> Explanation:
        """:meth:`explain` in this client's own region."""
        snapshot = self._snapshot(service)
        shard_policy = snapshot.spec.shard_policy
        partition = None if shard_policy is None else self._partition_of(shard_policy, service, key)
        return self.in_partition(service, partition, key, policy)

    def in_partition(
        self, service: str, partition: str | None, key: object = None, policy: object = None
    ) -> Explanation:
        """:meth:`here` of one ``partition`` (None: an unsharded service's instances), found
        without a key: the dashboard's verdicts of every instance, in explain()'s words."""
        policy = None if policy is None else as_policy(policy)
        snapshot = self._snapshot(service)
        shard_policy = snapshot.spec.shard_policy
        instances = snapshot.partitions.get(partition, ())
        eligible = snapshot.up.get(partition, ())
        down = tuple(e for e in instances if e.status != "up")
        reasons = {e.name: status_verdict(e) for e in down}
        steps = [ExplainStep("status up", down, NOT_UP, reasons)]
        if partition in snapshot.held:
            left = self._return_home().holding(service, partition) or 0.0
            steps.append(
                ExplainStep(
                    "return home",
                    tuple(e for e in instances if e.status == "up"),
                    f"held back: lookups fail over until the local region has been eligible "
                    f"for its return_after ({left:.1f}s more)",
                )
            )
        verdict = self._feedback.verdict(eligible)
        if verdict.ejected or verdict.spared:
            steps.append(
                ExplainStep(verdict.describe(self._feedback.detection), verdict.ejected, "ejected")
            )
            eligible = tuple(verdict.admitted)
        for step in () if policy is None else _steps(policy):
            # A metric policy with an age limit (sentinel.policies.metrics.AgeLimited) names the
            # endpoints it distrusts for their metrics' age: their verdict is "stale".
            stale = getattr(step, "stale", None)
            old = tuple(stale(eligible)) if callable(stale) and eligible else ()
            if old:
                steps.append(ExplainStep(f"stale metrics under {step!r}", old, verdict=STALE))
                eligible = tuple(e for e in eligible if e not in old)
            kept = tuple(step(eligible)) if eligible else ()
            steps.append(ExplainStep(repr(step), tuple(e for e in eligible if e not in kept)))
            eligible = kept
        return Explanation(
            service,
            key,
            shard_policy,
            partition,
            instances,
            tuple(steps),
            eligible,
            verdict.panic,
            unprotected_note(self._protection, snapshot.spec),
        )

    def nothing_eligible(
        self, service: str, key: object, partition: str | None, policy: object, elsewhere: str = ""
    ) -> NoInstanceAvailable:
        """What a lookup that finds nothing eligible raises: why, in the terms of
        :meth:`explain` (nothing up, ejected, stale metrics), and ``elsewhere``: what the
        other regions said."""
        where = f"service {service!r}" + (
            "" if partition is None else f", key {key!r}, partition {partition!r}"
        )
        snapshot = self._cached(service)
        instances = snapshot.partitions.get(partition, ()) if snapshot else ()
        up = snapshot.up.get(partition, ()) if snapshot else ()
        ejected = len(self._feedback.verdict(up).ejected) if up else 0
        # The cost of the freshness default, said where it bites: a stopped collector shows
        # here as instances whose metrics are too old, not as a mystery.
        stale: set[str] = set()
        for step in () if policy is None else _steps(policy):
            distrusted = getattr(step, "stale", None)
            if callable(distrusted) and up:
                stale.update(e.name for e in distrusted(up))
        reason = (
            nothing_up(instances)
            if not up
            else f"has {len(instances)} instance(s) but none is eligible under "
            f"{'status up' if policy is None else repr(policy)}"
            + (f" ({ejected} ejected for reported failures)" if ejected else "")
            + (
                f" ({len(stale)} with stale metrics: check their collector, or pass max_age)"
                if stale
                else ""
            )
        )
        return NoInstanceAvailable(
            f"{where} {reason}{elsewhere}",
            service=service,
            key=key,
            partition=partition,
            policy=policy,
        )


def _steps(policy: object) -> tuple[object, ...]:
    """The policies a chain applies one after the other, nested chains flattened (``a & b & c``
    is ``Chain(Chain(a, b), c)``), so explain() shows each one's verdict."""
    inner = getattr(policy, "policies", None)
    return (policy,) if not inner else tuple(step for p in inner for step in _steps(p))


def not_found(error: ServiceNotFound, session: Session) -> SentinelError:
    """What a lookup of a service without a spec raises: NamespaceNotFound when the whole
    namespace is missing, else ``error`` with the closest registered names suggested.

    A slow path already (the spec was read and missed): one listing more, for the
    suggestions. Should that read fail, ``error`` is raised as it is.
    """
    service = error.service or ""
    if error.suggestions or error.reason != ServiceNotFound.NOT_REGISTERED:
        return error  # suggested already, or another reason (an unreadable spec)
    try:
        names = session.zk.get_children(SERVICES)
    except NoNodeError:
        try:
            exists = session.namespace_ready or session.zk.exists("/") is not None
        except KazooException:
            return error
        return error if exists else NamespaceNotFound(session.namespace, session.hosts)
    except KazooException:
        return error
    # listed, and cached by this client
    names = {*names, *list(session.cache.snapshots)} - {service}
    close = close_matches(service, names)
    return ServiceNotFound(service, suggestions=close) if close else error
