"""``sentinel collector ...``: the metric collector sidecar."""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from sentinel.cli.common import (
    event_printer,
    print_json,
    print_table,
    run_daemon,
)
from sentinel.cli.options import (
    EXIT_OK,
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
