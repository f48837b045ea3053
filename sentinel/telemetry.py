"""Prometheus telemetry for the client library and every role: all metric definitions.

Two kinds of metrics live here.

**Per-client state**, read when Prometheus scrapes: lookups by service and result, snapshot age,
connection state, session and watch events, decode errors. The hot path never calls
``prometheus_client``: ``get_service`` adds one to a plain ``int`` on the service's snapshot
(:class:`LookupCounts`; docs/telemetry.md says what it costs), and :class:`ClientCollector`
reads those fields at scrape time. Increments from several threads at once are not atomic
(``+=`` on an attribute), so a count may fall short by the few increments that raced; lookups
are counted, not audited.

**Process-wide events**, ordinary ``prometheus_client`` objects updated where they happen (off
the hot path): the propagation-delay histogram, auth versions and rotations, the collector's
scrapes, the shard manager's placements.

Nothing is exported until :func:`register` puts both into a registry. A :class:`~sentinel.Sentinel`
client does that itself with ``prometheus_registry`` (default: ``prometheus_client``'s default
registry); ``prometheus_registry=None`` is the off switch: the client is not exported and adds
nothing to any registry. The daemons (``sentinel collector run``, ``sentinel shard serve``)
serve their registry on ``--metrics-port``. Names follow Prometheus conventions: ``sentinel_``
prefix, base units (seconds), ``_total`` on counters. ``docs/telemetry.md`` lists them all.

The authentication manager reports through two calls::

    telemetry.auth_version_applied("billing-db", 7)   # this client now uses version 7
    telemetry.auth_rotation("billing-db", "completed")  # or "started", "failed"
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sentinel.errors import (
    ClientClosed,
    NoInstanceAvailable,
    PartitionNotFound,
    ReadThroughThrottled,
    ServiceNotFound,
    ValidationError,
    ZooKeeperUnavailable,
)

if TYPE_CHECKING:
    from kazoo.protocol.states import ZnodeStat

# Distinct (service, result) pairs of failed lookups a client keeps apart; beyond that they
# are counted under OTHER_SERVICE, so arbitrary names asked for cannot grow the exposition.
MAX_FAILURE_SERIES = 1_000
OTHER_SERVICE = "(other)"

# Loopback propagation is milliseconds; the tail reaches the session timeout after a reconnect.
PROPAGATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class LookupCounts:
    """Successful lookups of one service, carried from snapshot to snapshot.

    A plain ``int`` field, because the hot path can afford an attribute increment and not a
    ``Counter.labels().inc()``; see the module docstring for what "approximate" means.
    """

    __slots__ = ("ok",)

    def __init__(self) -> None:
        self.ok = 0


# The ``result`` label of a failed lookup, by the error it raised (first match wins).
LOOKUP_RESULTS = (
    (ServiceNotFound, "service_not_found"),
    (PartitionNotFound, "partition_not_found"),
    (ReadThroughThrottled, "throttled"),
    (NoInstanceAvailable, "no_instance"),
    (ValidationError, "invalid"),
    (ClientClosed, "closed"),
    (ZooKeeperUnavailable, "unavailable"),
)


def lookup_result(exc: Exception) -> str:
    """The ``result`` label for a lookup that raised ``exc`` (``error`` if none fits)."""
    return next((name for kind, name in LOOKUP_RESULTS if isinstance(exc, kind)), "error")


# --- process-wide event metrics (created unregistered; register() exports them) -------------

PROPAGATION_DELAY = Histogram(
    "sentinel_propagation_delay_seconds",
    "Time from a znode's modification (its mtime) to the cache applying it, by section.",
    ["section"],
    buckets=PROPAGATION_BUCKETS,
    registry=None,
)
AUTH_VERSION = Gauge(
    "sentinel_auth_version_applied",
    "The credential version this process applied last, by service.",
    ["service"],
    registry=None,
)
AUTH_ROTATIONS = Counter(
    "sentinel_auth_rotations_total",
    "Credential rotations by service and outcome (started, completed, failed).",
    ["service", "outcome"],
    registry=None,
)
SCRAPE_DURATION = Histogram(
    "sentinel_collector_scrape_duration_seconds",
    "Time a metric collector took to collect one instance, by service and source.",
    ["service", "source"],
    registry=None,
)
SCRAPES = Counter(
    "sentinel_collector_scrapes_total",
    "Collections attempted by a metric collector, by service and source.",
    ["service", "source"],
    registry=None,
)
SCRAPE_ERRORS = Counter(
    "sentinel_collector_scrape_errors_total",
    "Failed collections by service, source and reason (timeout, error, publish).",
    ["service", "source", "reason"],
    registry=None,
)
COLLECTOR_INSTANCES = Gauge(
    "sentinel_collector_instances",
    "Instances this metric collector is responsible for, by service.",
    ["service"],
    registry=None,
)
COLLECTOR_MEMBERS = Gauge(
    "sentinel_collector_members",
    "Live members of this metric collector's cluster that run its configuration and split "
    "its instances (this member included unless its configuration was refused).",
    registry=None,
)
SHARD_PLACEMENTS = Counter(
    "sentinel_shard_placements_total",
    "Keys placed by the shard manager, by policy.",
    ["policy"],
    registry=None,
)
SHARD_ALERTS = Counter(
    "sentinel_shard_alerts_total",
    "Partitions in use found without a live instance by the shard manager, by policy.",
    ["policy"],
    registry=None,
)
SHARD_LEADER = Gauge(
    "sentinel_shard_manager_leader",
    "1 while this shard manager replica leads its policy, else 0.",
    ["policy"],
    registry=None,
)
AGENT_PROCESSES = Gauge(
    "sentinel_agent_processes",
    "Processes connected to this host agent.",
    registry=None,
)
AGENT_REGION_PROCESSES = Gauge(
    "sentinel_agent_region_processes",
    "Processes this host agent serves from its session to another region, by region (regions "
    "its configuration holds, from the first process that needed each).",
    ["region"],
    registry=None,
)
AGENT_REGION_STALENESS = Gauge(
    "sentinel_agent_region_staleness_seconds",
    "Seconds since this host agent's session to another region was connected (0 while it is; "
    "counted from its opening until it first connects), by region, from the first process "
    "that needed the region.",
    ["region"],
    registry=None,
)
AGENT_SENT_BYTES = Counter(
    "sentinel_agent_sent_bytes_total",
    "Bytes this host agent sent to its processes.",
    registry=None,
)
AGENT_FRAMES = Counter(
    "sentinel_agent_frames_total",
    "Frames this host agent sent to its processes, by kind (service: a service's whole "
    "state, delta: what one change of a service changed, auth: a credential node, "
    "buckets/policy: a shard map's, connection: its session's).",
    ["op"],
    registry=None,
)
AGENT_DROPPED = Counter(
    "sentinel_agent_dropped_connections_total",
    "Connections this host agent dropped, by reason (refused: a peer not allowed; cap: over "
    "the connection caps, in all or of its uid; hello: no hello within the deadline; "
    "protocol: a frame that is not a message; region: a hello naming a region the agent is not "
    "configured with; slow: a process that stopped reading; silent: a "
    "process that sent nothing, not even a heartbeat; error: the agent's own failure, logged).",
    ["reason"],
    registry=None,
)
AGENT_IDENTITIES_REFUSED = Counter(
    "sentinel_agent_identities_refused_total",
    "Requests of a process this host agent could not serve as the process's identity: every "
    "identity session its user may hold keeps a live process's /clients entries (logged).",
    registry=None,
)
AGENT_UNSENT = Counter(
    "sentinel_agent_unsent_frames_total",
    "Services' frames this host agent could not send (larger than its frame bound, or a node "
    "it could not encode): the process was sent an error naming the service instead.",
    registry=None,
)
AGENT_ERRORS = Counter(
    "sentinel_agent_errors_total",
    "Errors this host agent's socket loop met and went on after, by where (accept: "
    "accepting or admitting a connection; loop: anywhere else), each logged.",
    ["where"],
    registry=None,
)
AGENT_XDS_STREAMS = Gauge(
    "sentinel_agent_xds_streams",
    "xDS streams (gRPC clients) this host agent serves now.",
    registry=None,
)
AGENT_XDS_RESPONSES = Counter(
    "sentinel_agent_xds_responses_total",
    "xDS responses this host agent sent, by resource type (listener, cluster, endpoints).",
    ["type"],
    registry=None,
)
AGENT_XDS_DROPPED = Counter(
    "sentinel_agent_xds_dropped_streams_total",
    "xDS streams this host agent ended or refused, by reason (slow: a client that left a "
    "response unread for the send timeout; names: a request naming more resources than a "
    "stream, or services than its user's streams, may follow; cap: a stream over the streams "
    "served, in all or of its user; malformed: a message that is not a request; error: the "
    "agent's own failure, logged).",
    ["reason"],
    registry=None,
)
AGENT_XDS_NACKS = Counter(
    "sentinel_agent_xds_nacks_total",
    "xDS responses a gRPC client refused (each logged with the client's reason).",
    registry=None,
)
AGENT_XDS_SKIPPED = Counter(
    "sentinel_agent_xds_skipped_total",
    "What this host agent's xDS server left out of a resource, by reason (address: an "
    "instance whose host is not an IP address; size: a resource over its bound), each logged.",
    ["reason"],
    registry=None,
)
AGENT_DNS_QUERIES = Counter(
    "sentinel_agent_dns_queries_total",
    "DNS queries this host agent received, by transport (udp, tcp), dropped ones included.",
    ["transport"],
    registry=None,
)
AGENT_DNS_ANSWERS = Counter(
    "sentinel_agent_dns_answers_total",
    "DNS answers this host agent sent, by kind (a, aaaa, srv, txt, soa: records of that type; "
    "empty: a known name with none; nxdomain; refused: outside its zone; formerr; notimp; "
    "truncated: too large for UDP, TC set).",
    ["kind"],
    registry=None,
)
AGENT_DNS_DROPPED = Counter(
    "sentinel_agent_dns_dropped_total",
    "DNS queries this host agent dropped unanswered, by reason (malformed: not a DNS query; "
    "oversized: over its bound; rate: over its source's rate; busy: too many queries waiting "
    "for a load, or services followed; unloaded: the service could not be loaded within the "
    "wait, never answered negatively; connections: a TCP connection over the caps; error: "
    "the agent's own failure, logged).",
    ["reason"],
    registry=None,
)
AGENT_DNS_LATENCY = Histogram(
    "sentinel_agent_dns_latency_seconds",
    "Seconds from a DNS query's arrival to its answer's sending, in this host agent.",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0, 2.5),
    registry=None,
)
AGENT_DNS_SKIPPED = Counter(
    "sentinel_agent_dns_skipped_total",
    "Instances this host agent's DNS server left out of an answer because their host is not "
    "an IP address.",
    registry=None,
)
HEALTH_CHANGES = Counter(
    "sentinel_health_status_changes_total",
    "Changes of an instance's status made by its readiness check in this process, by service, "
    "health source (check:http, check:tcp, check:grpc, check:call) and the new status (up, down).",
    ["service", "source", "status"],
    registry=None,
)
HEALTH_DOWN = Gauge(
    "sentinel_health_checks_down",
    "Instances registered by this process whose readiness check has them down, by service and "
    "health source.",
    ["service", "source"],
    registry=None,
)

EVENT_METRICS = (
    PROPAGATION_DELAY,
    AUTH_VERSION,
    AUTH_ROTATIONS,
    SCRAPE_DURATION,
    SCRAPES,
    SCRAPE_ERRORS,
    COLLECTOR_INSTANCES,
    COLLECTOR_MEMBERS,
    SHARD_PLACEMENTS,
    SHARD_ALERTS,
    SHARD_LEADER,
    AGENT_PROCESSES,
    AGENT_REGION_PROCESSES,
    AGENT_REGION_STALENESS,
    AGENT_SENT_BYTES,
    AGENT_FRAMES,
    AGENT_DROPPED,
    AGENT_IDENTITIES_REFUSED,
    AGENT_UNSENT,
    AGENT_ERRORS,
    AGENT_XDS_STREAMS,
    AGENT_XDS_RESPONSES,
    AGENT_XDS_DROPPED,
    AGENT_XDS_NACKS,
    AGENT_XDS_SKIPPED,
    AGENT_DNS_QUERIES,
    AGENT_DNS_ANSWERS,
    AGENT_DNS_DROPPED,
    AGENT_DNS_LATENCY,
    AGENT_DNS_SKIPPED,
    HEALTH_CHANGES,
    HEALTH_DOWN,
)


def observe_propagation(section: str, stat: ZnodeStat) -> None:
    """Record how long a change of ``section`` took from ZooKeeper to the cache.

    Called on the cache's worker thread right after the read that applies the change. The
    server stamped ``mtime``; on one host (or with synchronised clocks) the difference is the
    propagation delay. A negative difference (clock skew) counts as zero.
    """
    PROPAGATION_DELAY.labels(section).observe(max(time.time() - stat.mtime / 1000.0, 0.0))


def auth_version_applied(service: str, version: int) -> None:
    """The authentication side's report: this process now uses ``version`` for ``service``."""
    AUTH_VERSION.labels(service).set(version)


