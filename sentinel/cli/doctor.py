"""``sentinel doctor``: what is wrong with this namespace, and the command that fixes it."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, replace

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from sentinel.auth import acl
from sentinel.auth.entries import enrolled_owners
from sentinel.auth.grants import DAEMON_SERVICE_PREFIXES
from sentinel.cache import reads as cache_reads
from sentinel.cli.common import (
    connect,
    print_json,
)
from sentinel.cli.curator import CuratorService, curator_services, instances_of
from sentinel.cli.doctor_acls import SECURE_FIX, acls
from sentinel.cli.fanout import pointed_at, targets
from sentinel.cli.findings import Finding, print_findings
from sentinel.cli.options import (
    EXIT_NOT_FOUND,
    EXIT_OK,
)
from sentinel.cli.output import protection_note
from sentinel.cli.protection import ignored_note, protection_claims
from sentinel.devserver import resolve_hosts
from sentinel.eligibility import failing_checks, nothing_up
from sentinel.errors import (
    DecodeError,
    NamespaceNotFound,
    SentinelError,
    ShardMapInvalid,
    ZooKeeperUnavailable,
)
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.layout import (
    AUTH,
    AUTH_KEYS,
    CLIENTS,
    METRICS,
    SECTIONS,
    SERVICES,
    SHARD_INFO,
)
from sentinel.registry.reads import (
    all_children,
    list_services,
    read_metrics,
    read_service,
)
from sentinel.registry.records import InstanceRecord, ServiceSpec
from sentinel.shards.digest import MapDigest
from sentinel.shards.spec import ShardPolicySpec, policy_path
from sentinel.shards.store import MapState, existing_policies, iter_assignments, read_map_state
from sentinel.suggestions import did_you_mean, likely_typos
from sentinel.testing.zookeeper import four_letter_word
from sentinel.zk.errors import translate


def _server(hosts: str) -> Finding:
    host, _, port = hosts.split(",")[0].rpartition(":")
    try:
        answer = four_letter_word(host or "127.0.0.1", int(port or 2181), "srvr", timeout=2)
    except (OSError, ValueError):
        return Finding(
            "warn",
            "zookeeper",
            f"connected, but `srvr` on {host}:{port} failed",
            "allow it: 4lw.commands.whitelist=srvr,ruok in zoo.cfg",
        )
    version = next(
        (
            line.split(":", 1)[1].strip()
            for line in answer.splitlines()
            if line.startswith("Zookeeper version")
        ),
        "unknown version",
    )
    mode = next(
        (line.split(":", 1)[1].strip() for line in answer.splitlines() if line.startswith("Mode")),
        "unknown mode",
    )
    return Finding("ok", "zookeeper", f"{hosts}: {version.split(',')[0]}, {mode}")


def _sections(zk: KazooClient, namespace: str) -> list[Finding]:
    missing = [s for s in SECTIONS if zk.exists(s) is None]
    if missing:
        return [
            Finding(
                "error",
                "namespace",
                f"{namespace} lacks {', '.join(missing)}",
                f"sentinel init --namespace {namespace}",
            )
        ]
    return [Finding("ok", "namespace", f"{namespace} has all five sections")]


# Anyone may add entries under /clients/<service> (init --secure grants CREATE to all), so
# those are the one place a writer can make a namespace as big as it likes: above this many
# entries in one service, a random sample of them is checked (said in a finding). Every other
# node is checked: only the admin and the roles can write there.


def _services(
    args: argparse.Namespace,
    zk: KazooClient,
    namespace: str,
    stale_after: float,
    region: str | None = None,
) -> list[Finding]:
    with ExitStack() as stack:
        return _service_findings(
            args, zk, namespace, stale_after, _OtherRegions(args, region, stack)
        )


def _service_findings(
    args: argparse.Namespace,
    zk: KazooClient,
    namespace: str,
    stale_after: float,
    elsewhere: _OtherRegions,
) -> list[Finding]:
    findings: list[Finding] = []
    now = time.time()
    bad = 0
    owners = enrolled_owners(zk)  # read once: whose /clients entries are whose
    for service in list_services(zk):
        findings.extend(_flooded(zk, service, namespace))
        try:
            listing = read_service(zk, service)
        except DecodeError as exc:
            findings.append(
                Finding(
                    "error",
                    "schema",
                    str(exc),
                    f"zkCli.sh delete {namespace}/services/{service} "
                    "(or rewrite it with the current schema)",
                )
            )
            continue
        findings.extend(_persistent_instances(zk, listing.persistent_nodes))
        found = instances_of(args, listing)  # a Curator registry's, when the spec says so
        bad += found.skipped
        metrics, skipped = read_metrics(zk, service)
        bad += skipped
        names = found.names
        if found.source != "namespace" and listing.instances:
            findings.append(
                Finding(
                    "warn",
                    "ignored instances",
                    f"{SERVICES}/{service} holds {len(listing.instances)} instance node(s) "
                    f"that no client serves: its instances are {found.source}'s",
                    f"delete them (zkCli.sh deleteall under {namespace}{SERVICES}/{service}), "
                    "and find who wrote them",
                )
            )
        for name, record in metrics.items():
            if name not in names:
                findings.append(
                    Finding(
                        "warn",
                        "orphaned metrics",
                        f"{METRICS}/{service}/{name} has no instance",
                        f"sentinel prune --namespace {namespace}",
                    )
                )
            elif now - record.measured_at > stale_after:
                findings.append(
                    Finding(
                        "warn",
                        "stale metrics",
                        f"{service} {name}: measured {now - record.measured_at:.0f}s ago",
                        f"check the metric collector publishing {service}",
                    )
                )
        followers = len(all_children(zk, f"{CLIENTS}/{service}"))
        findings.extend(
            _partitions(zk, listing.spec, found.instances, namespace, followers, elsewhere)
        )
        claims = protection_claims(zk, listing.spec, owners)
        if claims.clients:
            findings.append(
                Finding(
                    "warn",
                    "protection",
                    protection_note(service, claims.clients, now),
                    "find why those sessions expired together (the ensemble's log, a pause, "
                    "the network); the instances come back as their processes register again",
                )
            )
        if claims.ignored:
            findings.append(
                Finding(
                    "warn",
                    "clients",
                    ignored_note(service, claims.ignored),
                    f"sentinel init --secure --namespace {namespace} removes persistent "
                    f"entries; `sentinel auth status {service}` lists the processes that count",
                )
            )
    if bad:
        findings.append(
            Finding(
                "error",
                "schema",
                f"{bad} instance or metrics node(s) cannot be decoded (clients skip them)",
                f"sentinel ls SERVICE -v shows which; zkCli.sh delete them under {namespace}",
            )
        )
    return findings


def _persistent_instances(zk: KazooClient, paths: tuple[str, ...]) -> list[Finding]:
    """Instance nodes that are persistent: a publisher's are ephemeral, so these were planted.
    A secured namespace does not serve them (an error to remove); an open one serves them."""
    if not paths:
        return []
    secured = acl.is_secured(zk)
    return [
        Finding(
            "error",
            "planted instance",
            f"{path}: a persistent instance node (a publisher's is ephemeral), "
            + ("not served in a secured namespace" if secured else "served by every client"),
            f"zkCli.sh deleteall {path}; {SECURE_FIX} removes one no role wrote, and names "
            "one only a ZooKeeper superuser can delete",
        )
        for path in paths
    ]


def _flooded(zk: KazooClient, service: str, namespace: str) -> list[Finding]:
    """Sections of ``service`` with more nodes than a client reads (it skips the rest)."""
    findings = []
    for parent in (f"{SERVICES}/{service}", f"{METRICS}/{service}"):
        stat = zk.exists(parent)
        if stat is not None and stat.numChildren > cache_reads.MAX_SECTION_NODES:
            findings.append(
                Finding(
                    "error",
                    "flooded section",
                    f"{parent} holds {stat.numChildren} nodes; clients read "
                    f"{cache_reads.MAX_SECTION_NODES} at most (the instances' own metrics first) "
                    "and skip the rest",
                    f"find the writer (zkCli.sh getAcl {namespace}{parent}), stop it, and "
                    f"delete its nodes; sentinel prune --namespace {namespace} removes "
                    "metrics that have no instance",
                )
            )
    return findings


def _partitions(
    zk: KazooClient,
    spec: ServiceSpec,
    instances: tuple[InstanceRecord | Endpoint, ...],
    namespace: str,
    followers: int,
    elsewhere: _OtherRegions,
) -> list[Finding]:
    """The service, or each partition of it in use, that has no instance up: why (its
    instances' statuses and checks, :mod:`sentinel.eligibility`), and whether another region
    serves it under its failover rule."""
    live = {i.partition for i in instances if i.status == "up"}
    if spec.shard_policy is None:
        return [] if live else [_unserved(spec, None, instances, followers, elsewhere)]
    try:
        data, _ = zk.get(policy_path(spec.shard_policy))
        policy = ShardPolicySpec.from_bytes(spec.shard_policy, policy_path(spec.shard_policy), data)
    except NoNodeError:
        meant = likely_typos(spec.shard_policy, existing_policies(zk))
        missing = f"{spec.service} is sharded by {spec.shard_policy!r}, which does not exist"
        if meant:  # the spec's name is the typo: creating a policy of that name keeps it
            return [Finding("error", "shard policy", f"{missing}; {did_you_mean(meant)}")]
        fix = f"create it (Sentinel.shard_maps.create) in {namespace}"
        return [Finding("error", "shard policy", missing, fix)]
    except DecodeError as exc:
        return [Finding("error", "schema", str(exc), f"recreate shard policy {spec.shard_policy}")]
    declared = policy.declared
    if declared is not None:
        used = set(declared)
    else:  # any partition may be used: the ones the keys map to
        try:
            used = {p for _, p in iter_assignments(zk, spec.shard_policy)}
        except DecodeError:
            return []  # a map that lies tells no partitions: the shard map check reports it
    return [
        _unserved(spec, p, tuple(i for i in instances if i.partition == p), followers, elsewhere)
        for p in sorted(used - live)
    ]


def _unserved(
    spec: ServiceSpec,
    partition: str | None,
    instances: tuple[InstanceRecord | Endpoint, ...],
    followers: int,
    elsewhere: _OtherRegions,
) -> Finding:
    """A service (``partition`` None) or a partition with no instance up: served from another
    region by its failover rule (not an error; a warning when instances here are down), empty
    and followed by nobody (retirable), or broken (an error, with the fix that fits)."""
    service = spec.service
    what = (
        service
        if partition is None
        else (f"{service} partition {partition} (shard policy {spec.shard_policy})")
    )
    state = nothing_up(instances)
    serving = elsewhere.serving(spec, partition)
    if serving is not None:
        return Finding(
            "warn" if instances else "ok",
            "no live instance",
            f"{what} {state} in {elsewhere.here}: served from {serving}",
            _fix(service, partition, instances) if instances else "",
        )
    # A daemon's service waits for its daemon (init --secure creates the default ones).
    daemon = service.startswith(tuple(DAEMON_SERVICE_PREFIXES.values()))
    rule = spec.failover
    fails_over = rule is not None and not rule.local_only
    if not instances and not followers and partition is None and not daemon and not fails_over:
        return Finding(
            "warn",
            "empty service",
            f"{service} has no instance and no client follows it",
            f"sentinel service retire {service} (when nothing will register it again), or "
            f"start an instance that registers {service}",
        )
    followed = f"; {followers} client(s) follow it" if followers and not instances else ""
    if rule is not None and not rule.local_only:
        followed += (
            f"; its failover rule ({rule.describe()}) finds no other region serving it"
            if elsewhere.here is not None
            else f"; it fails over ({rule.describe()}): --regions checks the other regions"
        )
    return Finding(
        "warn" if daemon else "error",
        "no live instance",
        f"{what} {state}{followed}",
        _fix(service, partition, instances),
    )


def _fix(
    service: str, partition: str | None, instances: tuple[InstanceRecord | Endpoint, ...]
) -> str:
    """What brings a service (or a partition) with nothing up back: its failing readiness
    checks fixed, its drained instances undrained, or an instance started."""
    where = "" if partition is None else f" in partition {partition}"
    start = f"start an instance that registers {service}{where}"
    checks = failing_checks(instances)
    if checks:
        return (
            f"make {', '.join(checks)} pass on them (`sentinel ls {service}` shows each "
            f"instance's last result), or {start}"
        )
    if instances and all(i.status == "draining" for i in instances):
        return f"sentinel undrain {service} PARTITION:LABEL (they are drained), or {start}"
    return start + ("" if partition is None else ", or move its keys to a live partition")


class _OtherRegions:
    """The regions a failover rule may send the lookups of the region doctor checks to
    (``here``), read when a service there has nothing up: each region's ensemble connected to
    once, on first need, each service read once."""

    def __init__(self, args: argparse.Namespace, here: str | None, stack: ExitStack) -> None:
        self.here = here
        self._args = args
        self._regions = getattr(args, "regions_config", None)
        self._stack = stack
        self._zk: dict[str, KazooClient | None] = {}
        self._up: dict[tuple[str, str], set[str] | None] = {}

    def serving(self, spec: ServiceSpec, partition: str | None) -> str | None:
        """``west (failover rule west,north)``: the first region the service's rule sends
        lookups to that has an instance up (in ``partition``), or None."""
        rule, regions = spec.failover, self._regions
        if rule is None or rule.local_only or regions is None or self.here is None:
            return None
        # Which of the others is nearest is the client's measure: any of them may be.
        nearest = [n for n in regions.regions if n not in rule.regions] if rule.nearest else []
        for name in (*nearest, *rule.regions):
            if name == self.here or name not in regions.regions:
                continue
            up = self._partitions_up(name, rule.service or spec.service)
            if up and (partition is None or partition in up):
                return f"{name} (failover rule {rule.describe()})"
        return None

    def _partitions_up(self, region: str, service: str) -> set[str] | None:
        """The partitions of ``service`` with an instance up in ``region`` (None: the region
        cannot be read, or has no such service)."""
        if (region, service) not in self._up:
            zk = self._connected(region)
            try:
                listing = None if zk is None else read_service(zk, service)
            except (SentinelError, KazooException, KazooTimeoutError):
                listing = None
            self._up[region, service] = (
                None
                if listing is None
                else {
                    i.partition
                    for i in instances_of(self._args, listing).instances
                    if i.status == "up"
                }
            )
        return self._up[region, service]

    def _connected(self, region: str) -> KazooClient | None:
        if region not in self._zk:
            assert self._regions is not None  # serving() asks only with regions
            entry = self._regions.regions[region]
            args = pointed_at(self._args, entry, self._regions.identity_of(entry))
            try:
                self._zk[region] = self._stack.enter_context(connect(args))
            except (SentinelError, KazooException, KazooTimeoutError):
                self._zk[region] = None  # unreachable: it serves nothing doctor can see
        return self._zk[region]


def _orphaned_auth(zk: KazooClient, namespace: str) -> list[Finding]:
    # A credential is its auth client's, whose processes' entries are named by their client
    # ids: the census `sentinel auth status` and rotations take says who is live.
    from sentinel.auth.entries import ClientEntries, enrolled_owners

    findings = []
    owners = enrolled_owners(zk)
    for service in sorted(set(zk.get_children(AUTH)) - {AUTH_KEYS.rsplit("/", 1)[1]}):
        users = ClientEntries(zk, service, owners=owners).read().processes
        for client in zk.get_children(f"{AUTH}/{service}"):
            if client not in users:
                findings.append(
                    Finding(
                        "warn",
                        "orphaned auth",
                        f"{AUTH}/{service}/{client}: no such client is connected",
                        f"zkCli.sh deleteall {namespace}{AUTH}/{service}/{client} "
                        "(if that client is retired)",
                    )
                )
    return findings


def _curator(args: argparse.Namespace) -> list[Finding]:
    """``--curator-path``: each base path, and every node under it that Curator itself could
    not read (an error) or that Sentinel skips though Curator reads it (a warning)."""
    findings = []
    for found in curator_services(args):
        if isinstance(found, str):
            findings.append(
                Finding("error", "curator", f"{found} does not exist", "check --curator-path")
            )
            continue
        for skipped in found.skipped:
            copied = "is not the node's name" in skipped.reason
            findings.append(
                Finding(
                    "warn" if copied else "error",
                    "curator",
                    f"{skipped.path}: {skipped.reason}"
                    + (" (Curator serves it; Sentinel does not)" if copied else ""),
                    f"delete {skipped.path}, or have its publisher register again",
                )
            )
        findings += _curator_trust(found)
        if not (found.skipped or found.persistent_nodes or found.world_writable):
            findings.append(
                Finding(
                    "ok",
                    "curator",
                    f"{found.base_path}/{found.service}: {len(found.endpoints)} instance(s)",
                )
            )
    return findings


def _curator_trust(found: CuratorService) -> list[Finding]:
    """Who may write a Curator service: a base path or service node anyone may write lets
    anyone add instances there (a flood, or a planted endpoint); a persistent instance is
    Curator's ``STATIC``/``PERMANENT`` or planted (a secured namespace serves it only where a
    spec opts in)."""
    findings = [
        Finding(
            "warn",
            "curator",
            f"{path}: anyone may write it, so anyone may add instances of "
            f"{found.service} (clients serve an ephemeral one like any other)",
            "give it an ACL that only its publishers may write (Curator's ACLProvider, or "
            "zkCli.sh setAcl); see docs/interop.md, 'Who can write a base path'",
        )
        for path in found.world_writable
    ]
    findings += [
        Finding(
            "warn",
            "curator",
            f"{path}: a persistent instance node (Curator writes only STATIC and PERMANENT "
            "ones so): a secured namespace serves it only where a spec opts in",
            f"if it is not yours, delete it (zkCli.sh deleteall {path}); if it is, "
            "CuratorSource(..., static_instances=True) in its service's spec",
        )
        for path in found.persistent_nodes
    ]
    return findings


def _doctor(args: argparse.Namespace) -> int:
    findings, regions = diagnose(args)
    if args.json:
        print_json([asdict(f) for f in findings])
    else:
        print_findings(findings, sys.stdout, regions=regions)
    return EXIT_NOT_FOUND if any(f.severity == "error" for f in findings) else EXIT_OK


def diagnose(args: argparse.Namespace) -> tuple[list[Finding], bool]:
    """Every finding of ``sentinel doctor`` with ``args`` (its options), and whether they
    span several regions (each then names its own): the command's and the dashboard's."""
    chosen = targets(args)
    findings: list[Finding] = []
    states: dict[str, dict[str, MapState | None]] = {}
    for target in chosen:
        try:
            found, maps = _check(target.args, target.region)
        except (SentinelError, KazooException, KazooTimeoutError) as exc:
            if len(chosen) == 1:
                raise  # one ensemble: its exit code, as ever (3 when unreachable)
            error = translate(exc, "sentinel doctor")  # one region's failure: a finding
            unreachable = isinstance(error, ZooKeeperUnavailable)
            found = [
                Finding(
                    "error",
                    "zookeeper" if unreachable else "region",
                    str(error),
                    _UNREACHABLE_FIX if unreachable else "",
                )
            ]
            maps = None
        findings += [replace(f, region=target.region) for f in found]
        if maps is not None:
            states[str(target.region)] = maps
    if len(chosen) > 1:
        findings += _agreement(states, [str(t.region) for t in chosen])
    findings += _curator(args)
    return findings, len(chosen) > 1


_UNREACHABLE_FIX = "start its ensemble or check --regions; the other regions were checked"


def _check(
    args: argparse.Namespace, region: str | None
) -> tuple[list[Finding], dict[str, MapState | None] | None]:
    """Every check of one ensemble's namespace, and what it holds of each shard policy (None
    for a policy it cannot read)."""
    hosts = resolve_hosts(args.zk)
    identities = acl.load_identities(args.identities) if args.identities else None
    findings: list[Finding] = []
    maps: dict[str, MapState | None] | None = None
    try:
        with connect(args) as zk:
            if identities is not None:
                acl.act_as_every_role(zk, identities)
            findings.append(_server(hosts))
            findings += _sections(zk, args.namespace)
            findings += acls(zk, args.namespace, identities)
            if all(zk.exists(section) for section in SECTIONS):
                findings += _services(args, zk, args.namespace, args.stale_after, region)
                findings += _orphaned_auth(zk, args.namespace)
            maps = {}  # a namespace without /shard_info holds no policy
            if zk.exists(SHARD_INFO):
                found, maps = _shard_maps(zk, region)
                findings += found
    except NamespaceNotFound as exc:
        findings += [
            _server(hosts),
            Finding("error", "namespace", str(exc), _missing_namespace_fix(exc)),
        ]
        maps = {}  # nor does a namespace that does not exist
    return findings, maps


def _missing_namespace_fix(exc: NamespaceNotFound) -> str:
    """The namespace meant when the one asked for looks like its typo, never creating that."""
    if exc.suggestions:
        return f"sentinel doctor --namespace {exc.suggestions[0]}"
    return f"sentinel init --namespace {exc.namespace}"


def _repair(policy: str, region: str | None) -> str:
    """How to repair a region's replica of ``policy`` (without regions: from a backup)."""
    if region is None:
        return f"restore /shard_info/{policy} from a good copy (sentinel import of a backup)"
    return f"sentinel shard sync --policy {policy} --from GOOD --region {region}"


