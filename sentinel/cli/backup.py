"""``sentinel init``, ``export``, ``import`` and ``prune``: the namespace as a whole."""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from sentinel.auth import acl
from sentinel.auth.grants import grant_daemon_services, parse_grant
from sentinel.auth.securing import secure_namespace
from sentinel.cli.common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    Progress,
    add_command,
    client,
    connect,
    print_json,
)
from sentinel.ephemeral import first_failure
from sentinel.errors import ValidationError
from sentinel.layout import METRICS, SECTIONS
from sentinel.records import MAX_VALUE_BYTES
from sentinel.registry import list_services, read_metrics, read_service

EXPORT_VERSION = 1
_BATCH_OPS = 200


def _init(args: argparse.Namespace) -> int:
    requested = [parse_grant(grant) for grant in args.grant]  # checked before any write
    identities = None
    if args.secure:
        if not args.identities:
            raise ValidationError("--secure needs --identities FILE (created when missing)")
        identities = acl.load_identities(args.identities, create_missing=True)
    elif requested:
        raise ValidationError("--grant needs --secure")
    with client(args) as sentinel:  # starting a client creates the namespace and sections
        document: dict[str, Any] = {
            "namespace": sentinel.namespace,
            "hosts": sentinel.hosts,
            "sections": list(SECTIONS),
            "secured": identities is not None,
        }
    if identities is not None:
        with connect(args, identity=identities["admin"]) as zk:
            report = secure_namespace(zk, identities, requested)
        document["acl_nodes"] = {
            "checked": report.checked,
            "changed": report.changed,
            "reset_key_slots": list(report.reset_key_slots),
            "unrepaired": list(report.unrepaired),
        }
        document["grants"] = report.grants
        document["identities"] = {role: i.split(":", 1)[0] for role, i in identities.items()}
    if args.json:
        print_json(document)
    else:
        print(
            f"namespace {document['namespace']} on {document['hosts']} is ready "
            f"({', '.join(SECTIONS)})"
        )
        if identities is not None:
            nodes = document["acl_nodes"]
            print(
                f"ACLs checked on {nodes['checked']} node(s), {nodes['changed']} changed; "
                f"each role's identity (user:password) is in {args.identities}:"
            )
            for role, section in ROLE_SECTIONS.items():
                print(f"  {role:<14} {document['identities'][role]:<14} writes {section}")
            for path in nodes["reset_key_slots"]:
                name = path.rsplit("/", 1)[1]
                print(
                    f"key slot {path} was not enrolled by the admin: reset; "
                    f"enrol it with `sentinel auth enroll {name}`"
                )
            for path in nodes["unrepaired"]:
                print(
                    f"could not repair {path}: its ACL shuts the admin out "
                    "(a ZooKeeper superuser can; see docs/auth.md)",
                    file=sys.stderr,
                )
            _print_grants(document["grants"], identities)
    return EXIT_NOT_FOUND if identities is not None and report.unrepaired else EXIT_OK


def _print_grants(grants: dict[str, str], identities: dict[str, str]) -> None:
    for service, role in grants.items():
        user = identities[role].split(":", 1)[0]
        print(f"  {role:<14} {user:<14} announces itself in /services/{service}")


def _grant(args: argparse.Namespace) -> int:
    requested = [parse_grant(grant) for grant in args.grants]  # checked before any write
    identities = acl.load_identities(args.identities)
    with connect(args, identity=identities["admin"]) as zk:
        if not acl.is_secured(zk):
            raise ValidationError(
                f"namespace {args.namespace} is not secured: run 'sentinel init --secure' first"
            )
        grants = grant_daemon_services(zk, identities, requested)
    if args.json:
        print_json({"grants": grants})
    else:
        print(f"daemon services of {args.namespace}, each writable by its role:")
        _print_grants(grants, identities)
    return EXIT_OK


ROLE_SECTIONS = {
    "admin": "everything",
    **{role: section for section, role in acl.SECTION_OWNERS.items()},
}


def _walk(zk: KazooClient, path: str) -> Iterator[tuple[str, bytes, int]]:
    """Every node below ``path`` (depth first, parents before children): path, data, owner."""
    for child in sorted(zk.get_children(path)):
        child_path = f"{path.rstrip('/')}/{child}"
        try:
            data, stat = zk.get(child_path)
        except NoNodeError:
            continue  # gone since the listing
        yield child_path, data, stat.ephemeralOwner
        yield from _walk(zk, child_path)


def _encode_data(data: bytes) -> dict[str, Any]:
    try:
        return {"json": json.loads(data.decode("utf-8"))} if data else {"json": None}
    except (UnicodeDecodeError, ValueError):
        return {"base64": base64.b64encode(data).decode("ascii")}


