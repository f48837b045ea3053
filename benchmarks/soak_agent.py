"""The soak's host agent, a process of its own: ``python -m benchmarks.soak_agent --worker``.

What ``sentinel agent --xds`` runs (its session, :class:`~sentinel.agent.server.AgentServer`
and :class:`~sentinel.agent.xds.XdsServer`), plus what only a process of its own can say
about itself, one JSON line per command line of its input: ``{"op": "sample"}``, its RSS,
threads, descriptors, the interpreter's heap and the length of every table reachable from
the agent server and the xDS server (:func:`benchmarks.soak.tables`); ``{"op": "census"}``,
its objects by type (and allocations by line with ``--tracemalloc``). It ends when its input
ends.
"""

from __future__ import annotations

import argparse
import json
import sys
import tracemalloc

from benchmarks.soak import census, heap_figures, label_sets, process_figures, tables
from sentinel import Sentinel
from sentinel.agent.regions import AGENT_SESSION
from sentinel.agent.server import AgentServer
from sentinel.agent.xds import XdsServer


def serve(hosts: str, namespace: str, socket_path: str, xds_address: str) -> None:
    with (
        Sentinel(
            hosts, "soak-agent", namespace, prometheus_registry=None, **AGENT_SESSION
        ) as sentinel,
        AgentServer(sentinel, socket_path) as server,
        XdsServer(sentinel, xds_address) as xds,
    ):
        print(json.dumps({"session": sentinel.session_id}), flush=True)
        for line in sys.stdin:
            op = json.loads(line)["op"]
            if op == "sample":
                answer = {**process_figures(), **heap_figures()}
                answer.update(tables({"agent": server, "xds": xds}))
                answer.update(label_sets())
            elif op == "census":
                answer = census()
            else:
                break
            print(json.dumps(answer), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("hosts")
    parser.add_argument("namespace")
    parser.add_argument("socket")
    parser.add_argument("xds")
    parser.add_argument("--tracemalloc", action="store_true", help="census by source line")
    args = parser.parse_args(argv)
    if args.tracemalloc:
        tracemalloc.start()
    serve(args.hosts, args.namespace, args.socket, args.xds)


if __name__ == "__main__":
    main()
