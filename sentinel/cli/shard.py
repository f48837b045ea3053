"""``sentinel shard ...``: the shard manager's supervised changes to ``/shard_info``."""

from __future__ import annotations

import argparse
import collections
import csv
import io
import itertools
import json
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from sentinel.cli.common import (
    Progress,
    connect,
    event_printer,
    interrupted,
    parse_json,
    print_json,
    print_table,
    read_input,
    run_daemon,
)
from sentinel.cli.fanout import Target, each_region, pointed_at, raise_failures, targets
from sentinel.cli.options import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    exit_code,
)
from sentinel.errors import SentinelError, ValidationError
from sentinel.registry.reads import read_service, services_sharded_by
from sentinel.registry.records import InstanceRecord
from sentinel.shards.maps import new_map
from sentinel.shards.spec import (
    ShardPolicySpec,
    bucket_of,
    bucket_path,
    encode_bucket,
    validate_key,
)
from sentinel.shards.store import create_policy, iter_assignments, read_key, read_spec, update_keys


def _users(zk: KazooClient, policy: str) -> dict[str, list[InstanceRecord]]:
    """The services sharded by ``policy``, with their live instances."""
    users = {}
    for service in services_sharded_by(zk, policy):
        try:
            users[service] = list(read_service(zk, service).instances)
        except SentinelError:
            continue  # gone or unreadable since the listing: doctor's to report
    return users


def _partition_of(zk: KazooClient, spec: ShardPolicySpec, key: str) -> str | None:
    if spec.kind == "directory":
        return read_key(zk, spec, key)
    return new_map(spec).lookup(key)


def _instances_in(users: dict[str, list[InstanceRecord]], partition: str | None) -> list[str]:
    return [
        f"{service}:{i.label}@{i.host}:{i.port}"
        for service, instances in users.items()
        for i in instances
        if i.partition == partition and i.status == "up"
    ]


def _create(args: argparse.Namespace) -> int:
    spec = ShardPolicySpec(
        policy=args.policy_name,
        kind=args.kind,
        partitions=tuple(args.partitions.split(",")) if args.partitions else None,
        boundaries=tuple(_boundary(b) for b in args.boundaries.split(","))
        if args.boundaries
        else (),
        key_type=args.key_type,
        buckets=args.buckets,
    )

    def write(args: argparse.Namespace) -> dict[str, Any]:
        if not args.dry_run:
            with connect(args, create=True) as zk:
                create_policy(zk, spec)
        return {
            "policy": spec.policy,
            "kind": spec.kind,
            "partitions": spec.partitions,
            "boundaries": [list(b) for b in spec.boundaries],
            "dry_run": args.dry_run,
        }

    return _replicated(
        args,
        write,
        lambda d: print(
            f"{'would create' if d['dry_run'] else 'created'} {d['kind']} policy {d['policy']}"
        ),
    )


def _boundary(text: str) -> tuple[str, str]:
    bound, sep, partition = text.rpartition(":")
    if not sep or not bound:
        raise ValidationError(f"boundary {text!r} must look like LOWER:PARTITION")
    return bound, partition


def _assign(args: argparse.Namespace) -> int:
    key = validate_key(args.key)

    def write(args: argparse.Namespace) -> dict[str, Any]:
        with connect(args) as zk:
            spec = read_spec(zk, args.policy)
            spec.check_partition(args.partition)
            old = _partition_of(zk, spec, key)
            users = _users(zk, args.policy) if args.command_name == "move" else {}
            if not args.dry_run:
                update_keys(zk, args.policy, {key: args.partition})
        document: dict[str, Any] = {
            "key": key,
            "policy": args.policy,
            "from": old,
            "to": args.partition,
            "dry_run": args.dry_run,
        }
        if args.command_name == "move":
            document["before"] = _instances_in(users, old)
            document["after"] = _instances_in(users, args.partition)
        return document

    def show(document: dict[str, Any]) -> None:
        old = document["from"]
        verb = "would move" if args.dry_run else "moved" if old else "assigned"
        print(f"{verb} {key}: {old or '(unassigned)'} -> {args.partition} (policy {args.policy})")
        if args.command_name == "move":
            print(f"  served before by: {', '.join(document['before']) or 'no live instance'}")
            print(f"  served after by:  {', '.join(document['after']) or 'NO LIVE INSTANCE'}")

    return _replicated(args, write, show)


