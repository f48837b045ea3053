"""``sentinel ls`` (what is registered) and ``sentinel resolve`` (what a client would get)."""

from __future__ import annotations

import argparse
import collections
import json
import time
from typing import TYPE_CHECKING, Any

from sentinel.auth.entries import enrolled_owners
from sentinel.cli.common import (
    client,
    connect,
    print_json,
    print_table,
)
from sentinel.cli.curator import base_paths, curator_services, instances_of
from sentinel.cli.options import (
    EXIT_NOT_FOUND,
    EXIT_OK,
)
from sentinel.cli.output import protection_note
from sentinel.cli.protection import ignored_note, protection_claims
from sentinel.eligibility import status_verdict
from sentinel.errors import NoInstanceAvailable, SentinelError, ServiceNotFound, ValidationError
from sentinel.health.sources import health_of
from sentinel.plugins import load_balancer, load_policy
from sentinel.registry.endpoint import RECORD_FIELDS, Endpoint
from sentinel.registry.failover import Failover
from sentinel.registry.reads import list_services, read_metrics, read_service
from sentinel.registry.records import CHECK_PASSING, InstanceRecord, MetricsRecord
from sentinel.tables import age, metrics_text

if TYPE_CHECKING:
    from sentinel.client import Explanation


def _instance_document(
    record: InstanceRecord | Endpoint, metrics: MetricsRecord | None
) -> dict[str, Any]:
    shown = {name: getattr(record, name) for name in RECORD_FIELDS if name != "service"}
    values = metrics.values if metrics else {}
    source, state = health_of(record.health, record.status, values)
    return {
        **shown,
        "health": {"source": source, "state": state},
        "verdict": "up" if record.status == "up" else status_verdict(record),
        "properties": dict(record.properties),
        "metrics": dict(values),
        "metrics_measured_at": metrics.measured_at if metrics else None,
    }


def _health_cell(document: dict[str, Any]) -> str:
    """``check:http down (GET http://10.0.0.5:8080/ready: status 503)``: the source, the
    state, and the result a failing check published with it."""
    health, result = document["health"], document["check_result"]
    failing = result is not None and result != CHECK_PASSING and health["state"] != "up"
    return f"{health['source']} {health['state']}" + (f" ({result})" if failing else "")


def _ls(args: argparse.Namespace) -> int:
    with connect(args) as zk:
        if args.service is None:
            return _ls_services(args, zk)
        try:
            listing = read_service(zk, args.service)
        except ServiceNotFound:
            if not base_paths(args):
                raise
            listing = None
        if listing is not None:
            metrics, _ = read_metrics(zk, args.service)
            claims = protection_claims(zk, listing.spec, enrolled_owners(zk))
    if listing is None:
        return _ls_curator_service(args)
    source, instances, skipped = instances_of(args, listing)
    now = time.time()
    documents = [_instance_document(i, metrics.get(f"{i.partition}:{i.label}")) for i in instances]
    if args.json:
        print_json(
            {
                "service": args.service,
                "scheme": listing.spec.scheme,
                "shard_policy": listing.spec.shard_policy,
                "source": source,
                "instances": documents,
                "skipped": skipped,
                "protecting_clients": claims.clients,
                "ignored_clients": claims.ignored,
            }
        )
        return EXIT_OK
    if source != "namespace":
        print(f"{args.service} (instances from {source})")
    print_table(
        [
            (
                d["partition"],
                d["label"],
                f"{d['host']}:{d['port']}",
                d["zone"],
                d["weight"],
                d["status"],
                _health_cell(d),
                age(now - d["registered_at"]),
                metrics_text(d["metrics"]) or "-",
                age(None if d["metrics_measured_at"] is None else now - d["metrics_measured_at"]),
            )
            for d in documents
        ],
        (
            "PARTITION",
            "LABEL",
            "ADDRESS",
            "ZONE",
            "WEIGHT",
            "STATUS",
            "HEALTH",
            "AGE",
            "METRICS",
            "METRICS AGE",
        ),
    )
    if skipped:
        print(f"({skipped} undecodable instance node(s) skipped; see `sentinel doctor`)")
    if claims.clients:
        print(protection_note(args.service, claims.clients, now))
    if claims.ignored:
        print(f"({ignored_note(args.service, claims.ignored)})")
    return EXIT_OK


