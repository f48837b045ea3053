"""What each page shows, computed from what was read: pure functions, no I/O, no server.

Each function takes the cache's snapshots and the records the CLI's readers return and gives
a view model the templates only lay out, so that the words and numbers are tested here
without a browser or a server. Nothing secret reaches a view model: an endpoint's ``auth``
(its decrypted credential) is never read, and a property whose name says it holds a secret
is shown as ``***``.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sentinel.cache.views import ServiceSnapshot
from sentinel.eligibility import nothing_up
from sentinel.explain import Explanation
from sentinel.health.sources import health_of
from sentinel.registry.dependencies import DependencyGraph
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.records import CHECK_PASSING, ClientRecord
from sentinel.shards.spec import ShardPolicySpec
from sentinel.tables import age, metrics_text
from sentinel.zk.redaction import REDACTED

#: A property whose name matches is a secret someone published by mistake: never shown.
SECRET_NAME = re.compile(
    r"pass(word|wd|phrase)?|secret|token|credential|private|api[-_]?key|auth|cookie|session",
    re.IGNORECASE,
)


def shown_properties(properties: Mapping[str, object]) -> list[tuple[str, str]]:
    """An instance's properties as ``(name, text)``, secret-looking ones as ``***``."""
    return [
        (name, REDACTED if SECRET_NAME.search(name) else str(value))
        for name, value in sorted(properties.items())
    ]


# --- services -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceRow:
    """One line of the services page."""

    name: str
    #: Why the dashboard's identity cannot read the service (None: it can).
    unreadable: str | None = None
    scheme: str = "-"
    shard_policy: str | None = None
    instances: int = 0
    up: int = 0
    #: Instances by health state (``up``, ``down``, ``draining``...), most first.
    health: tuple[tuple[str, int], ...] = ()
    partitions: int = 0
    unserved: tuple[str, ...] = ()
    failover: str = "local only"
    followers: int = 0

    @property
    def failing(self) -> bool:
        """Unreadable, without an instance, with one not up or a partition nothing serves."""
        return (
            self.unreadable is not None
            or self.instances == 0
            or self.up < self.instances
            or bool(self.unserved)
        )


@dataclass(frozen=True)
class ServicesView:
    """The services page: every service listed, or the failing ones only."""

    rows: tuple[ServiceRow, ...]
    total: int
    failing: int
    failing_only: bool


def _health_counts(endpoints: Iterable[Endpoint]) -> tuple[tuple[str, int], ...]:
    counts = collections.Counter(health_of(e.health, e.status, e.metrics)[1] for e in endpoints)
    return tuple(counts.most_common())


def live_followers(records: Mapping[str, ClientRecord]) -> int:
    """Processes following a service: its ``/clients`` entries no agent marked as left."""
    return sum(record.left is None for record in records.values())


def declared_partitions(snapshot: ServiceSnapshot, declared: Iterable[str]) -> list[str]:
    """A sharded service's partitions: those its shard policy declares (``declared``) and
    those its instances serve, sorted; none for an unsharded service."""
    if snapshot.spec.shard_policy is None:
        return []
    return sorted({*declared, *(p for p in snapshot.partitions if p is not None)})


def service_row(
    name: str,
    snapshot: ServiceSnapshot | None,
    followers: Mapping[str, ClientRecord],
    unreadable: str | None = None,
    declared: Iterable[str] = (),
) -> ServiceRow:
    """One service's line: from its cached snapshot, or why there is none (``declared``:
    the partitions its shard policy declares)."""
    if snapshot is None:
        return ServiceRow(name, unreadable or "not loaded yet", followers=live_followers(followers))
    spec = snapshot.spec
    everything = snapshot.partitions.get(None, ())
    partitions = declared_partitions(snapshot, declared)
    return ServiceRow(
        name=name,
        scheme=spec.scheme,
        shard_policy=spec.shard_policy,
        instances=len(everything),
        up=sum(e.status == "up" for e in everything),
        health=_health_counts(everything),
        partitions=len(partitions),
        unserved=tuple(sorted(p for p in partitions if not snapshot.up.get(p))),
        failover="local only" if spec.failover is None else spec.failover.describe(),
        followers=live_followers(followers),
    )


def services_view(
    listed: Sequence[str],
    snapshots: Mapping[str, ServiceSnapshot],
    clients: Mapping[str, Mapping[str, ClientRecord]],
    unreadable: Mapping[str, str],
    *,
    failing_only: bool = False,
    declared: Mapping[str, Sequence[str]] | None = None,
) -> ServicesView:
    """The services page from the listing, the cache and ``/clients`` (``declared``: each
    shard policy's declared partitions)."""
    declared = declared or {}
    rows = []
    for name in sorted(listed):
        snapshot = snapshots.get(name)
        policy = None if snapshot is None else snapshot.spec.shard_policy
        rows.append(
            service_row(
                name,
                snapshot,
                clients.get(name, {}),
                unreadable.get(name),
                declared.get(policy or "", ()),
            )
        )
    failing = [row for row in rows if row.failing]
    return ServicesView(
        tuple(failing if failing_only else rows), len(rows), len(failing), failing_only
    )


