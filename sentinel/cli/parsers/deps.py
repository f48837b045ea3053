"""``sentinel deps``: its parser (implementation: :mod:`sentinel.cli.deps`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import SERVICE_HELP, add_command


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``deps``."""
    deps = add_command(
        commands,
        "deps",
        "deps:_deps",
        "the live dependency graph from /clients",
        "Who uses which service, from the clients registered under /clients "
        "(an app is Sentinel(app=...), else the client id). Tree (default) from SERVICE or "
        "from every root; DOT for Graphviz (edges on a cycle are red); JSON. --impact "
        "SERVICE lists everything that depends on SERVICE, directly or not. Cycles are "
        "flagged in every format. --json is --format json.",
        (
            "sentinel deps",
            "sentinel deps api",
            "sentinel deps --impact orders-db        # who breaks if orders-db goes down",
            "sentinel deps --format dot | dot -Tsvg > deps.svg",
        ),
    )
    deps.add_argument(
        "service",
        nargs="?",
        metavar="SERVICE",
        help=f"{SERVICE_HELP}: the tree from it; default: from every root",
    )
    deps.add_argument(
        "--format", choices=("tree", "dot", "json"), default="tree", help="default tree"
    )
    deps.add_argument(
        "--impact", metavar="SERVICE", help="list what depends on SERVICE, directly or not"
    )
