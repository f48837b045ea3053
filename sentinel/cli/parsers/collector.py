"""``sentinel collector``: its parsers (implementation: :mod:`sentinel.cli.collector`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import Handler, add_command, add_metrics_option, add_parser, seconds


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``collector`` and its actions."""
    collector = add_parser(
        commands,
        "collector",
        "the metric collector sidecar: publish instances' metrics into /metrics",
        "Collect each live instance's run-time metrics (Prometheus endpoint, "
        "PostgreSQL replica lag, a command, or a Python plug-in) and publish them for the "
        "selection policies. Collectors with the same cluster share the instances. Exit 2 on "
        "a bad configuration (nothing is published), 3 when ZooKeeper is unreachable.",
        (
            "sentinel collector check --config collector.toml",
            "sentinel collector run --config collector.toml",
        ),
    )
    actions = collector.add_subparsers(dest="collector_command", required=True, metavar="ACTION")
    run = add_command(
        actions,
        "run",
        "collector:_run",
        "collect and publish until interrupted",
        "Collect and publish until SIGINT or SIGTERM. Prints one line per event: "
        "'assigned' (instances owned), 'refused' (this member's configuration is not its "
        "cluster's: it takes no work), 'failing', 'recovered' (--json: JSON lines).",
        (
            "sentinel collector run --config collector.toml",
            "sentinel collector run --config collector.yaml --metrics-port 9465 --json",
        ),
    )
    run.add_argument("--config", required=True, metavar="FILE", help=".toml, .yaml or .yml")
    run.add_argument(
        "--session-timeout",
        type=seconds,
        default=10.0,
        help="seconds before a dead collector's instances pass to the others (default 10)",
    )
    run.add_argument("--client-id", help="this member's name (default collector-CLUSTER-HOST-PID)")
    add_metrics_option(run)
    check = add_parser(
        actions,
        "check",
        "validate a configuration file",
        "Validate a configuration and print what it collects; exit 2 if invalid.",
        (
            "sentinel collector check --config collector.toml",
            "sentinel collector check --config c.yaml --json",
        ),
    )
    check.add_argument("--config", required=True, metavar="FILE", help=".toml, .yaml or .yml")
    check.add_argument("--json", action="store_true", help="print JSON for scripts")
    check.set_defaults(handler=Handler("collector:_check"))
