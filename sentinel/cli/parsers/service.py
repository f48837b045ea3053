"""``sentinel service``: its parsers (implementation: :mod:`sentinel.cli.service`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import SERVICE_HELP, add_command, add_parser


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``service`` and its actions."""
    service = add_parser(
        commands,
        "service",
        "manage services as a whole (retire one nothing uses any more)",
        "Changes to a service as a whole, in the region acted in (--region, default "
        "$SENTINEL_REGION).",
        ("sentinel service retire orders-old",),
    )
    actions = service.add_subparsers(dest="service_command", required=True, metavar="ACTION")
    retire = add_command(
        actions,
        "retire",
        "service:_retire",
        "remove a service that has no instance: its spec, metrics, followers and credentials",
        "Delete SERVICE's spec and everything kept under its name (/services, /metrics, "
        "/clients, /auth) in one ZooKeeper transaction: all of it, or nothing when anything "
        "changed meanwhile. Refused while instances are registered or clients follow it "
        "(`sentinel ls SERVICE`, `sentinel doctor` shows an empty service), unless --force; a "
        "publisher still running registers the service again. Prints what was removed "
        "(--json: JSON). Exit 1: no such service, instances or followers remain (without "
        "--force), or it changed meanwhile (run it again); 2: a bad name, or more nodes than "
        "one transaction carries (prune its metrics first); 3: ZooKeeper unreachable.",
        (
            "sentinel service retire orders-old",
            "sentinel service retire orders-old --force   # instances or followers remain",
        ),
    )
    retire.add_argument("service", metavar="SERVICE", help=SERVICE_HELP)
    retire.add_argument(
        "--force",
        action="store_true",
        help="retire it even while instances are registered or clients follow it",
    )
