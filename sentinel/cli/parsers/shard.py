"""``sentinel shard``: its parsers (implementation: :mod:`sentinel.cli.shard`)."""

from __future__ import annotations

import argparse
from typing import Any

from sentinel.cli.options import add_command, add_metrics_option, add_parser, seconds

IMPORT_BATCH = 5_000
SHARD_KEY_HELP = "a shard key (tenant, customer id...): an integer for a --key-type int policy"


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``shard`` and its actions."""
    shard = add_parser(
        commands,
        "shard",
        "manage shard policies: which partition holds which key",
        "Supervised changes to /shard_info. Writes take --dry-run; reads take "
        "--json. Exit 1 when a key or policy is not found, 2 on bad input (unknown kind, "
        "malformed CSV line, partition outside the policy's declared set). A shard policy "
        "(--policy NAME) maps the keys of the services that use it to their partitions. With "
        "regions configured (--regions), changes are written to every region, one line each, "
        "unless --region names one; exit 3 when a region was unreachable (the others were "
        "written: run the command again once it is back).",
        (
            "sentinel shard create-policy tenants --kind directory --partitions p1,p2",
            "sentinel shard assign acme p1 --policy tenants",
            "sentinel shard show acme --policy tenants",
            "sentinel shard ACTION --help            # each action's options and examples",
        ),
    )
    actions = shard.add_subparsers(dest="shard_command", required=True, metavar="ACTION")

    def action(
        name: str,
        handler: Any,
        summary: str,
        examples: tuple[str, ...],
        *,
        policy: bool = True,
        dry_run: bool = False,
    ) -> argparse.ArgumentParser:
        parser = add_command(actions, name, handler, summary, summary, examples)
        parser.set_defaults(command_name=name)
        if policy:
            parser.add_argument(
                "--policy",
                required=True,
                metavar="NAME",
                help="the shard policy's name, as created by create-policy (`sentinel ls` shows "
                "each service's)",
            )
        if dry_run:  # a change: written to every region, as --region all says
            parser.add_argument("--dry-run", action="store_true", help="change nothing")
            parser.set_defaults(all_regions=True)
        return parser

    create = action(
        "create-policy",
        "shard:_create",
        "create a directory, range or hash policy",
        (
            "sentinel shard create-policy tenants --kind directory --partitions p1,p2,p3",
            "sentinel shard create-policy ids --kind range --key-type int "
            "--boundaries 0:p1,1000:p2",
            "sentinel shard create-policy users --kind hash --partitions p1,p2 --dry-run",
        ),
        policy=False,
        dry_run=True,
    )
    create.add_argument("policy_name", metavar="NAME", help="the new shard policy's name")
    create.add_argument("--kind", choices=("directory", "range", "hash"), required=True)
    create.add_argument("--partitions", help="declared partitions, comma-separated")
    create.add_argument("--boundaries", help="range: LOWER:PARTITION,... in increasing order")
    create.add_argument("--key-type", choices=("str", "int"), default="str")
    create.add_argument("--buckets", type=int, default=256, help="directory buckets")
    for name, summary in (
        ("assign", "assign a key to a partition"),
        ("move", "move a key, showing the instances before and after"),
    ):
        parser = action(
            name,
            "shard:_assign",
            summary,
            (f"sentinel shard {name} acme p2 --policy tenants",),
            dry_run=True,
        )
        parser.add_argument("key", metavar="KEY", help=SHARD_KEY_HELP)
        parser.add_argument(
            "partition", metavar="PARTITION", help="one of the policy's declared partitions"
        )
    remove = action(
        "remove",
        "shard:_remove",
        "remove a key (exit 1 if it was not assigned)",
        ("sentinel shard remove acme --policy tenants --dry-run",),
        dry_run=True,
    )
    remove.add_argument("key", metavar="KEY", help=SHARD_KEY_HELP)
    show = action(
        "show",
        "shard:_show",
        "where a key goes and who serves it (exit 1 if nowhere)",
        ("sentinel shard show acme --policy tenants", "sentinel shard show 42 --policy ids --json"),
    )
    show.add_argument("key", metavar="KEY", help=SHARD_KEY_HELP)
    listing = action(
        "list",
        "shard:_list",
        "every key of a directory policy",
        (
            "sentinel shard list --policy tenants",
            "sentinel shard list --policy tenants --partition p1",
        ),
    )
    listing.add_argument("--partition", help="only the keys of this partition")
    action(
        "stats",
        "shard:_stats",
        "keys per partition, and partitions without a live instance",
        ("sentinel shard stats --policy tenants",),
    )
    action(
        "validate",
        "shard:_validate",
        "check that every partition in use has a live instance of each service using it",
        ("sentinel shard validate --policy tenants",),
    )
    imp = action(
        "import",
        "shard:_import",
        "assign keys from CSV or JSON (idempotent, resumable)",
        (
            "sentinel shard import keys.csv --policy tenants --dry-run",
            "sentinel shard import - --policy tenants < keys.json",
        ),
        dry_run=True,
    )
    imp.add_argument("file", metavar="FILE", help="CSV (key,partition) or JSON; - for stdin")
    imp.add_argument(
        "--batch",
        type=int,
        default=IMPORT_BATCH,
        help=f"keys committed together (default {IMPORT_BATCH})",
    )
    exp = action(
        "export",
        "shard:_export",
        "write every key as CSV or JSON",
        (
            "sentinel shard export keys.csv --policy tenants",
            "sentinel shard export - --policy tenants --format json",
        ),
    )
    exp.add_argument("file", metavar="FILE", help="output file (.json for JSON); - for stdout")
    exp.add_argument("--format", choices=("csv", "json"))
    sync = action(
        "sync",
        "shard:_sync",
        "copy one region's map over the other regions' (repairs a lagging or tampered one)",
        (
            "sentinel shard sync --policy tenants --from east --dry-run",
            "sentinel shard sync --policy tenants --from east --region west",
        ),
        dry_run=True,
    )
    sync.add_argument(
        "--from",
        dest="from_region",
        required=True,
        metavar="REGION",
        help="the region whose map is copied (refused unless its buckets add up to its digest); "
        "to every other region, or the one --region names",
    )
    serve = action(
        "serve",
        "shard:_serve",
        "run a shard manager replica: the leader places "
        "requested keys (least keys first) and alerts on empty partitions",
        (
            "sentinel shard serve --policy tenants",
            "sentinel shard serve --policy tenants --metrics-port 9464 --json",
        ),
    )
    serve.add_argument(
        "--session-timeout",
        type=seconds,
        default=10.0,
        help="seconds before a dead replica's leadership passes on",
    )
    add_metrics_option(serve)
