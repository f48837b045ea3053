"""``sentinel register``: its parser (implementation: :mod:`sentinel.cli.publish`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import SERVICE_HELP, add_command, add_metrics_option, count, seconds


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``register``."""
    parser = add_command(
        commands,
        "register",
        "publish:_register",
        "register one instance and hold it until interrupted (a publisher sidecar)",
        "Register one instance of SERVICE and keep it registered (across session expiries) "
        "until SIGINT or SIGTERM, then deregister it: the publisher of a program that does "
        "not embed the library. With --check-http, --check-tcp or --check-grpc its status "
        "follows a readiness check (published starting, then up or down, damped: "
        "--failures-before-down failures in a row take it down, --successes-before-up passes "
        "bring it back; "
        "docs/health.md). Prints one line when registered (--json: JSON); status changes are "
        "logged (-v).",
        (
            "sentinel register web main 10.0.0.5 8080 --check-http /ready",
            "sentinel register orders-db p1 10.0.0.7 5432 --scheme postgresql --check-tcp",
            "sentinel register api main 10.0.0.5 8080 --check-http /healthz --check-interval 2",
            "sentinel register orders main 10.0.0.5 50051 --check-grpc orders.Orders",
        ),
    )
    parser.add_argument("service", metavar="SERVICE", help=SERVICE_HELP)
    parser.add_argument("partition", metavar="PARTITION", help="the partition it serves")
    parser.add_argument("host", metavar="HOST", help="its IP address or DNS name")
    parser.add_argument("port", metavar="PORT", type=int, help="its port")
    parser.add_argument("--label", help="its name within the partition (default HOST_PORT)")
    parser.add_argument("--scheme", help="its scheme (default: the service's, else http)")
    parser.add_argument("--weight", type=float, default=1.0, help="its weight (default 1)")
    parser.add_argument("--zone", help="its zone")
    check = parser.add_mutually_exclusive_group()
    check.add_argument(
        "--check-http",
        metavar="URL",
        help="readiness check: GET this path of the instance (/ready) or this http(s):// URL; "
        "2xx passes",
    )
    check.add_argument(
        "--check-tcp",
        metavar="PORT",
        nargs="?",
        type=int,
        const=0,
        help="readiness check: a TCP connection to PORT (default: the instance's port) opens",
    )
    check.add_argument(
        "--check-grpc",
        metavar="SERVICE",
        nargs="?",
        const="",
        help="readiness check: the instance's standard gRPC health service answers SERVING "
        "for SERVICE (default: the server as a whole); needs the grpc extra",
    )
    parser.add_argument(
        "--check-interval", type=seconds, default=5.0, help="seconds between checks (default 5)"
    )
    parser.add_argument(
        "--check-timeout", type=seconds, default=2.0, help="seconds a check may take (default 2)"
    )
    parser.add_argument(
        "--failures-before-down", type=count, default=3, help="failures in a row (default 3)"
    )
    parser.add_argument(
        "--successes-before-up", type=count, default=2, help="passes in a row (default 2)"
    )
    parser.add_argument(
        "--session-timeout",
        type=seconds,
        default=10.0,
        help="seconds before ZooKeeper removes the instance of a process that died (default 10)",
    )
    add_metrics_option(parser)