def _export(args: argparse.Namespace) -> int:
    with connect(args) as zk:
        nodes = [
            {"path": path, "ephemeral": owner != 0, **_encode_data(data)}
            for path, data, owner in _walk(zk, "/")
        ]
    document = {
        "sentinel_export": EXPORT_VERSION,
        "namespace": args.namespace,
        "exported_at": time.time(),
        "nodes": nodes,
    }
    text = json.dumps(document, indent=1, sort_keys=True)
    if args.file == "-":
        print(text)
    else:
        with open(args.file, "w", encoding="utf-8") as out:
            out.write(text + "\n")
        print(f"exported {len(nodes)} node(s) of {args.namespace} to {args.file}", file=sys.stderr)
    return EXIT_OK


def _load_export(file: str) -> list[tuple[str, bytes]]:
    """The persistent nodes of an export file, validated before anything is written."""
    try:
        with sys.stdin if file == "-" else open(file, encoding="utf-8") as source:
            document = json.load(source)
    except OSError as exc:
        raise ValidationError(f"cannot read {file}: {exc.strerror}") from None
    except ValueError as exc:
        raise ValidationError(f"{file} is not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("sentinel_export") != EXPORT_VERSION:
        raise ValidationError(f"{file} is not a sentinel export (version {EXPORT_VERSION})")
    nodes = document.get("nodes")
    if not isinstance(nodes, list):
        raise ValidationError(f"{file}: 'nodes' must be a list")
    loaded = []
    for number, node in enumerate(nodes, start=1):
        where = f"{file}: node {number}"
        if not isinstance(node, dict) or not isinstance(node.get("path"), str):
            raise ValidationError(f"{where} needs a 'path'")
        path = node["path"]
        parts = path.split("/")
        if not path.startswith("/") or path == "/" or any(p in ("", ".", "..") for p in parts[1:]):
            raise ValidationError(f"{where}: {path!r} is not an absolute node path")
        if node.get("ephemeral"):
            continue  # live state: it belongs to a session, not to a backup
        if "base64" in node:
            try:
                data = base64.b64decode(node["base64"], validate=True)
            except (ValueError, TypeError):
                raise ValidationError(f"{where}: 'base64' is not base64") from None
        elif "json" in node:
            data = (
                b""
                if node["json"] is None
                else json.dumps(node["json"], separators=(",", ":")).encode("utf-8")
            )
        else:
            raise ValidationError(f"{where} needs 'json' or 'base64' data")
        if len(data) > MAX_VALUE_BYTES:
            raise ValidationError(f"{where}: {len(data)} bytes is over the {MAX_VALUE_BYTES} limit")
        loaded.append((path, data))
    return sorted(loaded, key=lambda item: item[0].count("/"))


def _import(args: argparse.Namespace) -> int:
    nodes = _load_export(args.file)
    created = updated = unchanged = 0
    with connect(args, create=not args.dry_run) as zk:
        plan: list[tuple[str, str, bytes, int]] = []  # (op, path, data, version)
        for path, data in nodes:
            try:
                current, stat = zk.get(path)
            except NoNodeError:
                plan.append(("create", path, data, -1))
                continue
            if current == data:
                unchanged += 1
            else:
                plan.append(("set", path, data, stat.version))
        if not args.dry_run:
            progress = Progress(len(plan), "importing")
            for start in range(0, len(plan), _BATCH_OPS):
                batch = plan[start : start + _BATCH_OPS]
                transaction = zk.transaction()
                for op, path, data, version in batch:
                    if op == "create":
                        transaction.create(path, data)
                    else:
                        transaction.set_data(path, data, version=version)
                failure = first_failure(transaction.commit())
                if failure is not None:
                    progress.close()
                    raise ValidationError(
                        f"import stopped: {type(failure).__name__} in a batch near "
                        f"{batch[0][1]}; nodes changed meanwhile? Re-run to resume"
                    )
                progress.advance(len(batch))
            progress.close()
        created = sum(op == "create" for op, *_ in plan)
        updated = len(plan) - created
    summary = {
        "created": created,
        "updated": updated,
        "unchanged": unchanged,
        "dry_run": args.dry_run,
    }
    if args.json:
        print_json(summary)
    else:
        verb = "would create" if args.dry_run else "created"
        print(
            f"{verb} {created}, {'would update' if args.dry_run else 'updated'} {updated}, "
            f"{unchanged} already as exported"
        )
    return EXIT_OK


def _prune(args: argparse.Namespace) -> int:
    now = time.time()
    with connect(args) as zk:
        orphans = []
        for service in list_services(zk):
            names = {f"{i.partition}:{i.label}" for i in read_service(zk, service).instances}
            metrics, _ = read_metrics(zk, service)
            orphans += [
                f"{METRICS}/{service}/{name}"
                for name, record in metrics.items()
                if name not in names and now - record.measured_at > args.older_than
            ]
        if not args.dry_run:
            for path in orphans:
                with contextlib.suppress(NoNodeError):  # removed by someone else meanwhile
                    zk.delete(path)
    if args.json:
        print_json({"removed" if not args.dry_run else "would_remove": orphans})
    else:
        print(
            f"{'would remove' if args.dry_run else 'removed'} {len(orphans)} orphaned "
            "metrics node(s)" + "".join(f"\n  {p}" for p in orphans)
        )
    return EXIT_OK


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``init``, ``export``, ``import`` and ``prune``."""
    init = add_command(
        commands,
        "init",
        _init,
        "create the namespace and its five sections (--secure: with ACLs per role)",
        "Create the namespace root and /services, /auth, /shard_info, /metrics "
        "and /clients (idempotent). With --secure, give each role a ZooKeeper digest "
        "identity and set ACLs so that only the authentication manager writes /auth, "
        "publishers /services, collectors /metrics and the shard manager /shard_info; "
        "everyone reads, clients add their own /clients entries, and only the admin creates "
        "client key slots (`sentinel auth enroll`). Re-running it re-applies the ACL of every "
        "node of every section, existing ones included, and resets key slots the admin did "
        "not enrol. Roles then connect with $SENTINEL_ZK_IDENTITY=user:password (see "
        "docs/auth.md). Exit 1 when a node's ACL shuts the admin out. "
        "The collector and the shard manager also register themselves (their cluster "
        "views) under their own identities: each may write its own services and no others, "
        "by default metric-collector-default and shard-manager-POLICY for every shard policy; "
        "--grant adds others, and 'sentinel grant' adds them later (after creating a shard "
        "policy, or for a new collector cluster).",
    )
    init.add_argument("--secure", action="store_true", help="set ACLs per role")
    init.add_argument(
        "--identities",
        metavar="FILE",
        help="JSON file of role -> 'user:password'; missing roles get generated ones "
        "(the file is written with mode 0600)",
    )
    init.add_argument(
        "--grant",
        action="append",
        default=[],
        metavar="ROLE=SERVICE",
        help="with --secure: also let a daemon role announce itself as SERVICE, e.g. "
        "collector=metric-collector-eu-1 (a collector cluster) or "
        "shard_manager=shard-manager-tenants (a policy's manager); repeatable",
    )

    grant = add_command(
        commands,
        "grant",
        _grant,
        "let the collector or shard manager announce itself in a secured namespace",
        "In a namespace secured by 'sentinel init --secure', let each daemon role register "
        "itself (its cluster view) in its own services under its own identity, and in no "
        "other service: the collector in metric-collector-CLUSTER, the shard manager in "
        "shard-manager-POLICY. Grants the default collector cluster's, the manager's of "
        "every shard policy, every such service that exists, and those named (creating "
        "their specs). Run it after creating a shard policy or before starting a collector "
        "cluster; it is idempotent. Acts as the admin (and the publisher, for specs the "
        "publisher made) from the identities file.",
    )
    grant.add_argument(
        "grants",
        nargs="*",
        metavar="ROLE=SERVICE",
        help="e.g. collector=metric-collector-eu-1 or shard_manager=shard-manager-tenants",
    )
    grant.add_argument(
        "--identities", required=True, metavar="FILE", help="the file 'init --secure' wrote"
    )

    export = add_command(
        commands,
        "export",
        _export,
        "write the whole namespace as JSON (backup, migration)",
        "Every node under the namespace, parents first, with its data as JSON "
        "(or base64 when it is not JSON) and whether it is ephemeral.",
    )
    export.add_argument("file", metavar="FILE", help="output file, or - for stdout")

    imp = add_command(
        commands,
        "import",
        _import,
        "load an export into a namespace (idempotent)",
        "Create the export's persistent nodes that are missing and rewrite those "
        "whose data differs, in multi-op batches. Ephemeral nodes (live instances, clients) "
        "are skipped: they belong to sessions. The file is validated before anything is "
        "written; re-running an import that completed changes nothing.",
    )
    imp.add_argument("file", metavar="FILE", help="export file, or - for stdin")
    imp.add_argument("--dry-run", action="store_true", help="say what would change")

    prune = add_command(
        commands,
        "prune",
        _prune,
        "remove metrics of instances that are gone",
        "Delete /metrics nodes whose instance is no longer registered and whose "
        "values are older than --older-than seconds (an instance restarting is not pruned).",
    )
    prune.add_argument("--older-than", type=float, default=600.0, metavar="SECONDS")
    prune.add_argument("--dry-run", action="store_true", help="list them, delete nothing")
