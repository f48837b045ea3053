"""``sentinel collector ...``: the metric collector sidecar."""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from sentinel.cli.common import (
    EXIT_OK,
    add_command,
    add_metrics_option,
    add_parser,
    event_printer,
    print_json,
    print_table,
    run_daemon,
    seconds,
)
from sentinel.collector.config import CollectorConfig, load_config


def _describe(config: CollectorConfig) -> list[dict[str, Any]]:
    return [
        {
            "service": s.service,
            "source": s.source.type,
            "interval": s.interval,
            "jitter": s.jitter,
            "timeout": s.timeout,
            "partitions": None if s.partitions is None else sorted(s.partitions),
        }
        for s in config.services
    ]


def _check(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    services = _describe(config)
    if args.json:
        print_json({"cluster": config.cluster, "workers": config.workers, "services": services})
    else:
        print(f"{args.config}: valid; cluster {config.cluster}, {config.workers} workers")
        print_table(
            [
                (
                    s["service"],
                    s["source"],
                    f"{s['interval']:g}s",
                    f"±{s['jitter']:g}s",
                    f"{s['timeout']:g}s",
                    ",".join(s["partitions"] or ["(all)"]),
                )
                for s in services
            ],
            ("SERVICE", "SOURCE", "INTERVAL", "JITTER", "TIMEOUT", "PARTITIONS"),
        )
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from sentinel.collector.runner import MetricCollector
    from sentinel.registry.layout import sanitize_name

    config = load_config(args.config)  # before connecting: a bad file publishes nothing

    def assigned(details: dict[str, Any]) -> str:
        owned = " ".join(f"{s}={n}" for s, n in details["instances"].items())
        return f"assigned members={details['members']} {owned}"

    def refused(details: dict[str, Any]) -> str:
        return (
            f"refused cluster={details['cluster']} config={details['config']} "
            f"cluster_config={details['cluster_config']} members={details['members']}"
        )

    report = event_printer(args, {"assigned": assigned, "refused": refused})
    client_id = args.client_id or sanitize_name(
        f"collector-{config.cluster}-{socket.gethostname()}-{os.getpid()}"
    )
    return run_daemon(args, client_id, lambda sentinel: MetricCollector(sentinel, config, report))


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
        _run,
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
    check.set_defaults(handler=_check)