def _ls_services(args: argparse.Namespace, zk: Any) -> int:
    rows, documents, registries = [], [], []
    for service in list_services(zk):
        try:
            listing = read_service(zk, service)
        except SentinelError as exc:  # one unreadable service must not hide the others
            documents.append({"service": service, "error": str(exc)})
            rows.append((service, "-", "-", "-", "-", f"unreadable: {exc}", "-"))
            continue
        source, instances, _ = instances_of(args, listing)
        if source != "namespace":
            registries.append(f"{service}: instances from {source}")
        per_partition = collections.Counter(i.partition for i in instances)
        up = sum(i.status == "up" for i in instances)
        documents.append(
            {
                "service": service,
                "scheme": listing.spec.scheme,
                "shard_policy": listing.spec.shard_policy,
                "failover": _failover(listing.spec.failover),
                "source": source,
                "instances": len(instances),
                "up": up,
                "partitions": dict(sorted(per_partition.items())),
            }
        )
        rows.append(
            (
                service,
                listing.spec.scheme,
                listing.spec.shard_policy,
                len(instances),
                up,
                " ".join(f"{p}:{n}" for p, n in sorted(per_partition.items())) or "-",
                _failover(listing.spec.failover) or "-",
            )
        )
    curator_rows = []
    for found in curator_services(args):
        if isinstance(found, str):
            raise ServiceNotFound(found, "is not a Curator base path here (no such node)")
        up = sum(e.status == "up" for e in found.endpoints)
        documents.append(
            {
                "service": found.service,
                "source": found.source,
                "instances": len(found.endpoints),
                "up": up,
                "skipped": len(found.skipped),
            }
        )
        curator_rows.append(
            (found.service, found.source, len(found.endpoints), up, len(found.skipped))
        )
    if args.json:
        print_json(documents)
        return EXIT_OK
    print_table(
        rows, ("SERVICE", "SCHEME", "SHARD POLICY", "INSTANCES", "UP", "PARTITIONS", "FAILOVER")
    )
    for note in registries:
        print(f"({note})")
    if curator_rows:
        print()
        print_table(curator_rows, ("SERVICE", "SOURCE", "INSTANCES", "UP", "SKIPPED"))
    return EXIT_OK


def _failover(rule: Failover | None) -> str | None:
    """A service's failover rule as ``ls`` shows it (None: this region's instances only)."""
    return None if rule is None or rule.local_only else rule.describe()


def _ls_curator_service(args: argparse.Namespace) -> int:
    """``ls SERVICE`` of a service the namespace does not hold: the first base path's."""
    for found in curator_services(args, only=args.service):
        if isinstance(found, str) or not (found.endpoints or found.skipped):
            continue
        documents = [e.to_dict() for e in found.endpoints]
        if args.json:
            print_json(
                {
                    "service": args.service,
                    "source": found.source,
                    "instances": documents,
                    "skipped": len(found.skipped),
                }
            )
            return EXIT_OK
        now = time.time()
        print(f"{args.service} ({found.source})")
        print_table(
            [
                (e.label, f"{e.host}:{e.port}", e.uri, e.status, age(now - e.registered_at))
                for e in found.endpoints
            ],
            ("LABEL", "ADDRESS", "URI", "STATUS", "AGE"),
        )
        if found.skipped:
            print(f"({len(found.skipped)} undecodable node(s) skipped; see `sentinel doctor`)")
        return EXIT_OK
    raise ServiceNotFound(
        args.service, f"is not registered in the namespace nor under {', '.join(base_paths(args))}"
    )


