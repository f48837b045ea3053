"""``sentinel ui``: its parser (implementation: :mod:`sentinel.cli.ui`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import add_command, add_curator_option, add_metrics_option, count, port

#: The port ``sentinel ui`` serves on unless told.
DEFAULT_PORT = 8470


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``ui``."""
    ui = add_command(
        commands,
        "ui",
        "ui:_run",
        "a web dashboard of the registry, live: services, instances, topology, doctor",
        "Serve a read-only web dashboard on http://ADDRESS:PORT/ from this command's own "
        "client cache, which follows every service: services (instances up of total, by "
        "health; partitions; failover; followers; filter to failing), each service's "
        "instances with their status, health, metrics and why one is not eligible (the words "
        "of `sentinel resolve`), the topology of who follows what (`sentinel deps`; drawn "
        "with Graphviz's dot when installed), regions, credential rotations, shard maps, the "
        "processes of each host, and `sentinel doctor`'s findings. Pages update live "
        "(server-sent events from one subscription to the cache; no reads of ZooKeeper per "
        "viewer). Everything is read as this command's identity ($SENTINEL_ZK_IDENTITY, or "
        "the --region's): what it may not read is not shown. Nothing secret is rendered. "
        "Served on loopback unless --address names another address; a request whose Host "
        "is not that address (or an --allow-host name) is refused. Drain and undrain are "
        "offered only with --allow-actions, from the dashboard's own pages, with a per-session "
        "token, and ZooKeeper's ACLs decide whether the identity may write. Needs the ui "
        "extra. Prints 'serving URL' once listening (--json: a JSON line); runs until SIGINT "
        "or SIGTERM. Exit 4 when the port is taken, 3 when ZooKeeper is unreachable.",
        (
            "sentinel ui                                  # http://127.0.0.1:8470/",
            "sentinel ui --port 9000 --namespace /staging",
            "sentinel ui --address 10.0.0.5 --allow-host ops.example.com",
            "sentinel ui --allow-actions   # as $SENTINEL_ZK_IDENTITY, which may drain",
        ),
    )
    add_ui_options(ui, prefix="")
    ui.add_argument(
        "--allow-actions",
        action="store_true",
        help="offer drain and undrain on instances (as this command's identity; default: "
        "read-only)",
    )
    add_curator_option(ui)
    add_metrics_option(ui)


def add_ui_options(parser: argparse.ArgumentParser, prefix: str) -> None:
    """The dashboard's listening options (``prefix``: ``"ui-"`` for the agent's)."""
    if prefix:
        parser.add_argument(
            "--ui",
            type=port,
            metavar="PORT",
            help="also serve the read-only web dashboard (`sentinel ui`) of the agent's cache "
            "on http://127.0.0.1:PORT/ (needs the ui extra; docs/dashboard.md)",
        )
    else:
        parser.add_argument(
            "--port",
            type=port,
            default=DEFAULT_PORT,
            help="port to serve on (0: any free port; default %(default)s)",
        )
    parser.add_argument(
        f"--{prefix}address",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="IP address to serve the dashboard on (default %(default)s: this host only); "
        "another address only when named",
    )
    parser.add_argument(
        f"--{prefix}allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name browsers reach the dashboard by, besides its address (the Host "
        "header is checked against DNS rebinding); repeat",
    )
    parser.add_argument(
        f"--{prefix}max-streams",
        type=count,
        default=256,
        metavar="N",
        help="live streams (open pages) served at once; more are refused (default %(default)s)",
    )
