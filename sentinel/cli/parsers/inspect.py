"""``sentinel ls`` and ``sentinel resolve``: their parsers
(implementation: :mod:`sentinel.cli.inspect`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import (
    KEY_HELP,
    SERVICE_HELP,
    add_command,
    add_curator_option,
    count,
    plugin_help,
)
from sentinel.plugins import BALANCERS, POLICIES


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``ls`` and ``resolve``."""
    ls = add_command(
        commands,
        "ls",
        "inspect:_ls",
        "list services, or the instances of one",
        "Without SERVICE: every service with its instance counts per partition "
        "and how many are up. With SERVICE: its instances with partition, label, address, "
        "zone, weight, status, age, last metrics and their age. Reads ZooKeeper directly.",
        (
            "sentinel ls",
            "sentinel ls orders-db",
            "sentinel ls orders-db --json | jq '.[].uri'",
            "sentinel ls --curator-path /services   # and a Curator registry's services",
        ),
    )
    ls.add_argument("service", nargs="?", metavar="SERVICE", help=f"{SERVICE_HELP}; default: all")
    add_curator_option(ls)

    resolve = add_command(
        commands,
        "resolve",
        "inspect:_resolve",
        "show what get_service returns, and why",
        "Resolve SERVICE (and KEY, for a sharded service) as a client would: the "
        "partition, each instance and the filter that excluded it, and the picks of COUNT "
        "calls. Policies and balancers are named as registered in the sentinel.policies and "
        "sentinel.balancers entry points, with arguments: --policy min_lag:cutoff=5. Several "
        "--policy options chain. Exit 1 when nothing is eligible.",
        (
            "sentinel resolve api",
            "sentinel resolve orders-db acme --policy min_lag:cutoff=5 -n 4",
            "sentinel resolve orders-db acme --policy zone_affinity:zone=z-a "
            "--policy min_lag:cutoff=5",
            "sentinel resolve api --balancer weighted_random -n 10 --json",
            "sentinel resolve orders --curator-path /services   # a Spring Boot service",
            "sentinel resolve orders-db acme --region east --regions regions.json "
            "--failover nearest:1",
        ),
    )
    resolve.add_argument("service", metavar="SERVICE", help=SERVICE_HELP)
    resolve.add_argument("key", nargs="?", metavar="KEY", help=KEY_HELP)
    resolve.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="NAME[:ARGS]",
        help=plugin_help(
            POLICIES,
            "a selection policy, filtering the instances (repeat to chain)",
            "min_lag:cutoff=5",
        ),
    )
    resolve.add_argument(
        "--balancer",
        metavar="NAME[:ARGS]",
        help=plugin_help(
            BALANCERS,
            "the balancer picking among the eligible (default round_robin)",
            "sticky:key=web-1",
        ),
    )
    resolve.add_argument("-n", "--count", type=count, default=1, help="calls to make (default 1)")
    resolve.add_argument(
        "--failover",
        metavar="RULE",
        help="override the service's failover rule for these calls: local, REGION,REGION... "
        "or nearest:N (options after ';': service=NAME, warm, return_after=SECONDS); "
        "needs --regions",
    )
    add_curator_option(resolve)
