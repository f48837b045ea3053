"""Failing over to another region through the host agent, measured:
``python -m benchmarks.agent_regions``.

Two ZooKeepers on this machine: the processes' region (east, where ``orders`` has no
instance) and west (one instance), reached through the project's relay with ``--delay``
seconds each way. Each run, ``--processes`` clients (packed in this OS process, as
``benchmarks.fanout`` packs a host's processes) fail over to west one after the other, either
each on a session of its own (``own``, what agent mode did before the agent held other
regions) or through one agent configured with west (``agent``); the two modes alternate run
by run, each run with new clients (and a new agent). Reported per mode: the time of each
process's first lookup (the failover, cold: a session to west, or for the agent's processes
a connection to the agent and, for the first of them, the agent's session to west; then the
service's load), the first process apart from the others; and the sessions west's server
holds for them at the end of the run (``cons``).
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from benchmarks.common import percentiles, report
from sentinel import Sentinel
from sentinel.agent.regions import RegionServers
from sentinel.agent.server import AgentServer
from sentinel.regions import Failover, Region, Regions
from sentinel.testing.helpers import TcpProxy
from sentinel.testing.zookeeper import LocalZooKeeper, four_letter_word

NAMESPACE = "/bench-agent-regions"
WEST = "10.0.2.1"
MODES = ("own", "agent")


def sessions(zk: LocalZooKeeper) -> set[str]:
    """The session ids the server's client connections hold (``cons``)."""
    host, port = zk.connect_string.split(":")
    return set(re.findall(r"sid=(0x[0-9a-f]+)", four_letter_word(host, int(port), "cons")))


@contextmanager
def agent(regions: Regions, path: str) -> Iterator[AgentServer]:
    """An agent serving east, configured with west, as ``sentinel agent --regions`` is."""

    home = regions.regions[regions.local]
    with Sentinel(
        home.hosts,
        "bench-agent",
        NAMESPACE,
        announce=False,
        agent=False,
        regions=False,
        prometheus_registry=None,
    ) as sentinel:
        servers = RegionServers(regions, client_id="bench-agent")
        with AgentServer(sentinel, path, regions=servers) as server:
            yield server


def run(
    mode: str, regions: Regions, west: LocalZooKeeper, processes: int, index: int
) -> tuple[list[float], int]:
    """Each process's first lookup (seconds), one process after the other, and the sessions
    west holds for them (the agent's, or the processes' own) once all have failed over."""
    before = sessions(west)
    with ExitStack() as stack:
        path = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "agent.sock")
        if mode == "agent":
            stack.enter_context(agent(regions, path))
        times = []
        for number in range(processes):
            client = stack.enter_context(
                Sentinel(
                    client_id=f"bench-{mode}-{index}-{number}",
                    namespace=NAMESPACE,
                    regions=regions,
                    agent=path if mode == "agent" else False,
                    prometheus_registry=None,
                )
            )
            started = time.perf_counter()
            endpoint = client.get_service("orders")
            times.append(time.perf_counter() - started)
            assert endpoint.host == WEST
        held = len(sessions(west) - before)
    return times, held


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per mode, alternated")
    parser.add_argument("--processes", type=int, default=10, help="processes per run")
    parser.add_argument("--delay", type=float, default=0.005, help="relay delay each way, s")
    args = parser.parse_args(argv)

    rule = Failover(regions=("west",))
    with LocalZooKeeper() as east_zk, LocalZooKeeper() as west_zk:
        link = TcpProxy("127.0.0.1", int(west_zk.connect_string.split(":")[1]), delay=args.delay)
        regions = Regions(
            "east",
            [
                Region("east", east_zk.connect_string, namespace=NAMESPACE),
                Region("west", link.address, namespace=NAMESPACE),
            ],
        )
        results: dict[str, dict[str, list[float]]] = {
            mode: {"first": [], "later": [], "sessions": []} for mode in MODES
        }
        with (
            Sentinel(east_zk.connect_string, "east-pub", NAMESPACE, regions=False) as east,
            Sentinel(west_zk.connect_string, "west-pub", NAMESPACE, regions=False) as west,
        ):
            for publisher in (east, west):
                publisher.ensure_service("orders", failover=rule)
            west.register("orders", "p0", WEST, 8080, label="away")
            for index in range(args.runs):
                for mode in MODES if index % 2 == 0 else MODES[::-1]:
                    times, held = run(mode, regions, west_zk, args.processes, index)
                    results[mode]["first"].append(times[0])
                    results[mode]["later"].extend(times[1:])
                    results[mode]["sessions"].append(held)
        link.close()

    rows = []
    for mode, figures in results.items():
        first, later = percentiles(figures["first"]), percentiles(figures["later"])
        held = sorted(figures["sessions"])
        rows.append(
            (
                mode,
                f"{first['p50'] * 1000:.1f}",
                f"{first['p99'] * 1000:.1f}",
                f"{later['p50'] * 1000:.1f}",
                f"{later['p99'] * 1000:.1f}",
                f"{held[0]}-{held[-1]}",
            )
        )
    report(
        "agent_regions",
        f"{args.processes} processes failing over to west one after another, {args.runs} runs "
        f"per mode alternated, relay delay {args.delay * 1000:g} ms each way: each process's "
        "first lookup (ms), and the sessions west's server holds for them",
        ("mode", "first p50", "first p99", "later p50", "later p99", "sessions on west"),
        rows,
        {"results": results, "delay": args.delay, "processes": args.processes},
    )


if __name__ == "__main__":
    main()