def _shard_maps(
    zk: KazooClient, region: str | None
) -> tuple[list[Finding], dict[str, MapState | None]]:
    """Each shard policy read whole: one that cannot be read, or whose buckets do not add up
    to the digest its writers keep (written behind their back), is an error."""
    findings: list[Finding] = []
    states: dict[str, MapState | None] = {}
    for policy in sorted(zk.get_children(SHARD_INFO)):
        try:
            state = read_map_state(zk, policy)
        except ShardMapInvalid as exc:  # decodes, but contradicts its policy: a lie
            states[policy] = None
            findings.append(
                Finding(
                    "error",
                    "shard map",
                    f"{policy}: {exc.path}: {exc.reason}; clients skip that bucket, and "
                    "`sentinel shard sync` will not copy this map",
                    "find who wrote /shard_info/" + policy + "; " + _repair(policy, region),
                )
            )
            continue
        except SentinelError as exc:  # a registry that lies: reported, never trusted
            states[policy] = None
            findings.append(
                Finding(
                    "error",
                    "shard map",
                    f"{policy}: unreadable ({exc}); clients skip what does not decode",
                    _repair(policy, region),
                )
            )
            continue
        states[policy] = state
        problem = state.digest_problem
        if problem is not None:
            findings.append(
                Finding(
                    "error",
                    "shard map",
                    f"{policy}: {problem}",
                    "find who wrote /shard_info/" + policy + "; " + _repair(policy, region),
                )
            )
        elif state.content is not None and state.stored is None:
            findings.append(
                Finding(
                    "warn",
                    "shard map",
                    f"{policy}: no digest (created by a version before digests): a change "
                    "written behind the shard manager's back would go unseen",
                )
            )
    if states and not findings:
        findings.append(
            Finding(
                "ok",
                "shard map",
                f"{len(states)} polic{'y' if len(states) == 1 else 'ies'}, each as its writers "
                "left it",
            )
        )
    return findings, states