def _remove(args: argparse.Namespace) -> int:
    key = validate_key(args.key)

    def write(args: argparse.Namespace) -> dict[str, Any]:
        with connect(args) as zk:
            spec = read_spec(zk, args.policy)
            old = _partition_of(zk, spec, key)
            if old is not None and not args.dry_run:
                update_keys(zk, args.policy, {key: None})
        return {"key": key, "policy": args.policy, "removed_from": old, "dry_run": args.dry_run}

    return _replicated(
        args,
        write,
        lambda d: print(
            f"{key} was not assigned"
            if d["removed_from"] is None
            else f"{'would remove' if args.dry_run else 'removed'} {key} (was {d['removed_from']})"
        ),
        lambda d: EXIT_OK if d["removed_from"] is not None else EXIT_NOT_FOUND,
    )


def _replicated(
    args: argparse.Namespace,
    write: Callable[[argparse.Namespace], dict[str, Any]],
    show: Callable[[dict[str, Any]], None],
    code: Callable[[dict[str, Any]], int] = lambda _: EXIT_OK,
    chosen: list[Target] | None = None,
) -> int:
    """Run a change of the shard maps in every region (``chosen``, default
    ``fanout.targets``; one ensemble when no regions are configured): one line per region
    (``--json``: ``{"regions": {NAME: result or {"error", "exit_code"}}}``); RegionsFailed when
    a region was not written, after the others were."""
    chosen = chosen if chosen is not None else targets(args, replicated=True)
    if chosen[0].region is None:  # one ensemble: as before regions
        document = write(args)
        if args.json:
            print_json(document)
        else:
            show(document)
        return code(document)
    outcomes = each_region(chosen, write, f"sentinel shard {args.command_name}")
    if args.json:
        print_json(
            {
                "regions": {
                    o.region: o.result
                    if o.error is None
                    else {"error": str(o.error), "exit_code": exit_code(o.error)}
                    for o in outcomes
                }
            }
        )
    else:
        for outcome in outcomes:
            print(f"{outcome.region}: ", end="")
            if outcome.error is None:
                show(outcome.result)
            else:
                print(f"NOT WRITTEN: {outcome.error}")
    raise_failures(outcomes)
    return max(code(o.result) for o in outcomes)


def _show(args: argparse.Namespace) -> int:
    key = validate_key(args.key)
    with connect(args) as zk:
        spec = read_spec(zk, args.policy)
        partition = _partition_of(zk, spec, key)
        served = _instances_in(_users(zk, args.policy), partition) if partition else []
    if args.json:
        print_json({"key": key, "policy": args.policy, "partition": partition, "instances": served})
    elif partition is None:
        print(f"{key} maps to no partition in {args.policy}")
    else:
        print(
            f"{key} -> {partition} ({spec.kind} policy {args.policy}); "
            f"served by {', '.join(served) or 'no live instance'}"
        )
    return EXIT_OK if partition is not None else EXIT_NOT_FOUND


def _directory(zk: KazooClient, policy: str) -> dict[str, str]:
    spec = read_spec(zk, policy)
    if spec.kind != "directory":
        raise ValidationError(f"policy {policy!r} is a {spec.kind} policy: it has no key list")
    return dict(iter_assignments(zk, policy))


def _list(args: argparse.Namespace) -> int:
    with connect(args) as zk:
        keys = _directory(zk, args.policy)
    rows = sorted((k, p) for k, p in keys.items() if args.partition in (None, p))
    if args.json:
        print_json(dict(rows))
    else:
        print_table(rows, ("KEY", "PARTITION"))
    return EXIT_OK