def parse_plugin(spec: str) -> tuple[str, dict[str, Any]]:
    """``min_lag:cutoff=5,max_age=30`` → ``("min_lag", {"cutoff": 5, "max_age": 30})``.

    Values are read as JSON when they parse (numbers, true/false, null), else as strings.
    """
    name, _, raw = spec.partition(":")
    arguments: dict[str, Any] = {}
    for item in filter(None, raw.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValidationError(f"{spec!r}: arguments must look like name=value, got {item!r}")
        try:
            arguments[key] = json.loads(value)
        except ValueError:
            arguments[key] = value
    return name, arguments


def _considered(explanation: Explanation) -> dict[str, list[dict[str, Any]]]:
    """``resolve --json``'s ``instances`` (each with its verdict) and ``steps`` of one
    region's explanation."""
    verdicts = explanation.verdicts
    return {
        "instances": [
            {**e.to_dict(), "verdict": verdicts.get(e.name, "eligible")}
            for e in explanation.instances
        ],
        "steps": [
            {"filter": s.name, "verdict": s.verdict, "excluded": [e.name for e in s.excluded]}
            for s in explanation.steps
        ],
    }


def _print_instances(explanation: Explanation) -> None:
    """``resolve``'s table of one region's instances and their verdicts."""
    verdicts = explanation.verdicts
    print_table(
        [
            (
                e.partition,
                e.label,
                e.uri,
                e.status,
                e.zone,
                metrics_text(e.metrics) or "-",
                verdicts.get(e.name, "eligible"),
            )
            for e in explanation.instances
        ],
        ("PARTITION", "LABEL", "URI", "STATUS", "ZONE", "METRICS", "VERDICT"),
    )


def _resolve(args: argparse.Namespace) -> int:
    policies = [
        load_policy(name, **arguments) for name, arguments in map(parse_plugin, args.policy)
    ]
    policy = None
    for step in policies:
        policy = step if policy is None else policy & step
    balancer = None
    if args.balancer is not None:
        name, arguments = parse_plugin(args.balancer)
        balancer = load_balancer(name, **arguments)
    failover = None if args.failover is None else Failover.parse(args.failover)
    with client(args) as sentinel:
        explanation = sentinel.explain(args.service, args.key, policy, failover)
        picks: list[Endpoint] = []
        error = None
        try:
            picks = [
                sentinel.get_service(args.service, args.key, policy, balancer, failover)
                for _ in range(args.count)
            ]
        except NoInstanceAvailable as exc:
            error = str(exc)
    home = explanation.home
    if args.json:
        print_json(
            {
                "service": args.service,
                "key": args.key,
                "shard_policy": explanation.shard_policy,
                "partition": explanation.partition,
                **_considered(explanation),
                "picks": [e.to_dict() for e in picks],
                "error": error,
                "region": explanation.region,
                "region_reason": explanation.region_reason,
                # another region answered: why the local one could not, instance by instance
                "home": None
                if home is None
                else {
                    "region": home.region,
                    "region_reason": home.region_reason,
                    **_considered(home),
                },
            }
        )
        return EXIT_OK if picks else EXIT_NOT_FOUND
    where = (
        ""
        if explanation.partition is None
        else (
            f" key {args.key!r} -> partition {explanation.partition} "
            f"(shard policy {explanation.shard_policy})"
        )
    )
    print(f"service {args.service}{where}")
    if home is not None:
        print(f"region {home.region}: {home.region_reason}")
        _print_instances(home)
    if explanation.region is not None:
        print(f"region {explanation.region}: {explanation.region_reason}")
    _print_instances(explanation)
    if error:
        print(f"nothing eligible: {error}")
        return EXIT_NOT_FOUND
    counts = collections.Counter(e.label for e in picks)
    print(
        f"picked ({args.count} call{'s' if args.count > 1 else ''}): "
        + ", ".join(f"{label} x{n}" for label, n in counts.most_common())
    )
    return EXIT_OK