def _agreement(states: dict[str, dict[str, MapState | None]], regions: list[str]) -> list[Finding]:
    """The shard maps across regions: every region holds every policy, and the same map
    (spec and keys); the regions that differ are named with when each was last written."""
    findings = []
    checked = [r for r in regions if r in states]
    for policy in sorted({p for held in states.values() for p in held}):
        missing = [r for r in checked if policy not in states[r]]
        groups: dict[tuple[ShardPolicySpec, MapDigest | None], list[str]] = {}
        for region in checked:
            state = states[region].get(policy)
            if state is not None:
                groups.setdefault((state.spec, state.content), []).append(region)
        if missing:
            findings.append(
                Finding(
                    "error",
                    "shard maps agree",
                    f"{policy} is missing in {', '.join(missing)}",
                    _repair(policy, "REGION") + " (creates it as in GOOD)",
                )
            )
        if len(groups) > 1:
            parts = []
            for (_, content), members in groups.items():
                state = states[members[0]][policy]
                written = (
                    f"digest written {time.time() - state.stored_at:.0f}s ago"
                    if state is not None and state.stored_at is not None
                    else "no digest"
                )
                keys = f"{content.keys} key(s)" if content is not None else "its spec"
                parts.append(f"{', '.join(members)}: {keys}, {written}")
            findings.append(
                Finding(
                    "error",
                    "shard maps agree",
                    f"{policy} differs across regions ({'; '.join(parts)}): a region that "
                    "missed changes (unreachable when they were written) lags",
                    "run the changes it missed again (they are idempotent), or "
                    + _repair(policy, "LAGGING"),
                )
            )
        elif groups and not missing and sum(map(len, groups.values())) == len(regions):
            findings.append(
                Finding("ok", "shard maps agree", f"{policy}: the same in all {len(regions)}")
            )
    return findings
