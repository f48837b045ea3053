"""``sentinel init``, ``export``, ``import`` and ``prune``: the namespace as a whole."""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import ACL

from sentinel.auth import acl
from sentinel.auth.grants import grant_daemon_services, parse_grant
from sentinel.auth.securing import check_namespace_control, secure_namespace
from sentinel.cli.common import (
    Progress,
    client,
    connect,
    interrupted,
    parse_json,
    print_json,
    read_input,
)
from sentinel.cli.curator import instances_of
from sentinel.cli.options import (
    EXIT_NOT_FOUND,
    EXIT_OK,
)
from sentinel.errors import AccessDenied, ValidationError
from sentinel.registry.layout import AUTH_KEYS, METRICS, SECTIONS, validate_namespace
from sentinel.registry.reads import list_services, pipelined_reads, read_metrics, read_service
from sentinel.registry.records import MAX_VALUE_BYTES
from sentinel.zk.ephemeral import first_failure

EXPORT_VERSION = 1
# Bytes of writes per multi request: half of ZooKeeper's default jute.maxbuffer (1 MB), which
# a request must stay under; a single node is at most MAX_VALUE_BYTES.
_BATCH_BYTES = 512 * 1024
# Characters ZooKeeper refuses in a path (its PathUtils.validatePath).
_NOT_IN_PATHS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\uffff]")


