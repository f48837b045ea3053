"""``sentinel init``, ``grant``, ``export``, ``import`` and ``prune``: their parsers
(implementation: :mod:`sentinel.cli.backup`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import add_command, seconds_or_zero


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``init``, ``export``, ``import`` and ``prune``."""
    init = add_command(
        commands,
        "init",
        "backup:_init",
        "create the namespace and its five sections (--secure: with ACLs per role)",
        "Create the namespace root and /services, /auth, /shard_info, /metrics "
        "and /clients (idempotent). With --secure, give each role a ZooKeeper digest "
        "identity and set ACLs so that only the authentication manager writes /auth, "
        "publishers /services, collectors /metrics and the shard manager /shard_info; "
        "everyone reads, clients add their own /clients entries, and only the admin creates "
        "client key slots (`sentinel auth enroll`). Re-running it re-applies the ACL of every "
        "node of every section, existing ones included, and resets key slots the admin did "
        "not enrol. Roles are recognised by their whole identity (the digest's hash, not the user "
        "name): a node written by another identity whose ACL it cannot reset is removed, or "
        "named. Roles then connect with $SENTINEL_ZK_IDENTITY=user:password (see "
        "docs/auth.md). Exit 1 when a node's ACL shuts the admin out. "
        "The collector and the shard manager also register themselves (their cluster "
        "views) under their own identities: each may write its own services and no others, "
        "by default metric-collector-default and shard-manager-POLICY for every shard policy; "
        "--grant adds others, and 'sentinel grant' adds them later (after creating a shard "
        "policy, or for a new collector cluster).",
        (
            "sentinel init",
            "sentinel init --namespace /staging",
            "sentinel init --secure --identities identities.json",
            "sentinel init --secure --identities identities.json "
            "--grant collector=metric-collector-eu-1",
        ),
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
        "backup:_grant",
        "let the collector or shard manager announce itself in a secured namespace",
        "In a namespace secured by 'sentinel init --secure', let each daemon role register "
        "itself (its cluster view) in its own services under its own identity, and in no "
        "other service: the collector in metric-collector-CLUSTER, the shard manager in "
        "shard-manager-POLICY. Grants the default collector cluster's, the manager's of "
        "every shard policy, every such service that exists, and those named (creating "
        "their specs). Run it after creating a shard policy or before starting a collector "
        "cluster; it is idempotent. Acts as the admin (and the publisher, for specs the "
        "publisher made) from the identities file.",
        (
            "sentinel grant --identities identities.json",
            "sentinel grant --identities identities.json shard_manager=shard-manager-tenants",
        ),
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
        "backup:_export",
        "write the whole namespace as JSON (backup, migration)",
        "Every node under the namespace, parents first, with its data as JSON "
        "(or base64 when it is not JSON) and whether it is ephemeral.",
        (
            "sentinel export backup.json",
            "sentinel export - --namespace /staging | gzip > s.json.gz",
        ),
    )
    export.add_argument("file", metavar="FILE", help="output file, or - for stdout")

    imp = add_command(
        commands,
        "import",
        "backup:_import",
        "load an export into a namespace (idempotent)",
        "Create the export's persistent nodes that are missing and rewrite those "
        "whose data differs, in multi-op batches. Ephemeral nodes (live instances, clients) "
        "are skipped: they belong to sessions. The file is validated before anything is "
        "written; re-running an import that completed changes nothing.",
        (
            "sentinel import backup.json --dry-run",
            "sentinel import backup.json --namespace /sentinel-copy",
        ),
    )
    imp.add_argument("file", metavar="FILE", help="export file, or - for stdin")
    imp.add_argument("--dry-run", action="store_true", help="say what would change")

    prune = add_command(
        commands,
        "prune",
        "backup:_prune",
        "remove metrics of instances that are gone",
        "Delete /metrics nodes whose instance is no longer registered and whose "
        "values are older than --older-than seconds (an instance restarting is not pruned).",
        ("sentinel prune --dry-run", "sentinel prune --older-than 3600"),
    )
    prune.add_argument(
        "--older-than",
        type=seconds_or_zero,
        default=600.0,
        metavar="SECONDS",
        help="only metrics older than this (default 600)",
    )
    prune.add_argument("--dry-run", action="store_true", help="list them, delete nothing")
