"""``sentinel failover``: its parser (implementation: :mod:`sentinel.cli.failover`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import SERVICE_HELP, add_command


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``failover``."""
    parser = add_command(
        commands,
        "failover",
        "failover:_set_failover",
        "change where a service's lookups go when its region has none (its failover rule)",
        "Set the failover rule of an existing SERVICE in the region acted in (--region, "
        "default $SENTINEL_REGION; each region's spec holds the rule its own clients follow): "
        "only the spec's failover field is rewritten, conditionally on the version read, so a "
        "concurrent change of the spec is read again, never lost. Running clients follow the "
        "new rule without a restart: lookups use it at once, a warm rule's regions are "
        "followed, a region no rule names any more is let go (docs/regions.md, 'Changing a "
        "rule'). RULE 'local' removes the rule (the region's instances only). Prints the old "
        "and the new rule (--json: JSON). Exit 1: no such service, or the spec kept changing "
        "(run it again); 2: a RULE that is not one; 3: ZooKeeper unreachable.",
        (
            "sentinel failover orders west,north",
            "sentinel failover orders 'nearest:2;warm;return_after=30' --region east",
            "sentinel failover orders 'nearest:1;service=orders-ro'",
            "sentinel failover orders local          # back to this region only",
        ),
    )
    parser.add_argument("service", metavar="SERVICE", help=SERVICE_HELP)
    parser.add_argument(
        "rule",
        metavar="RULE",
        help="local, REGION,REGION... or nearest:N[,REGION...], options after ';': "
        "service=NAME, warm, cold, return_after=SECONDS",
    )
