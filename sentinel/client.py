"""The client facade: one ZooKeeper session per :class:`Sentinel`, shared by every role."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, overload

from prometheus_client import REGISTRY, CollectorRegistry

from sentinel import shards, telemetry
from sentinel import validation as check
from sentinel.auth.config import AuthConfig
from sentinel.builder import ClientParts
from sentinel.cache import CacheStats, Listener, ServiceSnapshot
from sentinel.cache.config import CacheConfig
from sentinel.errors import (
    SentinelError,
    ServiceNotFound,
    ValidationError,
)
from sentinel.events import ChangeEvent, ServiceSpecChanged
from sentinel.explain import Explainer, Explanation, not_found
from sentinel.feedback import Census, InstanceFeedback, OutlierDetection
from sentinel.health import HealthCheck
from sentinel.plugins import as_balancer, as_policy
from sentinel.publisher import Registration
from sentinel.regions.config import Region, Regions
from sentinel.regions.router import Answer
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.failover import Failover
from sentinel.registry.layout import (
    default_label,
    validate_name,
)
from sentinel.registry.reads import ServiceListing, read_service
from sentinel.registry.records import (
    CuratorSource,
    InstanceRecord,
    MetricsRecord,
    MetricValue,
    ServiceSpec,
)
from sentinel.settings import ClientSettings
from sentinel.strategies import Balancer, SelectionPolicy
from sentinel.zk.errors import translate_zk_errors
from sentinel.zk.tls import TlsConfig

if TYPE_CHECKING:
    from sentinel.strategies import Endpoints

log = logging.getLogger(__name__)


class Sentinel:
    """A Sentinel client: publishes instances and (with the cache) resolves services.

    Use it as a context manager, or call :meth:`start` and :meth:`close`::

        with Sentinel(hosts="127.0.0.1:2181", client_id="billing-api") as sentinel:
            registration = sentinel.register("billing-db", "p1", "10.0.0.5", 5432,
                                             scheme="postgresql", label="replica-a")
            ...
            sentinel.deregister(registration, wait=1.0)  # before the server stops serving

    Every parameter but the first three is keyword-only; all have defaults. Each is checked
    here (the grouped ones when their value object is made): a value of the wrong type or out
    of its range raises :class:`~sentinel.errors.ValidationError` naming it.

    Parameters
    ----------
    hosts : str, default ``$SENTINEL_ZK``, else the development server (``sentinel zk start``)
        ZooKeeper's connect string, ``host:port,...``.
    namespace : str, default ``"/sentinel"``
        The root every path lives under, so several environments can share one ensemble.
    connect_timeout : float, default 10.0
        Seconds :meth:`start` (and a service's first load) waits for a server; then
        :class:`~sentinel.errors.ZooKeeperUnavailable`.
    session_timeout : float, default 10.0
        How long ZooKeeper keeps this client's ephemeral nodes after it stops answering.
    tls : TlsConfig or bool or None, default None (plain TCP)
        Connect to ``secureClientPort`` over TLS: a :class:`~sentinel.zk.tls.TlsConfig`, or True
        for :meth:`TlsConfig.from_env() <sentinel.zk.tls.TlsConfig.from_env>`
        (``$SENTINEL_ZK_TLS_CA``, ``_CERT``, ``_KEY``). A file that cannot be loaded raises
        :class:`~sentinel.errors.TlsConfigError` here; a certificate that does not verify
        makes :meth:`start` raise :class:`~sentinel.errors.TlsHandshakeFailed`.
    identity : str or None, default ``$SENTINEL_ZK_IDENTITY``
        ``"user:password"``, the ZooKeeper digest identity of a secured namespace
        (``sentinel init --secure``); nodes this client creates are writable by it alone.
        ``""`` (:data:`sentinel.auth.acl.ANONYMOUS`): anonymous even when the variable is set.
        The default goes to this client's own region only: a client reading another region
        (``agent_region``) presents that region's entry's identity, else none
        (:func:`~sentinel.regions.identity.identity_for`, ``docs/regions.md``).

    client_id : str, default ``<hostname>-<pid>``
        This process's name in ``/clients`` and in logs; unique per process.
    app : str or None, default None (the client id)
        The service this client belongs to, so ``sentinel deps`` draws service-to-service
        edges.
    announce : bool, default True
        False keeps the client out of ``/clients`` (tools that only look, such as the CLI,
        should not appear as dependents).

    auth : AuthConfig or None, default ``AuthConfig()`` (the key ring from the environment)
        This client's key ring, the identity credentials are encrypted to, and the manager
        whose signature they must carry: :class:`~sentinel.auth.config.AuthConfig`.
    cache : CacheConfig or None, default ``CacheConfig()``
        How the cache follows ZooKeeper (persistent or one-shot watches), remembers missing
        keys, paces its reads and re-syncs, keeps a snapshot file, and what a forked child
        serves: :class:`~sentinel.cache.config.CacheConfig`.
    feedback : OutlierDetection or InstanceFeedback or None, default ``OutlierDetection()``
        When what :meth:`report` learns ejects an instance from lookups, and the bounds that
        keep a partition served (:class:`~sentinel.feedback.OutlierDetection`), or the
        :class:`~sentinel.feedback.InstanceFeedback` that holds it (one shared by several
        clients, or with a clock of its own).

    prometheus_registry : CollectorRegistry or None, default ``prometheus_client.REGISTRY``
        Where the client's metrics are exported (:mod:`sentinel.telemetry`); None turns
        them off.
    agent : str or bool or None, default ``$SENTINEL_AGENT`` (unset: no agent)
        Take the registry from the host agent (``sentinel agent``) on this Unix socket instead
        of a ZooKeeper session of the client's own: True for ``$SENTINEL_AGENT`` or the
        default socket, False for a session of its own whatever the environment says.
        Lookups are unchanged; writes open the client's own session on the first one, and
        so does a key ring whose public keys are not published yet (``docs/agent.md``).
        :meth:`start` raises :class:`~sentinel.errors.AgentUnavailable` when no agent
        answers within ``connect_timeout`` (with a snapshot file, it serves that meanwhile),
        :class:`~sentinel.errors.AgentNotTrusted` when the socket or its listener belongs to
        a user other than root, this process's own and ``$SENTINEL_AGENT_USER``: nothing is
        sent to such a listener, the identity included.
    agent_region : str or None, default None (the agent's own region)
        In agent mode, read the registry of the agent's other region of this name, from the
        agent's session there (opened when a process first needs it); the agent's own
        configuration says where that region is, so nothing but the name is sent, with that
        region's identity (``identity=``, else its entry's in ``regions``), never this
        region's default (``docs/regions.md``, "Identities"). Such a
        client only reads (a write raises ValidationError); :meth:`start` raises
        :class:`~sentinel.errors.RegionNotServed` when the agent has no such region. A
        client's failover to another region in agent mode goes this way by itself
        (``docs/regions.md``): this is for a client that reads one other region.
    regions : Regions or bool or None, default ``$SENTINEL_REGIONS`` (unset: one region)
        This client's region and the others its services may fail over to
        (:class:`~sentinel.regions.config.Regions`; True: from the environment, False: none
        whatever it says). When it holds the local region's entry, that entry supplies
        ``hosts``, ``namespace``, ``tls`` and ``identity`` not given here (before their
        environment defaults). A configuration that cannot be used raises
        :class:`~sentinel.errors.RegionConfigError` naming the field. Nothing connects to
        another region until a service needs it (``docs/regions.md``).
    """

    def __init__(
        self,
        hosts: str | None = None,
        client_id: str | None = None,
        namespace: str | None = None,
        *,
        connect_timeout: float = 10.0,
        session_timeout: float = 10.0,
        tls: TlsConfig | bool | None = None,
        identity: str | None = None,
        app: str | None = None,
        announce: bool = True,
        auth: AuthConfig | None = None,
        cache: CacheConfig | None = None,
        feedback: OutlierDetection | InstanceFeedback | None = None,
        prometheus_registry: CollectorRegistry | None = REGISTRY,
        agent: str | bool | None = None,
        regions: Regions | bool | None = None,
        agent_region: str | None = None,
    ) -> None:
        settings = ClientSettings.resolve(
            hosts,
            client_id,
            namespace,
            connect_timeout=connect_timeout,
            session_timeout=session_timeout,
            tls=tls,
            identity=identity,
            app=app,
            announce=announce,
            auth=auth,
            cache=cache,
            feedback=feedback,
            prometheus_registry=prometheus_registry,
            agent=agent,
            regions=regions,
            agent_region=agent_region,
        )
        self._settings = settings
        given = settings.session
        #: The host agent's socket this client takes its registry from (None: its own session).
        self.agent = given.agent
        self.cache_config = given.cache
        #: This client's region and the others it may fail over to (None: one region).
        self.regions = settings.regions
        self.namespace = given.namespace
        self.hosts = given.hosts
        self.auth_client = given.auth_client
        self.connect_timeout = given.connect_timeout
        self.tls = given.tls
        parts = ClientParts.build(settings, mirror=self._mirror, connect=self._in_region)
        self.session = session = parts.session
        """Internal, not part of the public API: this process's ZooKeeper session, its
        ephemeral nodes, watches and cache (:class:`~sentinel.session.Session`), the seam the
        role daemons use."""
        self.feedback = parts.feedback
        #: The shard manager's writes: policies and key assignments.
        self.shard_maps = parts.shard_maps
        #: The authentication manager's writes: credentials published and rotated.
        self.credentials = parts.credentials
        # The metric collector's writes, behind update_metrics.
        self._metrics = parts.metrics
        self.regions_router = parts.router
        """Internal, not part of the public API: the other regions' sessions (opened lazily)
        and the failover lookups that go to them (:class:`~sentinel.regions.router.Router`);
        None without other regions. Listen to another region with ``listen(..., region=)``."""
        self._exports = parts.exports
        self._lookup_failures: dict[tuple[str, str], int] = {}
        if self.regions_router is not None:  # a spec's new rule: the regions it names follow
            session.cache.listen(None, self._rule_changed)

    @functools.cached_property
    def _explainer(self) -> Explainer:
        """:meth:`explain` and the message of a lookup that found nothing, made on first use
        (both off the request path)."""
        session = self.session
        return Explainer(
            snapshot=lambda service: self._snapshots.get(service) or self._load(service),
            cached=lambda service: self._snapshots.get(service),
            partition_of=self._partition,
            return_home=lambda: session.cache.return_home,
            feedback=self.feedback,
            protection=self.cache_config.mass_loss_protection,
            regions=self.regions,
            router=self.regions_router,
        )

    def _in_region(self, region: Region) -> Sentinel:
        """A client of another ``region``, for this one's failover lookups (not started)."""
        return Sentinel(**self._settings.in_region(region, self.feedback))

    def _mirror(
        self, client_id: str, snapshots: dict[str, ServiceSnapshot], shard_maps: dict[str, Any]
    ) -> None:
        """What the session tells the facade (:data:`~sentinel.session.Mirror`): stored in
        this order, so a concurrent lookup that sees the new snapshots also sees the new shard
        maps."""
        #: This process's name in ``/clients`` and in logs (a forked child's
        #: ``<parent id>-<pid>``).
        self.client_id = client_id
        self._shard_maps = shard_maps
        self._snapshots = snapshots

    def _rule_changed(self, event: ChangeEvent) -> None:
        """On the cache's worker: a service's spec changed its failover rule (or went)."""
        if isinstance(event, ServiceSpecChanged) and self.regions_router is not None:
            new = None if event.new is None else event.new.failover
            if event.old is not None and event.old.failover != new:
                self.regions_router.rule_changed(event.service, event.old.failover, new)

    def __repr__(self) -> str:
        return (
            f"<Sentinel client_id={self.client_id!r} hosts={self.hosts!r} "
            f"namespace={self.namespace!r} {self.session.state}>"
        )

    def __enter__(self) -> Sentinel:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @translate_zk_errors
    def start(self) -> Sentinel:
        """Connect. Nothing is written (but a key ring's public keys): the namespace and its
        sections are created by the first write (:meth:`register`,
        :meth:`update_metrics`...) or by :meth:`ensure_namespace`; until then reads raise
        :class:`~sentinel.errors.NamespaceNotFound`.

        Raises :class:`ZooKeeperUnavailable` if no server answers within ``connect_timeout``.
        """
        self.session.start()
        if self._exports is not None:
            self._exports.add(self)
        return self

    @translate_zk_errors
    def ensure_namespace(self) -> None:
        """Create the namespace and its five sections unless they exist (what ``sentinel init``
        does without ``--secure``).

        Reads never create anything (a missing namespace is
        :class:`~sentinel.errors.NamespaceNotFound`); writes call this before their first
        write, so publishers and the role daemons need not.
        """
        self.session.ensure_namespace()

    def close(self) -> None:
        """End the session; ZooKeeper removes this client's ephemeral nodes at once.

        In a forked child this ends the child's own session, never the parent's. It may be
        called from a listener (the cache's worker stops once the listener returns), and
        more than once: a closed client's close() does nothing.
        """
        if self.regions_router is not None:
            self.regions_router.close()
        if self.session.close() and self._exports is not None:
            self._exports.discard(self)

    @property
    def session_id(self) -> int | None:
        """The current ZooKeeper session id, None while not connected."""
        return self.session.session_id

    @property
    def registrations(self) -> tuple[Registration, ...]:
        """The registrations this client holds (none in a forked child: the parent's stay
        the parent's)."""
        self.session.check_fork()
        return self.session.publisher.registrations

    @translate_zk_errors
    def ensure_service(
        self,
        service: str,
        scheme: str = "http",
        shard_policy: str | None = None,
        defaults: Mapping[str, Any] | None = None,
        curator: CuratorSource | None = None,
        mark_departures: bool = False,
        failover: Failover | None = None,
    ) -> ServiceSpec:
        """Create the spec of ``service`` unless it exists; return the stored spec.

        ``curator`` makes it a service whose instances a Curator registry holds (JVM
        services registered by Curator, Spring Cloud Zookeeper or Dubbo): the namespace keeps
        its spec, shard policy, metrics and credentials, and each instance's partition is
        read from its payload (:class:`~sentinel.registry.records.CuratorSource`)::

            sentinel.ensure_service(
                "orders-db",
                shard_policy="tenants",
                curator=CuratorSource("/services", partition_from="payload.metadata.shard"),
            )

        ``mark_departures=True`` makes its publishers mark each deregistration (one
        transaction of three operations in place of one delete), so that clients with
        ``CacheConfig(mass_loss_protection=...)`` tell it from a session's expiry and protect
        the service; without it, no client protects the service (``docs/health.md``).

        ``failover`` is where its lookups go when this region has no eligible instance for a
        key's partition (:class:`~sentinel.registry.failover.Failover`: other regions in
        order, or the nearest N by measured round-trip time, and how soon lookups return);
        kept in the spec, so every client of the service agrees (``docs/regions.md``).

        Raises :class:`~sentinel.errors.ShardPolicyNotFound` if ``shard_policy`` names no
        policy (create it first: ``shard_maps.ensure``), and
        :class:`~sentinel.errors.ServiceConflict` if the service exists with other settings;
        either way nothing is written.
        """
        self.session.require_writable()
        spec = ServiceSpec(
            service,
            scheme=scheme,
            shard_policy=shard_policy,
            defaults=defaults,
            curator=curator,
            mark_departures=mark_departures,
            failover=failover,
        )
        if spec.shard_policy is not None:
            # A service partitioned by a policy that does not exist would fail every keyed
            # lookup; refusing it here names the mistake where it is made.
            shards.read_spec(self.session.zk, spec.shard_policy)
        return self.session.publisher.ensure_service(spec)

    @translate_zk_errors
    def set_failover(self, service: str, failover: Failover | None) -> ServiceSpec:
        """Change where lookups of an existing ``service`` go when this region has no eligible
        instance: its spec's ``failover`` field becomes ``failover`` (None removes it: the
        local region only), every other field as stored; returns the stored spec.

        The spec is rewritten with a compare-and-set on its version, so a concurrent change of
        it is never lost (read again, up to a few times, then
        :class:`~sentinel.errors.RegistryConflict`). Every running client of the service
        follows the new rule without a restart (``docs/regions.md``, "Changing a rule"). Raises
        :class:`~sentinel.errors.ServiceNotFound` for a service that does not exist and
        :class:`~sentinel.errors.ValidationError` for a rule that is not a
        :class:`~sentinel.registry.failover.Failover`, or
        :class:`~sentinel.errors.RegionConfigError` for one naming a region this client's
        ``regions`` do not hold; either way nothing is written.
        ``ensure_service`` with the old rule refuses the service afterwards (ServiceConflict):
        the stored spec is the one to agree with.
        """
        if self.regions is not None and isinstance(failover, Failover):
            self.regions.check_failover(failover)
        self.session.require_writable()
        return self.session.publisher.set_failover(service, failover)[1]

    @translate_zk_errors
    def register(
        self,
        service: str,
        partition: str,
        host: str,
        port: int,
        scheme: str | None = None,
        label: str | None = None,
        weight: float = 1,
        zone: str | None = None,
        status: str = "up",
        properties: Mapping[str, Any] | None = None,
        health: HealthCheck | None = None,
    ) -> Registration:
        """Publish a live instance of ``service`` serving ``partition`` at ``host:port``.

        The node is ephemeral and is re-created after a session expiry. ``label`` names the
        instance within its partition (default: ``<host>_<port>``, one label per endpoint, see
        :func:`~sentinel.registry.layout.default_label`); registering the same identity again
        replaces
        the earlier node: this client's own, or another session's node of the same host and
        port (this instance restarted). A label another live instance (another host or port)
        holds raises :class:`~sentinel.errors.LabelTaken` and writes nothing. The host must be
        an IP address or a DNS name. The service spec is created if missing, with ``scheme``
        (default ``"http"``).

        The instance follows its service's spec: without ``scheme`` it takes the spec's (an
        instance of a ``postgresql`` service is a ``postgresql://`` endpoint), and a different
        ``scheme`` given explicitly, or a ``partition`` the service's shard policy does not
        declare, raises :class:`~sentinel.errors.ValidationError`. The spec is read on this
        client's first registration of the service and kept. Invalid input raises
        :class:`~sentinel.errors.ValidationError` before anything is written.

        ``health`` (:class:`~sentinel.health.HealthCheck`) makes the status follow a readiness
        check: published ``starting``, then ``up`` or ``down`` as the check says, damped
        (``docs/health.md``).
        """
        self.session.require_writable()
        instance = InstanceRecord(
            service=service,
            partition=partition,
            label=label if label is not None else default_label(host, port),
            host=host,
            port=port,
            scheme="http" if scheme is None else scheme,
            status=status,
            weight=weight,
            zone=zone,
            properties=properties,
        )
        return self.session.publisher.register(
            instance, inherit_scheme=scheme is None, health=health
        )

    @translate_zk_errors
    def update_registration(self, registration: Registration, **changes: Any) -> Registration:
        """Publish new ``status``, ``weight``, ``zone`` or ``properties`` for a registration.

        The node is rewritten in place, so the instance keeps its place in its cluster's
        order (this is how an instance publishes properties others see, Sling's
        ``PropertyProvider``, or takes itself out of rotation with ``status="draining"`` and
        back with ``status="up"``). Fields not given keep their published value, including a
        status another client set (``sentinel drain``). Returns the new registration.
        """
        self.session.require_writable()
        allowed = {"status", "weight", "zone", "properties"}
        if not changes.keys() <= allowed:
            raise ValidationError(f"only {sorted(allowed)} can change; got {sorted(changes)}")
        return self.session.publisher.update(registration, changes)

    def deregister(self, registration: Registration, *, wait: float = 0.0) -> bool:
        """Remove the instance, then wait ``wait`` seconds for every client to see it gone;
        returns False if this client no longer held it.

        Before a server stops serving, give ``wait=1.0``: every cache has then dropped the
        instance, so no client still picks it (``docs/publishing.md``). To take an instance
        out of rotation and back without removing it, set its status instead
        (``update_registration(registration, status="draining")``, ``sentinel drain``).
        """
        wait = check.number("wait", wait, least=0)  # refused before anything is removed
        removed = self._remove(registration)
        if wait:  # (a sleep of 0 would still hand the interpreter to any other thread)
            time.sleep(wait)
        return removed

    @translate_zk_errors
    def _remove(self, registration: Registration) -> bool:
        self.session.require_started()
        return self.session.publisher.deregister(registration)

    @translate_zk_errors
    def read_service(self, service: str) -> ServiceListing:
        """Read ``service``'s spec and live instances straight from ZooKeeper (no cache).

        For operators and tests; the request path uses the watch-driven cache instead.
        Undecodable nodes are skipped and counted. Raises
        :class:`~sentinel.errors.ServiceNotFound` if the service has no spec.
        """
        self.session.require_started()
        try:
            return read_service(self.session.zk, validate_name("service", service))
        except ServiceNotFound as exc:
            raise not_found(exc, self.session) from None

    # --- resolution ---------------------------------------------------------------------------

    def get_service(
        self,
        service: str,
        key: object = None,
        policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | str | None = None,
        balancer: Balancer | str | None = None,
        failover: Failover | None = None,
    ) -> Endpoint:
        """Resolve ``service`` (and ``key``, for a sharded service) to one endpoint.

        The first call for a service loads it into the cache and sets watches; later calls
        are dictionary lookups on an immutable snapshot. Only instances with status ``up`` are
        ever returned; ``policy`` filters those further (for example on their metrics), and
        ``balancer`` picks one (default: round robin per service). Each is an instance or the
        name it is registered under (``policy="min_lag"``, ``balancer="power_of_two"``, the
        names the CLI takes; built once, with no arguments). Unsharded services ignore ``key``.

        When nothing in the partition is eligible here, the service's failover rule (its
        spec's, or ``failover`` for this call: :data:`~sentinel.registry.failover.LOCAL_ONLY`
        keeps the call local) sends the lookup to another region of ``regions=``; lookups
        return home once this region has been eligible for the rule's ``return_after``
        (``docs/regions.md``).

        Raises :class:`~sentinel.errors.ServiceNotFound`,
        :class:`~sentinel.errors.PartitionNotFound` (the key maps nowhere),
        :class:`~sentinel.errors.NoInstanceAvailable` (nothing eligible in the partition) or
        :class:`~sentinel.errors.ValidationError` (a ``policy`` or ``balancer`` that is neither
        an instance nor a registered name: a class, a number, an unknown name).
        """
        snapshot = self._snapshots.get(service)
        try:
            if snapshot is None:
                snapshot = self._load(service)
            candidates = self._eligible(snapshot, service, key, policy, failover)
            if balancer is None:
                balancer = snapshot.balancer
            elif not isinstance(balancer, Balancer):  # the one check an instance pays
                balancer = as_balancer(balancer)
        except SentinelError as exc:
            self._count_failure(service, exc)
            raise
        snapshot.lookups.ok += 1  # a plain int, read at scrape time (see sentinel.telemetry)
        return balancer.pick(candidates)

    def eligible_instances(
        self,
        service: str,
        key: object = None,
        policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | str | None = None,
        failover: Failover | None = None,
    ) -> tuple[Endpoint, ...]:
        """Every eligible endpoint, for callers that pool connections; errors and
        ``failover`` as get_service (the endpoints of the region that answers)."""
        try:
            snapshot = self._snapshots.get(service) or self._load(service)
            candidates = self._eligible(snapshot, service, key, policy, failover)
        except SentinelError as exc:
            self._count_failure(service, exc)
            raise
        snapshot.lookups.ok += 1
        return tuple(candidates)

    def _count_failure(self, service: object, exc: SentinelError) -> None:
        failures = self._lookup_failures
        key = (str(service), telemetry.lookup_result(exc))
        if key not in failures and len(failures) >= telemetry.MAX_FAILURE_SERIES:
            key = (telemetry.OTHER_SERVICE, key[1])
        failures[key] = failures.get(key, 0) + 1

    @property
    def lookup_counts(self) -> dict[tuple[str, str], int]:
        """Lookups so far by ``(service, result)``; ``ok`` counts for every cached service.

        Counted without a lock, so concurrent lookups may be slightly undercounted; a service
        removed from ZooKeeper and loaded again starts from zero.
        """
        self.session.check_fork()
        counts = {(name, "ok"): s.lookups.ok for name, s in dict(self._snapshots).items()}
        counts.update(self._lookup_failures)
        return counts

    @property
    def snapshot_ages(self) -> dict[str, float]:
        """Seconds since each cached service's snapshot was built from ZooKeeper reads."""
        self.session.check_fork()
        now = time.time()
        return {name: now - s.built_at for name, s in dict(self._snapshots).items()}

    def _eligible(
        self,
        snapshot: ServiceSnapshot,
        service: str,
        key: object,
        policy: object,
        failover: Failover | None = None,
    ) -> Endpoints:
        """The hot path: partition, then policy; no lock and no I/O on a warm cache."""
        # _partition() inlined: the extra call was a measurable share of a warm lookup
        # (docs/benchmarks.md, "Warm lookup").
        shard_policy = snapshot.spec.shard_policy
        partition = None
        if shard_policy is not None:
            if type(key) is not str:  # the one comparison a str key pays for the key rule
                key = shards.shard_key(service, shard_policy, key)
            shard_map = self._shard_maps.get(shard_policy)
            partition = shard_map.lookup(key) if shard_map is not None else None
            if partition is None:
                partition = self.session.cache.read_through(service, shard_policy, key)
        candidates = snapshot.up.get(partition)
        # Ejections apply to the partition's own tuple (a policy's answer is a new one): the
        # feedback decides once per change for it, and a policy chooses among what is left.
        if self.feedback.outliers and candidates:
            candidates = self.feedback.admit(candidates)
        if policy is not None:
            if not isinstance(policy, SelectionPolicy):  # the one check an instance pays
                policy = as_policy(policy)
            if candidates:
                candidates = policy(candidates)  # type: ignore[operator, assignment]
        if not candidates:
            return self._elsewhere(snapshot, service, key, partition, policy, failover)
        return candidates

    def _elsewhere(
        self,
        snapshot: ServiceSnapshot,
        service: str,
        key: object,
        partition: str | None,
        policy: object,
        failover: Failover | None,
    ) -> Endpoints:
        """Nothing eligible here: another region's endpoints under the failover rule, else
        NoInstanceAvailable saying what each region said."""
        rule = snapshot.spec.failover if failover is None else failover
        router = self.regions_router
        if rule is None or rule.local_only:
            raise self._explainer.nothing_eligible(service, key, partition, policy)
        if router is None:
            raise self._explainer.nothing_eligible(
                service,
                key,
                partition,
                policy,
                "; it may fail over, but this client has no other region (Sentinel(regions=...), "
                "$SENTINEL_REGIONS)",
            )
        answer = router.resolve(
            service, key, partition, policy, rule, self.session.cache.return_home
        )
        if isinstance(answer, Answer):
            return answer.candidates  # type: ignore[no-any-return]
        raise self._explainer.nothing_eligible(
            service,
            key,
            partition,
            policy,
            f" in region {router.local!r}; failover ({rule.describe()}): "
            + ("; ".join(answer) or "no region to try"),
        )

    def cached_instances(self, service: str) -> tuple[Endpoint, ...]:
        """Every cached instance of ``service``, any partition or status, by partition and
        label; ``()`` when this client does not follow the service (no lookup, no
        ``prefetch`` yet, or it was removed). Never touches ZooKeeper."""
        self.session.check_fork()
        snapshot = self._snapshots.get(service)
        if snapshot is None:  # a name no service could have is a mistake, not "none yet"
            validate_name("service", service)
            return ()
        return snapshot.partitions[None]

    def prefetch(self, service: str) -> None:
        """Load ``service`` into the cache now, as its first ``get_service`` would.

        Call it at start-up so the first request pays no load, and so listeners hear of the
        service's changes before any lookup. Raises ServiceNotFound if it does not exist.
        """
        self._snapshots.get(service) or self._load(service)

    def _load(self, service: str) -> ServiceSnapshot:
        self.session.require_started()
        # In a forked child the renewal just restored the inherited snapshots: serve them.
        try:
            snapshot = self._snapshots.get(service) or self.session.cache.load(
                validate_name("service", service)
            )
        except ServiceNotFound as exc:
            raise not_found(exc, self.session) from None
        if self.regions_router is not None:
            self.regions_router.follow(service, snapshot.spec.failover)
        return snapshot

    def partition_of(self, service: str, key: object) -> str | None:
        """The partition ``key`` maps to for ``service``; None when it is not sharded.

        ``get_service``'s first step, from the same cache, for callers that group keys by
        partition (the Spark helpers). Raises as ``get_service`` does.
        """
        snapshot = self._snapshots.get(service) or self._load(service)
        shard_policy = snapshot.spec.shard_policy
        return None if shard_policy is None else self._partition(shard_policy, service, key)

    def _partition(self, shard_policy: str, service: str, key: object) -> str:
        """The key's partition: the cached map, else Procedure 1's read-through."""
        key = shards.shard_key(service, shard_policy, key)
        shard_map = self._shard_maps.get(shard_policy)
        partition = shard_map.lookup(key) if shard_map is not None else None
        return partition or self.session.cache.read_through(service, shard_policy, key)

    def explain(
        self,
        service: str,
        key: object = None,
        policy: object = None,
        failover: Failover | None = None,
    ) -> Explanation:
        """What ``get_service`` would consider for this call, step by step.

        For operators (``sentinel resolve``) and debugging; it does the same work as a lookup
        plus a pass per policy, so keep it off the request path. With regions, it says which
        region answers and why (``region``, ``region_reason``): when another region does, the
        explanation is that region's, and ``home`` is this region's.
        """
        return self._explainer.explain(service, key, policy, failover)

    def explain_partition(self, service: str, partition: str | None) -> Explanation:
        """:meth:`explain` of one partition of ``service`` (None: an unsharded service), named
        rather than reached through a key, in this client's own region: each instance's
        verdict there (``sentinel ui`` shows them beside the instances)."""
        return self._explainer.in_partition(service, partition)

    def report(self, endpoint: Endpoint, ok: bool = True, latency: float | None = None) -> None:
        """Tell Sentinel how using ``endpoint`` went (``latency`` in seconds).

        Enough failures eject the instance for a while (see ``feedback``): lookups skip it
        until then, within the bounds that keep its partition served. Reported latencies feed
        load-aware balancers such as ``PowerOfTwoChoices(feedback=sentinel.feedback)``.
        """
        self.feedback.report(endpoint, ok, latency)

    @property
    def ejections(self) -> dict[str, Census]:
        """Per cached service: the instances reported failures eject from lookups now, and
        its partitions in panic (:mod:`sentinel.feedback`); exported as metrics."""
        self.session.check_fork()
        return {
            name: self.feedback.census(
                # the partitions lookups use: each partition's tuple, or the whole service's
                t
                for p, t in s.up.items()
                if (p is None) == (s.spec.shard_policy is None)
            )
            for name, s in dict(self._snapshots).items()
        }

    def listen(
        self, service: str | None, callback: Listener, *, region: str | None = None
    ) -> Callable[[], None]:
        """Call ``callback(event)`` on every change of ``service`` (None: of every service)
        in ``region`` (None: this client's own).

        Events (:mod:`sentinel.events`) carry the diff: instances added, removed or updated,
        shard keys moved, the spec changed, and the connection's state. Callbacks run on the
        cache's worker thread, in order; a slow callback delays the cache. Returns a function
        that removes the listener. Only services this client has resolved are watched.
        ``region`` names another of this client's regions (``regions=``) to hear the same
        events there, from the moment a lookup's failover opens it, and also those of the
        service its failover rule names there (``docs/regions.md``); one listener per region,
        so that a listener written for one ensemble never hears another's instances of the
        same name. A region that is not one of the client's raises
        :class:`~sentinel.errors.ValidationError`.

        Adding a listener reads nothing and never blocks (``AsyncSentinel.events`` adds one on
        the event loop): in a namespace that does not exist, the load that follows
        (:meth:`prefetch`, :meth:`get_service`) raises
        :class:`~sentinel.errors.NamespaceNotFound`.

        A callback may call this client back: a first lookup loads its service on the spot
        (one that needs a region not opened yet raises NoInstanceAvailable at once, the
        region opening in the background, rather than holding this thread),
        :meth:`close` ends the session, and ``credentials.rotate``, which would wait for this
        very thread, raises :class:`~sentinel.errors.CalledFromListener`.
        """
        self.session.check_fork()
        if service is not None:
            validate_name("service", service)
        if region is None or (self.regions is not None and region == self.regions.local):
            return self.session.cache.listen(service, callback)
        if self.regions_router is None:
            raise ValidationError(f"region {region!r}: this client has no other region")
        return self.regions_router.listen(service, callback, region)

    @property
    def connection_state(self) -> str:
        """``connected``, ``suspended`` (serving the last known state), ``lost``, or
        ``snapshot`` (serving the last-known-good snapshot, or in a forked child the parent's
        cache, until the first re-sync has re-read it)."""
        self.session.check_fork()
        return self.session.cache.connection_state if self.session.started else "closed"

    @property
    def staleness(self) -> float:
        """Seconds since the connection was lost (0.0 while connected): how old the cache may be."""
        self.session.check_fork()
        return self.session.staleness

    @property
    def persistent_watches(self) -> bool:
        """True when the cache follows ZooKeeper with persistent recursive watches kept across
        reconnections (asked for, and a ZooKeeper 3.6 or later); False: one-shot watches."""
        self.session.check_fork()
        return self.session.cache.persistent

    @property
    def cache_stats(self) -> CacheStats:
        """Counters of the cache: decode errors, read-throughs, negative-cache hits, re-syncs."""
        self.session.check_fork()
        return self.session.cache.stats

    # --- metrics (the metric collector's writer API) --------------------------------------------

    @overload
    def update_metrics(
        self,
        instance: Registration,
        metrics: Mapping[str, MetricValue],
        /,
        *,
        measured_at: float | None = None,
    ) -> MetricsRecord: ...

    @overload
    def update_metrics(
        self,
        instance: str,
        partition: str,
        label: str,
        metrics: Mapping[str, MetricValue],
        /,
        *,
        measured_at: float | None = None,
    ) -> MetricsRecord: ...

    @translate_zk_errors
    def update_metrics(
        self, instance: Registration | str, *args: Any, measured_at: float | None = None
    ) -> MetricsRecord:
        """Publish an instance's run-time metrics, replacing the ones published before.

        The instance is the :class:`Registration` that :meth:`register` returned, or
        its service, partition and label (a collector publishing for instances that other
        processes registered)::

            sentinel.update_metrics(registration, {"replication_lag": 2.5})
            sentinel.update_metrics("orders-db", "p1", "replica-a", {"replication_lag": 2.5})

        Values are finite numbers or strings of at most 256 characters, at most 256 metrics.
        ``measured_at`` (Unix seconds, default now) is when they were measured, so policies can
        tell fresh from stale. The node is persistent: metrics outlive a collector's session,
        and their age says how much to trust them. Metrics for an instance that is not
        registered raise :class:`~sentinel.errors.InstanceNotRegistered` (a
        :class:`~sentinel.errors.ValidationError`) and nothing is written: the check is part
        of the write's own transaction, so it costs no extra round trip. An instance of a
        service whose spec names a Curator registry is checked there instead, just before
        the write (three more reads, and not atomic: see ``docs/interop.md``).
        """
        return self._metrics.update(instance, *args, measured_at=measured_at)