# --- one service ----------------------------------------------------------------------------


@dataclass(frozen=True)
class InstanceRow:
    """One instance on a service's page."""

    name: str
    partition: str
    label: str
    address: str
    zone: str
    weight: float
    status: str
    health_source: str
    health_state: str
    #: What the instance's readiness check last published when it is failing, else None.
    check_result: str | None
    #: Why it is (not) eligible, in ``explain()``'s words.
    verdict: str
    eligible: bool
    metrics: str
    metrics_age: str
    registered: str
    protected: bool
    properties: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class PartitionView:
    """A partition (None: an unsharded service's instances) and what is wrong with it."""

    name: str | None
    instances: tuple[InstanceRow, ...]
    #: ``has 2 instance(s) but none is eligible: ...`` when nothing there is up, else None.
    problem: str | None
    panic: bool = False


@dataclass(frozen=True)
class ServiceView:
    """A service's page."""

    name: str
    scheme: str
    shard_policy: str | None
    failover: str
    partitions: tuple[PartitionView, ...]
    followers: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    unprotected: str | None = None


def instance_row(endpoint: Endpoint, verdict: str, now: float) -> InstanceRow:
    """One instance's line (``verdict``: its explain() verdict)."""
    source, state = health_of(endpoint.health, endpoint.status, endpoint.metrics)
    result = endpoint.check_result
    failing = result is not None and result != CHECK_PASSING and state != "up"
    return InstanceRow(
        name=endpoint.name,
        partition=endpoint.partition,
        label=endpoint.label,
        address=f"{endpoint.host}:{endpoint.port}",
        zone=endpoint.zone or "-",
        weight=endpoint.weight,
        status=endpoint.status,
        health_source=source,
        health_state=state,
        check_result=result if failing else None,
        verdict=verdict,
        eligible=verdict.startswith("eligible"),
        metrics=metrics_text(endpoint.metrics) or "-",
        metrics_age=age(None if endpoint.metrics_at is None else now - endpoint.metrics_at),
        registered=age(now - endpoint.registered_at),
        protected=endpoint.protected,
        properties=tuple(shown_properties(endpoint.properties)),
    )


def service_view(
    name: str,
    snapshot: ServiceSnapshot,
    explanations: Mapping[str | None, Explanation],
    followers: Mapping[str, ClientRecord],
    now: float,
) -> ServiceView:
    """A service's page: each partition's instances with explain()'s verdicts
    (``explanations``: :meth:`Sentinel.explain_partition` of each partition to show, a
    declared one without instances included)."""
    spec = snapshot.spec
    partitions = []
    for partition in sorted(explanations, key=lambda p: p or ""):
        explanation = explanations[partition]
        verdicts = explanation.verdicts
        instances = snapshot.partitions.get(partition, ())
        partitions.append(
            PartitionView(
                partition,
                tuple(instance_row(e, verdicts.get(e.name, "eligible"), now) for e in instances),
                None if explanation.eligible else nothing_up(instances),
                explanation.panic,
            )
        )
    return ServiceView(
        name=name,
        scheme=spec.scheme,
        shard_policy=spec.shard_policy,
        failover="local only" if spec.failover is None else spec.failover.describe(),
        partitions=tuple(partitions),
        followers=tuple(
            sorted((client, record.app or client) for client, record in followers.items())
        ),
        unprotected=next((e.unprotected for e in explanations.values() if e.unprotected), None),
    )


# --- topology -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    """``source`` uses ``target`` through ``clients``; ``health`` is the target's."""

    source: str
    target: str
    clients: tuple[str, ...]
    health: str


@dataclass(frozen=True)
class TopologyView:
    """Who follows what, from ``/clients``, with the health of each edge's target."""

    edges: tuple[Edge, ...]
    cycles: tuple[tuple[str, ...], ...]


def target_health(row: ServiceRow | None) -> str:
    """``ok``, ``failing`` or ``unknown`` (not a registered service: an app)."""
    if row is None:
        return "unknown"
    return "failing" if row.failing else "ok"


def topology_view(graph: DependencyGraph, rows: Mapping[str, ServiceRow]) -> TopologyView:
    """The dependency graph ``sentinel deps`` reads, each edge with its target's health."""
    edges = tuple(
        Edge(source, target, tuple(clients), target_health(rows.get(target)))
        for source, targets in graph.edges.items()
        for target, clients in targets.items()
    )
    return TopologyView(edges, tuple(tuple(c) for c in graph.cycles()))


_EDGE_COLOURS = {"ok": "#2e7d32", "failing": "#c62828", "unknown": "#757575"}


def topology_dot(view: TopologyView) -> str:
    """The graph in Graphviz's language: edges coloured by their target's health."""
    lines = ["digraph dependencies {", "  rankdir=LR;", '  node [shape=box, fontname="sans"];']
    for edge in view.edges:
        colour = _EDGE_COLOURS[edge.health]
        lines.append(
            f"  {_dot_id(edge.source)} -> {_dot_id(edge.target)} "
            f'[color="{colour}", tooltip={_dot_id(edge.health)}];'
        )
    lines.append("}")
    return "\n".join(lines)