def auth_version_forgotten(service: str) -> None:
    """This process no longer serves ``service``: its applied version's series goes."""
    with contextlib.suppress(KeyError):  # never applied one
        AUTH_VERSION.remove(service)


def auth_rotation(service: str, outcome: str) -> None:
    """The authentication manager's report: a rotation of ``service`` ``started``,
    ``completed`` or ``failed``."""
    AUTH_ROTATIONS.labels(service, outcome).inc()


# --- per-client state, read at scrape time ----------------------------------------------------


class CacheCounters(Protocol):
    """The counters of a client's cache that are exported (``sentinel.cache.CacheStats``)."""

    @property
    def session_events(self) -> Mapping[str, int]: ...
    @property
    def watch_events(self) -> int: ...
    @property
    def decode_errors(self) -> int: ...
    @property
    def auth_errors(self) -> int: ...
    @property
    def resyncs(self) -> int: ...
    @property
    def read_throughs(self) -> int: ...
    @property
    def negative_hits(self) -> int: ...
    @property
    def clients_write_failures(self) -> int: ...
    @property
    def protected(self) -> Mapping[str, int]: ...
    @property
    def protection_episodes(self) -> int: ...


class FeedbackCounters(Protocol):
    """The counters of a client's feedback that are exported
    (``sentinel.feedback.InstanceFeedback``)."""

    @property
    def panic_episodes(self) -> Mapping[str, int]: ...