def _init(args: argparse.Namespace) -> int:
    requested = [parse_grant(grant) for grant in args.grant]  # checked before any write
    identities = None
    if args.secure:
        if not args.identities:
            raise ValidationError("--secure needs --identities FILE (created when missing)")
        identities = acl.load_identities(args.identities, create_missing=True)
        with connect(args, identity=identities["admin"], chroot=False) as zk:
            acl.act_as_every_role(zk, identities)
            check_namespace_control(zk, args.namespace, identities)  # before any write
    elif requested:
        raise ValidationError("--grant needs --secure")
    with client(args) as sentinel:
        sentinel.ensure_namespace()
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
            "removed": list(report.removed),
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
            for path in nodes["removed"]:
                print(
                    f"removed {path}: neither a role's identity wrote it (a role's user name "
                    "with another password?) nor is it a client process's entry"
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


def _encode_data(path: str, data: bytes) -> dict[str, Any]:
    """A node's data in an export: JSON when it is UTF-8 JSON that an import stores as it is
    (:func:`parse_json`: no NaN or Infinity, no lone surrogate, not nested past the parser),
    else base64, so that every node comes back byte for byte."""
    if not data:
        return {"json": None}
    try:
        return {"json": parse_json(data.decode("utf-8"), path)}
    except (UnicodeDecodeError, ValidationError):
        return {"base64": base64.b64encode(data).decode("ascii")}


def _export(args: argparse.Namespace) -> int:
    with connect(args) as zk:
        nodes = [
            {"path": path, "ephemeral": owner != 0, **_encode_data(path, data)}
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
    """The persistent nodes of an export file, parents first, validated before anything is
    written: UTF-8, JSON storable as such (no NaN, no lone surrogate), node paths and data.
    Raises ValidationError with the line, node or path at fault."""
    document = parse_json(read_input(file), file)
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
        if (
            not path.startswith("/")
            or path == "/"
            or any(p in ("", ".", "..") for p in parts[1:])
            or _NOT_IN_PATHS.search(path)
        ):
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
                else json.dumps(node["json"], separators=(",", ":"), allow_nan=False).encode()
            )
        else:
            raise ValidationError(f"{where} needs 'json' or 'base64' data")
        if len(data) > MAX_VALUE_BYTES:
            raise ValidationError(f"{where}: {len(data)} bytes is over the {MAX_VALUE_BYTES} limit")
        loaded.append((path, data))
    duplicates = len(loaded) - len({path for path, _ in loaded})
    if duplicates:
        raise ValidationError(f"{file}: {duplicates} node path(s) appear more than once")
    return sorted(loaded, key=lambda item: item[0].count("/"))


@dataclass(frozen=True)
class _Write:
    """One write of an import: create (``version`` None) or compare-and-set a node."""

    path: str  # from the ensemble's root
    data: bytes
    version: int | None = None
    acl: tuple[ACL, ...] | None = None

    def size(self) -> int:
        """An upper estimate of the bytes the write takes in a multi request."""
        acl = sum(len(e.id.scheme) + len(e.id.id) + 16 for e in self.acl or ())
        return len(self.path.encode()) + len(self.data) + acl + 32


class _SectionAcls:
    """The ACL each created node gets: that of the nearest existing node among the namespace
    root, its sections and ``/auth/.keys`` above it, each read once (ZooKeeper's default
    ACL when none of them exists yet: a new namespace)."""

    def __init__(self, zk: KazooClient, root: str) -> None:
        self._zk = zk
        self._root = root
        self._anchors = {f"{root}{path}" for path in (*SECTIONS, AUTH_KEYS)}
        self._read: dict[str, tuple[ACL, ...] | None] = {}

    def for_node(self, path: str) -> tuple[ACL, ...] | None:
        """The ACL for creating ``path`` (None: ZooKeeper's default)."""
        parent = path.rsplit("/", 1)[0]
        while len(parent) > len(self._root):
            if parent in self._anchors:
                acl = self._acl_of(parent)
                if acl is not None:
                    return acl
            parent = parent.rsplit("/", 1)[0]
        return self._acl_of(self._root or "/")

    def _acl_of(self, path: str) -> tuple[ACL, ...] | None:
        if path not in self._read:
            try:
                acl, _ = self._zk.get_acls(path)
            except NoNodeError:
                self._read[path] = None
                return None
            hidden = [e for e in acl if e.id.scheme == "digest" and e.id.id.endswith(":x")]
            if hidden:
                raise AccessDenied(
                    f"ZooKeeper hides the digest ids of {path}'s ACL from this identity "
                    f"({hidden[0].id.id}): import as the namespace's admin "
                    "($SENTINEL_ZK_IDENTITY) so that imported nodes get that ACL"
                )
            self._read[path] = tuple(acl)
        return self._read[path]


def _plan_import(
    zk: KazooClient, root: str, nodes: list[tuple[str, bytes]]
) -> tuple[list[_Write], int]:
    """The writes that make the namespace at ``root`` hold ``nodes``, and how many nodes are
    already as in the file. Refuses (ValidationError) a node whose parent is neither in the
    file nor in ZooKeeper, before anything is written."""
    acls = _SectionAcls(zk, root)
    writes: list[_Write] = []
    missing_root = [
        prefix
        for prefix in itertools.accumulate(f"/{p}" for p in root.strip("/").split("/"))
        if zk.exists(prefix) is None
    ]
    writes += [_Write(path, b"") for path in missing_root]
    in_file = {path for path, _ in nodes}
    unchanged = 0
    for (path, data), result in pipelined_reads(zk, nodes, lambda node: f"{root}{node[0]}"):
        try:
            current, stat = result.get()
        except NoNodeError:
            parent = path.rsplit("/", 1)[0]
            if parent and parent not in in_file and zk.exists(f"{root}{parent}") is None:
                raise ValidationError(
                    f"node {path}: its parent {parent} is neither in the file nor in the namespace"
                ) from None
            full = f"{root}{path}"
            writes.append(_Write(full, data, acl=acls.for_node(full)))
            continue
        if current == data:
            unchanged += 1
        else:
            writes.append(_Write(f"{root}{path}", data, version=stat.version))
    return writes, unchanged


def _batches(writes: list[_Write]) -> list[list[_Write]]:
    """Writes grouped in multi requests of at most _BATCH_BYTES each (one write per batch at
    least: a node is at most MAX_VALUE_BYTES)."""
    batches: list[list[_Write]] = []
    size = _BATCH_BYTES
    for write in writes:
        if size + write.size() > _BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(write)
        size += write.size()
    return batches


def _commit(zk: KazooClient, batches: list[list[_Write]]) -> None:
    """Commit each batch as one multi; on a failure, raise an error saying which batches were
    committed and how to resume."""
    total = sum(map(len, batches))
    progress = Progress(total, "importing")
    done = 0
    try:
        for number, batch in enumerate(batches, start=1):
            transaction = zk.transaction()
            for write in batch:
                if write.version is None:
                    transaction.create(
                        write.path, write.data, acl=list(write.acl) if write.acl else None
                    )
                else:
                    transaction.set_data(write.path, write.data, version=write.version)
            try:
                failure = first_failure(transaction.commit())
            except (KazooException, KazooTimeoutError) as exc:
                failure = exc
            if failure is not None:
                raise interrupted(failure, "sentinel import", number, len(batches), done, total)
            done += len(batch)
            progress.advance(len(batch))
    finally:
        progress.close()


def _import(args: argparse.Namespace) -> int:
    nodes = _load_export(args.file)
    root = validate_namespace(args.namespace).rstrip("/")
    with connect(args, chroot=False) as zk:
        writes, unchanged = _plan_import(zk, root, nodes)
        batches = _batches(writes)
        if not args.dry_run:
            _commit(zk, batches)
    file_writes = [w for w in writes if w.path.startswith(f"{root}/")]
    created = sum(w.version is None for w in file_writes)
    summary = {
        "created": created,
        "updated": len(file_writes) - created,
        "unchanged": unchanged,
        "dry_run": args.dry_run,
    }
    if args.json:
        print_json(summary)
    else:
        verb = "would create" if args.dry_run else "created"
        print(
            f"{verb} {created}, {'would update' if args.dry_run else 'updated'} "
            f"{summary['updated']}, {unchanged} already as exported "
            f"({len(batches)} batch(es))"
            + (
                f"; namespace {root} {'would be' if args.dry_run else 'was'} created"
                if len(writes) > len(file_writes)
                else ""
            )
        )
    return EXIT_OK


def _prune(args: argparse.Namespace) -> int:
    now = time.time()
    with connect(args) as zk:
        orphans = []
        for service in list_services(zk):
            # A service whose spec names a Curator registry keeps its instances there.
            names = instances_of(args, read_service(zk, service)).names
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