def _dot_id(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# --- rotations, agents ----------------------------------------------------------------------


@dataclass(frozen=True)
class FollowerRow:
    """One process following a service (a ``/clients`` entry)."""

    service: str
    client: str
    app: str
    host: str
    pid: str
    auth_client: str
    auth_version: str
    left: bool


def follower_rows(clients: Mapping[str, Mapping[str, ClientRecord]]) -> list[FollowerRow]:
    """Every ``/clients`` entry, by service then client: the version of its credential each
    confirmed (what a rotation waits for)."""
    return [
        FollowerRow(
            service=service,
            client=client,
            app=record.app or "-",
            host=record.host or "-",
            pid="-" if record.pid is None else str(record.pid),
            auth_client=record.auth_client or "-",
            auth_version="-" if record.auth_version is None else f"v{record.auth_version}",
            left=record.left is not None,
        )
        for service, by_client in sorted(clients.items())
        for client, record in sorted(by_client.items())
    ]


@dataclass(frozen=True)
class HostView:
    """A host and the processes on it that follow services (an agent's among them)."""

    host: str
    processes: tuple[tuple[str, str, tuple[str, ...]], ...]  # (pid, client, services)


def hosts_view(clients: Mapping[str, Mapping[str, ClientRecord]]) -> list[HostView]:
    """The processes under ``/clients``, grouped by host, each with the services it follows
    (entries an agent marked as left are not processes)."""
    by_host: dict[str, dict[tuple[str, str], list[str]]] = {}
    for service, by_client in clients.items():
        for client, record in by_client.items():
            if record.left is not None:
                continue
            pid = "-" if record.pid is None else str(record.pid)
            process = by_host.setdefault(record.host or "-", {}).setdefault((pid, client), [])
            process.append(service)
    return [
        HostView(host, tuple((pid, c, tuple(sorted(s))) for (pid, c), s in sorted(procs.items())))
        for host, procs in sorted(by_host.items())
    ]


# --- shard maps, regions, doctor ------------------------------------------------------------


@dataclass(frozen=True)
class ShardMapView:
    """One shard policy: keys per partition, the partitions a service lacks, its digest."""

    policy: str
    kind: str
    keys: tuple[tuple[str, int], ...]
    gaps: tuple[tuple[str, tuple[str, ...]], ...]
    digest: str


@dataclass(frozen=True)
class RegionRow:
    """One region of the dashboard's client: its session and how stale it is."""

    region: str
    local: bool
    state: str
    rtt: str
    staleness: str


def regions_view(
    local: str | None,
    local_state: str,
    local_staleness: float,
    names: Sequence[str],
    states: Mapping[str, tuple[float, float]],
) -> list[RegionRow]:
    """The local region, then each other configured one (``states``: the router's
    ``(round trip, staleness)`` of the ones opened so far)."""
    rows = [
        RegionRow(local or "(this ensemble)", True, local_state, "-", f"{local_staleness:.1f}s")
    ]
    for name in names:
        if name == local:
            continue
        if name not in states:
            rows.append(RegionRow(name, False, "unopened", "-", "-"))
            continue
        rtt, staleness = states[name]
        rows.append(
            RegionRow(
                name,
                False,
                "not answering" if rtt == float("inf") else "open",
                "-" if rtt == float("inf") else f"{rtt * 1000:.0f} ms",
                f"{staleness:.1f}s",
            )
        )
    return rows


class Finding(Protocol):
    """What the doctor page needs of a finding (``sentinel doctor``'s ``Finding``)."""

    @property
    def severity(self) -> str: ...

    @property
    def check(self) -> str: ...

    @property
    def detail(self) -> str: ...

    @property
    def fix(self) -> str: ...

    @property
    def region(self) -> str | None: ...


@dataclass(frozen=True)
class FindingsView:
    """``sentinel doctor``'s findings and their counts."""

    findings: tuple[Finding, ...]
    problems: int
    warnings: int
    regions: bool


def findings_view(findings: Sequence[Finding], regions: bool) -> FindingsView:
    """The doctor page: the findings as the command prints them."""
    return FindingsView(
        tuple(findings),
        sum(f.severity == "error" for f in findings),
        sum(f.severity == "warn" for f in findings),
        regions,
    )


#: A shard policy as read for its page: ``(spec, keys per partition, partitions each service
#: using it has no live instance in, what its digest says is wrong)``, or why it is unreadable.
ShardMapRead = (
    tuple[ShardPolicySpec, Mapping[str, int], Mapping[str, Sequence[str]], str | None] | str
)


def shard_map_view(policy: str, found: ShardMapRead) -> ShardMapView:
    """One policy as :meth:`RegistrySource.shard_maps` read it."""
    if isinstance(found, str):
        return ShardMapView(policy, "unreadable", (), (), found)
    spec, counts, gaps, problem = found
    return ShardMapView(
        policy,
        spec.kind,
        tuple(counts.items()),
        tuple((service, tuple(missing)) for service, missing in gaps.items() if missing),
        problem
        or (
            "agrees with its buckets" if spec.kind == "directory" else "none (its spec is its map)"
        ),
    )