def keys_and_gaps(zk: KazooClient, policy: str) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Keys per partition, and per service the partitions in use that have no live instance."""
    spec = read_spec(zk, policy)
    counts: dict[str, int] = collections.Counter()
    if spec.kind == "directory":
        counts.update(p for _, p in iter_assignments(zk, policy))
    used = set(spec.partitions or ()) | set(counts) | {p for _, p in spec.boundaries}
    gaps = {}
    for service, instances in _users(zk, policy).items():
        live = {i.partition for i in instances if i.status == "up"}
        gaps[service] = sorted(used - live)
    return dict(sorted(counts.items())), gaps


def _stats(args: argparse.Namespace) -> int:
    with connect(args) as zk:
        counts, gaps = keys_and_gaps(zk, args.policy)
    if args.json:
        print_json(
            {
                "policy": args.policy,
                "keys_per_partition": counts,
                "partitions_without_live_instance": gaps,
            }
        )
        return EXIT_OK
    print_table(list(counts.items()), ("PARTITION", "KEYS"))
    for service, missing in gaps.items():
        if missing:
            print(f"{service}: no live instance in {', '.join(missing)}")
    return EXIT_OK


def _validate(args: argparse.Namespace) -> int:
    with connect(args) as zk:
        _, gaps = keys_and_gaps(zk, args.policy)
    problems = {s: p for s, p in gaps.items() if p}
    if args.json:
        print_json({"policy": args.policy, "valid": not problems, "gaps": problems})
    elif problems:
        for service, missing in problems.items():
            print(f"{service}: partitions without a live instance: {', '.join(missing)}")
    else:
        print(f"every partition of {args.policy} has a live instance of each service using it")
    return EXIT_NOT_FOUND if problems else EXIT_OK


def read_mapping(file: str) -> dict[str, str]:
    """``key -> partition`` from CSV (``key,partition`` lines, optional header) or JSON (an
    object, or a list of pairs). The file must be UTF-8, and JSON storable as it is (no lone
    surrogate). Raises ValidationError naming the line, entry or path at fault."""
    text = read_input(file)
    if file.endswith(".json") or text.lstrip().startswith(("{", "[")):
        document = parse_json(text, file)
        if isinstance(document, dict):
            pairs: list[Any] = [list(item) for item in document.items()]
        elif isinstance(document, list):
            pairs = document
        else:
            raise ValidationError(
                f"{file}: JSON must be an object of key -> partition or a list of "
                f"[key, partition] pairs, not {type(document).__name__}"
            )
        mapping = {}
        for number, pair in enumerate(pairs, start=1):
            if not (
                isinstance(pair, list | tuple)
                and len(pair) == 2
                and all(isinstance(x, str) for x in pair)
            ):
                raise ValidationError(f"{file}: entry {number} must be a [key, partition] pair")
            try:
                mapping[validate_key(pair[0])] = pair[1]
            except ValidationError as exc:
                raise ValidationError(f"{file}: entry {number}: {exc}") from None
        return mapping
    mapping = {}
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or (number == 1 and [c.strip().lower() for c in row] == ["key", "partition"]):
            continue
        if len(row) != 2 or not row[0] or not row[1]:
            raise ValidationError(f"{file}: line {number} must be KEY,PARTITION, got {row!r}")
        try:
            mapping[validate_key(row[0])] = row[1].strip()
        except ValidationError as exc:
            raise ValidationError(f"{file}: line {number}: {exc}") from None
    return mapping


def _check_buckets(spec: ShardPolicySpec, current: dict[str, str], changes: dict[str, str]) -> None:
    """Encode every bucket the import changes as it will be written, so that a bucket over the
    size limit is refused (ValueTooLarge) before the first write, by --dry-run as well."""
    touched = {bucket_of(key, spec.buckets) for key in changes}
    after: dict[int, dict[str, str]] = {index: {} for index in touched}
    for key, partition in itertools.chain(current.items(), changes.items()):
        index = bucket_of(key, spec.buckets)
        if index in after:
            after[index][key] = partition
    for index, keys in after.items():
        encode_bucket(bucket_path(spec.policy, index), keys)


def _import(args: argparse.Namespace) -> int:
    mapping = read_mapping(args.file)  # read once, whatever the number of regions

    def write(args: argparse.Namespace) -> dict[str, Any]:
        with connect(args) as zk:
            spec = read_spec(zk, args.policy)
            if spec.kind != "directory":
                raise ValidationError(
                    f"policy {args.policy!r} is a {spec.kind} policy: keys cannot be imported "
                    "into it"
                )
            for key, partition in mapping.items():  # everything checked before the first write
                try:
                    spec.check_partition(partition)
                except ValidationError as exc:
                    raise ValidationError(f"{args.file}: key {key!r}: {exc}") from None
            current = dict(iter_assignments(zk, args.policy))
            changes = {k: p for k, p in mapping.items() if current.get(k) != p}
            _check_buckets(spec, current, changes)
            items = list(changes.items())
            size = max(args.batch, 1)
            batches = [dict(items[start : start + size]) for start in range(0, len(items), size)]
            if not args.dry_run:
                _write_batches(zk, args.policy, batches)
        return {
            "policy": args.policy,
            "keys": len(mapping),
            "changed": len(changes),
            "unchanged": len(mapping) - len(changes),
            "dry_run": args.dry_run,
        }

    return _replicated(
        args,
        write,
        lambda d: print(
            f"{'would change' if args.dry_run else 'changed'} {d['changed']} of "
            f"{d['keys']} keys ({d['unchanged']} already as in {args.file})"
        ),
    )


def _sync(args: argparse.Namespace) -> int:
    from sentinel.shards.replication import copy_map, read_source

    regions = getattr(args, "regions_config", None)
    if regions is None or not regions.regions:
        raise ValidationError(
            "shard sync copies one region's map to the others: give the regions (--regions "
            "or $SENTINEL_REGIONS)"
        )
    chosen = [t for t in targets(args, replicated=True) if t.region != args.from_region]
    if not chosen:
        raise ValidationError(f"nothing to copy {args.from_region}'s map to")
    source_region = regions.region(args.from_region)
    with connect(pointed_at(args, source_region, regions.identity_of(source_region))) as zk:
        source = read_source(zk, args.policy)  # checked whole before any region is written

    def write(args: argparse.Namespace) -> dict[str, Any]:
        with connect(args, create=True) as target:
            copied = copy_map(source, target, args.policy, dry_run=args.dry_run)
        return {"policy": args.policy, "from": args.from_region, **copied, "dry_run": args.dry_run}

    def show(document: dict[str, Any]) -> None:
        if not (document["buckets"] or document["digest"]):
            print(f"{args.policy} already as in {args.from_region}")
            return
        digest = " and its digest" if document["digest"] else ""
        print(
            f"{'would copy' if args.dry_run else 'copied'} {document['buckets']} bucket(s){digest}"
            f" of {args.policy} from {args.from_region}"
        )

    return _replicated(args, write, show, chosen=chosen)


def _write_batches(zk: KazooClient, policy: str, batches: list[dict[str, str]]) -> None:
    """Commit each batch of keys (a re-run resumes: it writes only what still differs); on a
    failure, raise an error saying which batches were committed."""
    total = sum(map(len, batches))
    progress = Progress(total, "importing")
    done = 0
    try:
        for number, batch in enumerate(batches, start=1):
            try:
                update_keys(zk, policy, batch)
            except (SentinelError, KazooException, KazooTimeoutError) as exc:
                raise interrupted(
                    exc, "sentinel shard import", number, len(batches), done, total, atomic=False
                ) from None
            done += len(batch)
            progress.advance(len(batch))
    finally:
        progress.close()


def _export(args: argparse.Namespace) -> int:
    with connect(args) as zk:
        keys = sorted(_directory(zk, args.policy).items())
    as_json = args.format == "json" or (args.format is None and args.file.endswith(".json"))
    if as_json:
        text = json.dumps(dict(keys), indent=1, sort_keys=True) + "\n"
    else:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["key", "partition"])
        writer.writerows(keys)
        text = buffer.getvalue()
    if args.file == "-":
        sys.stdout.write(text)
    else:
        Path(args.file).write_text(text, encoding="utf-8")
        print(f"exported {len(keys)} keys of {args.policy} to {args.file}", file=sys.stderr)
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    from sentinel.registry.layout import sanitize_name
    from sentinel.shard_manager import ShardManager

    report = event_printer(
        args,
        {
            "placed": lambda d: f"placed {d['key']} -> {d['partition']}",
            "alert": lambda d: (
                f"ALERT {d.get('service', d.get('region'))} partition "
                f"{d['partition']}: {d['problem']}"
            ),
        },
    )
    client_id = sanitize_name(f"shard-manager-{args.policy}-{socket.gethostname()}-{os.getpid()}")
    copies = _placement_copies(args, report)
    return run_daemon(
        args, client_id, lambda sentinel: ShardManager(sentinel, args.policy, report, copies)
    )


def _placement_copies(args: argparse.Namespace, report: Any) -> Any:
    """With regions configured, the copies of the daemon's placements to the regions other
    than the one it runs in (None without)."""
    regions = getattr(args, "regions_config", None)
    others = regions.others if regions is not None else ()
    if not others:
        return None
    from kazoo.client import KazooClient

    from sentinel.connection import client_arguments
    from sentinel.shards.replication import PlacementCopies

    def connect_to(region: Any) -> Any:
        return lambda: KazooClient(
            hosts=f"{region.hosts}{region.namespace}",
            timeout=max(args.timeout, 2.0),
            # retried for as long as the region is down, at most 5 s apart: it catches up soon
            # after it comes back
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 5.0},
            **client_arguments(regions.identity_of(region), region.tls),
        )

    return PlacementCopies(args.policy, {r.name: connect_to(r) for r in others}, report)