class RegionCounters(Protocol):
    """What :class:`ClientCollector` reads of a client's other regions
    (:class:`~sentinel.regions.router.Router`)."""

    local: str
    failovers: Mapping[tuple[str, str], int]
    answered: Mapping[tuple[str, str], int]

    def states(self) -> Mapping[str, tuple[float, float]]: ...


class ExportedClient(Protocol):
    """What :class:`ClientCollector` reads from a client at scrape time; a
    :class:`~sentinel.Sentinel` is one. A protocol rather than the client class, so that this
    module, which the client and its cache import, imports neither of them."""

    @property
    def client_id(self) -> str: ...
    @property
    def lookup_counts(self) -> Mapping[tuple[str, str], int]: ...
    @property
    def snapshot_ages(self) -> Mapping[str, float]: ...
    @property
    def connection_state(self) -> str: ...
    @property
    def staleness(self) -> float: ...
    @property
    def cache_stats(self) -> CacheCounters: ...
    @property
    def ejections(self) -> Mapping[str, tuple[int, int]]: ...
    @property
    def feedback(self) -> FeedbackCounters: ...
    @property
    def regions_router(self) -> RegionCounters | None: ...


class ClientCollector(Collector):
    """Exports the state of the clients registered with one registry, read at scrape time.

    Clients are held weakly and leave on ``close()``; series of several clients with the same
    ``client`` id are summed.
    """

    def __init__(self) -> None:
        self._clients: weakref.WeakSet[ExportedClient] = weakref.WeakSet()

    def add(self, client: ExportedClient) -> None:
        """Export ``client`` from now on."""
        self._clients.add(client)

    def discard(self, client: ExportedClient) -> None:
        """Stop exporting ``client``."""
        self._clients.discard(client)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """The metric families of every registered client (called by the registry)."""
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "lookups": CounterMetricFamily(
                "sentinel_lookups",
                "get_service/eligible_instances calls by service and result.",
                labels=["client", "service", "result"],
            ),
            "age": GaugeMetricFamily(
                "sentinel_cache_snapshot_age_seconds",
                "Seconds since the cached snapshot of a service was built from ZooKeeper reads.",
                labels=["client", "service"],
            ),
            "state": GaugeMetricFamily(
                "sentinel_zookeeper_connection_state",
                "1 for the client's current connection state "
                "(connected, suspended, lost), 0 for the others.",
                labels=["client", "state"],
            ),
            "staleness": GaugeMetricFamily(
                "sentinel_cache_staleness_seconds",
                "Seconds since the connection was lost (0 while connected).",
                labels=["client"],
            ),
            "session": CounterMetricFamily(
                "sentinel_zookeeper_session_events",
                "ZooKeeper connection state changes seen (connected, suspended, lost).",
                labels=["client", "event"],
            ),
            "ejected": GaugeMetricFamily(
                "sentinel_feedback_ejected_instances",
                "Instances the client's lookups skip now for their reported failures "
                "(outlier detection, within max_ejection_percent), by service.",
                labels=["client", "service"],
            ),
            "panicking": GaugeMetricFamily(
                "sentinel_feedback_panic_partitions",
                "Partitions in panic now (too few instances free of ejection: lookups there "
                "ignore ejections), by service.",
                labels=["client", "service"],
            ),
            "panics": CounterMetricFamily(
                "sentinel_feedback_panic_episodes",
                "Panic episodes begun (a partition's lookups ignoring ejections), by service.",
                labels=["client", "service"],
            ),
            "protected": GaugeMetricFamily(
                "sentinel_cache_protected_instances",
                "Instances served that the registry no longer lists (their sessions ended in "
                "a mass loss), under protection from mass loss, by service.",
                labels=["client", "service"],
            ),
            "region_rtt": GaugeMetricFamily(
                "sentinel_region_rtt_seconds",
                "Round-trip time the client measures to another region's ensemble (median of "
                "its last requests; +Inf while it does not answer), for regions it has opened.",
                labels=["client", "region"],
            ),
            "region_staleness": GaugeMetricFamily(
                "sentinel_region_staleness_seconds",
                "Seconds since the client's connection to a region was lost (0 while "
                "connected): its own region's and each other region it has opened.",
                labels=["client", "region"],
            ),
            "failovers": CounterMetricFamily(
                "sentinel_region_failovers",
                "Failover episodes begun: a service's partition with no eligible instance in "
                "the local region, answered by another, by service and answering region.",
                labels=["client", "service", "region"],
            ),
            "region_lookups": CounterMetricFamily(
                "sentinel_region_lookups",
                "Lookups answered by another region than the client's own, by service and region.",
                labels=["client", "service", "region"],
            ),
        }
        stats_families = {
            field: CounterMetricFamily(f"sentinel_cache_{field}", help_text, labels=["client"])
            for field, help_text in (
                ("watch_events", "ZooKeeper watch events received by the cache."),
                ("decode_errors", "Nodes the cache could not decode and skipped."),
                (
                    "auth_errors",
                    "Credential envelopes refused (unreadable, unsigned, or older than the one "
                    "applied).",
                ),
                ("resyncs", "Full re-reads after a reconnection."),
                ("read_throughs", "Shard keys read from ZooKeeper on a cache miss (Procedure 1)."),
                ("negative_hits", "Shard-key misses answered by the negative cache."),
                (
                    "clients_write_failures",
                    "Writes of this client's /clients entries that failed (retried).",
                ),
                (
                    "protection_episodes",
                    "Mass losses (session expiries) the cache began to protect from.",
                ),
            )
        }
        lookups: dict[tuple[str, str, str], int] = {}
        ages: dict[tuple[str, str], float] = {}
        session: dict[tuple[str, str], int] = {}
        # (client, service) -> [ejected, partitions in panic, panic episodes]
        feedback: dict[tuple[str, str], list[int]] = {}
        protected: dict[tuple[str, str], int] = {}
        stats: dict[str, dict[str, int]] = {field: {} for field in stats_families}
        for client in list(self._clients):
            cid = client.client_id
            for (service, result), count in client.lookup_counts.items():
                key = (cid, service, result)
                lookups[key] = lookups.get(key, 0) + count
            for service, age in client.snapshot_ages.items():
                ages[(cid, service)] = max(ages.get((cid, service), 0.0), age)
            for state in ("connected", "suspended", "lost"):
                current = 1.0 if client.connection_state == state else 0.0
                families["state"].add_metric([cid, state], current)
            families["staleness"].add_metric([cid], client.staleness)
            cache_stats = client.cache_stats
            for event, count in dict(cache_stats.session_events).items():  # kazoo's thread writes
                session[(cid, event)] = session.get((cid, event), 0) + count
            for service, count in cache_stats.protected.items():  # replaced whole, never changed
                protected[(cid, service)] = protected.get((cid, service), 0) + count
            for field, values in stats.items():
                values[cid] = values.get(cid, 0) + getattr(cache_stats, field)
            # census first: it notes the panics that ended since the last lookup
            for service, (ejected, panicking) in client.ejections.items():
                counts = feedback.setdefault((cid, service), [0, 0, 0])
                counts[0] += ejected
                counts[1] += panicking
            for service, episodes in dict(client.feedback.panic_episodes).items():
                feedback.setdefault((cid, service), [0, 0, 0])[2] += episodes
            router = getattr(client, "regions_router", None)  # a stand-in may have none
            if router is not None:
                families["region_staleness"].add_metric([cid, router.local], client.staleness)
                for region, (rtt, staleness) in sorted(router.states().items()):
                    families["region_rtt"].add_metric([cid, region], rtt)
                    families["region_staleness"].add_metric([cid, region], staleness)
                for (service, region), count in sorted(dict(router.failovers).items()):
                    families["failovers"].add_metric([cid, service, region], count)
                for (service, region), count in sorted(dict(router.answered).items()):
                    families["region_lookups"].add_metric([cid, service, region], count)
        for lookup, count in sorted(lookups.items()):
            families["lookups"].add_metric(list(lookup), count)
        for series, age in sorted(ages.items()):
            families["age"].add_metric(list(series), age)
        for event_series, count in sorted(session.items()):
            families["session"].add_metric(list(event_series), count)
        for series, (ejected, panicking, episodes) in sorted(feedback.items()):
            families["ejected"].add_metric(list(series), ejected)
            families["panicking"].add_metric(list(series), panicking)
            families["panics"].add_metric(list(series), episodes)
        for service_series, count in sorted(protected.items()):
            families["protected"].add_metric(list(service_series), count)
        for field, family in stats_families.items():
            for cid, count in sorted(stats[field].items()):
                family.add_metric([cid], count)
        yield from families.values()
        yield from stats_families.values()


_exports: weakref.WeakKeyDictionary[CollectorRegistry, ClientCollector] = (
    weakref.WeakKeyDictionary()
)
_exports_lock = threading.Lock()


def register(registry: CollectorRegistry = REGISTRY) -> ClientCollector:
    """Export Sentinel's metrics from ``registry`` (once per registry); return its client
    collector, to which :class:`~sentinel.Sentinel` clients add themselves."""
    with _exports_lock:
        collector = _exports.get(registry)
        if collector is None:
            collector = ClientCollector()
            registry.register(collector)
            for metric in EVENT_METRICS:
                registry.register(metric)
            _exports[registry] = collector
        return collector
