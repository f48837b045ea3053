"""``sentinel deps``: who uses what, live, and what breaks when a service goes down."""

from __future__ import annotations

import argparse

from sentinel.cli.common import (
    connect,
    print_json,
)
from sentinel.cli.options import (
    EXIT_NOT_FOUND,
    EXIT_OK,
)
from sentinel.registry.dependencies import DependencyGraph
from sentinel.registry.reads import read_clients


def _deps(args: argparse.Namespace) -> int:
    with connect(args) as zk:
        graph = DependencyGraph.from_clients(read_clients(zk))
    for name in filter(None, (args.service, args.impact)):
        if name not in graph.nodes:
            print(f"{name!r} neither uses nor is used by anything registered under /clients")
            return EXIT_NOT_FOUND
    cycles = graph.cycles()
    impact = graph.impact(args.impact) if args.impact else None
    if args.format == "json" or args.json:
        print_json(
            {
                "nodes": graph.nodes,
                "edges": [
                    {"from": a, "to": b, "clients": list(c)}
                    for a, to in graph.edges.items()
                    for b, c in to.items()
                ],
                "cycles": cycles,
                **(
                    {"impact": {"service": args.impact, "dependents": impact}}
                    if args.impact
                    else {}
                ),
            }
        )
        return EXIT_OK
    if args.format == "dot":
        print(graph.dot())
        return EXIT_OK
    for root in [args.service] if args.service else graph.roots():
        print("\n".join(graph.tree(root)))
    for cycle in cycles:
        print(f"cycle: {' <-> '.join(cycle)}")
    if impact is not None:
        print(
            f"if {args.impact} goes down, {len(impact)} depend on it: "
            + (", ".join(impact) or "nothing")
        )
    return EXIT_OK
