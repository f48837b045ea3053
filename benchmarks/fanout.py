"""A change reaching a fleet's processes, measured: ``python -m benchmarks.fanout``.

``--agents`` hosts (5; the issue's size is 50), each a ``sentinel agent`` server on this
machine with a Unix socket of its own, standing in for a host's agent, and ``--per-agent``
processes on each (4; the issue's size is 20), all following one service of ``--instances``
instances (10). Each round makes three changes, one at a time, each heard by every process
before the next is made: a registration (a new instance), a metric change (of an instance
already there) and the deregistration of the instance registered; ``--changes`` rounds. Modes,
one after the other on one ZooKeeper (``--modes``; with ``--runs`` above 1 their order
alternates from run to run):

* ``single``: one process with a ZooKeeper session of its own (the figure a fleet's is held to);
* ``agent``: every process through its host's agent (one ZooKeeper session per host);
* ``direct``: every process with a ZooKeeper session of its own, ``--direct-processes`` of
  them (default: as many as in ``agent``), packed into OS processes as in ``agent``.

What stands in for what (the machine has 2 cores and 24 GiB shared; a thousand full Python
processes of about 40 MB each do not fit):

* a **process** is one :class:`~sentinel.Sentinel` client, the whole client a process holds
  (its cache, its worker, its listeners; through an agent its
  :class:`~sentinel.agentlink.link.AgentLink` and :class:`~sentinel.cache.agent.AgentFollower`,
  directly its own kazoo session), not a re-implementation of any part of it;
* **packing**: ``--per-os-process`` clients (20) share one OS process (a Python interpreter,
  so one GIL); a host's clients are never packed with another host's (:func:`pack`);
* a **host** is an agent server process, and every agent, client and the ZooKeeper server
  share this machine's cores: the network between hosts is loopback, and the time a change
  takes to reach the last process includes waiting for a core, as it does not on 50 hosts.

The clock: ``time.monotonic()`` (``CLOCK_MONOTONIC``, one clock for every process of a Linux
machine) just before the writer's call, and again in each client's listener when the change
reaches its cache (the listener runs on the client's worker, right after the new snapshot is
swapped in). The same worker code, packing and clock for every mode; only ``agent=`` differs.

Per change: p50 and p99 over the processes, and the last process's (the slowest). Per mode
and kind, over the changes: the median of those p50s and p99s, and the last process's
median, p99 and worst over the changes (:func:`summarize`); the reads ZooKeeper served per
change (``mntr``, as :mod:`benchmarks.zkcost` counts them); the server's sessions and
watches; the CPU seconds (``/proc``) of the ZooKeeper server, of the agents together and of
the clients' OS processes together, from each write to the last process hearing it, per
change, and the cores each group uses with nothing changing (over :data:`IDLE_SECONDS`); the
resident memory of the agents and of the clients' OS processes; the 1-minute load average
before the mode starts, when its changes begin and after. Every change's figures go to
``benchmarks/results/fanout.json``.

    python -m benchmarks.fanout                                  # 20 processes, about a minute
    python -m benchmarks.fanout --agents 50 --per-agent 20       # 1,000 processes, 8 minutes
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack

from benchmarks.agent import (
    LOAD_TIMEOUT,
    NAMESPACE,
    ask,
    cpu_seconds,
    rss_mib,
    serving,
    start_agent,
    start_worker,
)
from benchmarks.churn import populate
from benchmarks.common import percentiles, report
from benchmarks.zkcost import mntr, quiet, watches
from sentinel import Sentinel
from sentinel.events import InstancesChanged, MetricsChanged
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper

SERVICE = "fanout"
MODES = ("single", "agent", "direct")
KINDS = ("registration", "metric change", "deregistration")
# Seconds over which the fleet's CPU is measured with nothing changing (pings, heartbeats).
IDLE_SECONDS = 3.0


def pack(
    hosts: int, per_host: int, per_os_process: int, total: int | None = None
) -> list[tuple[int, int]]:
    """The OS processes to start, as (host, clients it holds): each host's ``per_host``
    clients in OS processes of at most ``per_os_process``, never two hosts' in one; with
    ``total``, only the first ``total`` clients of that layout."""
    if min(hosts, per_host, per_os_process) < 1:
        raise ValueError("hosts, processes per host and per OS process must be at least 1")
    left = hosts * per_host if total is None else total
    layout = []
    for host in range(hosts):
        on_host = per_host
        while on_host and left:
            count = min(on_host, per_os_process, left)
            layout.append((host, count))
            on_host -= count
            left -= count
    return layout


def summarize(delays: Sequence[Sequence[float]]) -> dict:
    """Changes of one kind, each the delays of every process: per change its p50, p99
    (nearest-rank, :func:`~benchmarks.common.percentiles`) and last process (the slowest);
    over the changes, the median p50 and p99, the worst p99, and the last process's median,
    p99 and worst over the changes."""
    per_change = [percentiles(change) for change in delays]
    lasts = [c["max"] for c in per_change]
    return {
        "changes": len(per_change),
        "processes": per_change[0]["n"],
        "p50": statistics.median(c["p50"] for c in per_change),
        "p99": statistics.median(c["p99"] for c in per_change),
        "worst_p99": max(c["p99"] for c in per_change),
        "last": {
            "p50": statistics.median(lasts),
            "p99": percentiles(lasts)["p99"],
            "max": max(lasts),
        },
        "per_change": [{"p50": c["p50"], "p99": c["p99"], "last": c["max"]} for c in per_change],
    }


def worker(hosts: str, agent: str, count: int, service: str) -> None:
    """One OS process: ``count`` clients following ``service`` (through ``agent`` unless it is
    empty), answering the parent's commands (JSON lines) until ``stop``."""
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    heard: list[dict[tuple, float]] = []  # per client: (kind, token) -> when it heard it

    def listener_for(mine: dict[tuple, float]):
        def listener(event: object) -> None:
            now = time.monotonic()
            if isinstance(event, InstancesChanged):
                for endpoint in event.added:
                    mine.setdefault(("registration", endpoint.label), now)
                for endpoint in event.removed:
                    mine.setdefault(("deregistration", endpoint.label), now)
            elif isinstance(event, MetricsChanged):
                for _, new in event.updated:
                    mine.setdefault(("metric change", new.metrics.get("load")), now)

        return listener

    with ExitStack() as stack:
        for _ in range(count):
            client = stack.enter_context(
                Sentinel(
                    hosts,
                    f"fanout-{os.getpid()}-{len(heard)}",
                    NAMESPACE,
                    announce=False,
                    prometheus_registry=None,
                    agent=agent or False,
                    connect_timeout=LOAD_TIMEOUT,
                )
            )
            heard.append({})
            client.prefetch(service)
            client.listen(service, listener_for(heard[-1]))
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            command = json.loads(line)
            if command["cmd"] != "heard":
                break
            key = tuple(command["key"])
            wait_until(lambda key=key: all(key in mine for mine in heard), timeout=LOAD_TIMEOUT)
            print(json.dumps({"at": [mine.get(key) for mine in heard]}), flush=True)


def _cpu(groups: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds each group of processes has used so far."""
    return {group: sum(cpu_seconds(pid) for pid in pids) for group, pids in groups.items()}


def _change(writer: Sentinel, kind: str, token: int, registered: dict) -> tuple:
    """Make one change; the key the processes' listeners record it under."""
    label = f"fan{token}"
    if kind == "registration":
        registered[label] = writer.register(SERVICE, "p0", "10.9.9.9", 7000 + token, label=label)
        return kind, label
    if kind == "deregistration":
        writer.deregister(registered.pop(label))
        return kind, label
    writer.update_metrics(SERVICE, "p0", "r0", {"load": float(token)})
    return kind, float(token)


def measure(mode: str, zk: LocalZooKeeper, writer: Sentinel, args: argparse.Namespace) -> dict:
    """One mode's figures (see the module)."""
    zk_hosts = zk.connect_string
    host, port = zk_hosts.split(":")[0], int(zk_hosts.split(":")[1])
    if mode == "single":
        layout = pack(1, 1, 1)
    else:
        total = args.direct_processes if mode == "direct" else None
        layout = pack(args.agents, args.per_agent, args.per_os_process, total)
    row: dict = {
        "mode": mode,
        "processes": sum(count for _, count in layout),
        "os_processes": len(layout),
        "load_before": os.getloadavg(),
    }
    print(f"{mode}: starting {row['processes']} processes", file=sys.stderr, flush=True)
    with ExitStack() as stack:
        sockets, agents = {}, []
        if mode == "agent":
            directory = tempfile.mkdtemp(prefix="fanout-")
            stack.callback(shutil.rmtree, directory, True)
            for index in range(args.agents):
                sockets[index] = os.path.join(directory, f"agent-{index}.sock")
                agents.append(start_agent(stack, zk_hosts, sockets[index]))
            for agent in agents:
                serving(agent)
        started = time.monotonic()
        workers = [
            start_worker(
                stack, "benchmarks.fanout", zk_hosts, sockets.get(index, ""), str(count), SERVICE
            )
            for index, count in layout
        ]
        for process in workers:
            if not json.loads(process.stdout.readline() or "{}").get("ready"):
                raise RuntimeError(f"{mode}: an OS process of clients did not start")
        row["start_seconds"] = time.monotonic() - started
        quiet(host, port)
        row["sessions"] = int(mntr(host, port)["zk_global_sessions"])
        row["watches"] = watches(host, port)
        groups = {
            "zookeeper": [zk.members[0].pid],
            "agents": [a.pid for a in agents],
            "clients": [p.pid for p in workers],
        }
        idle_before, idle_started = _cpu(groups), time.monotonic()
        time.sleep(IDLE_SECONDS)  # the measured interval itself, not a synchronisation
        idle_seconds = time.monotonic() - idle_started
        row["idle_cores"] = {
            group: (spent - idle_before[group]) / idle_seconds
            for group, spent in _cpu(groups).items()
        }
        row["load_measuring"] = os.getloadavg()
        delays: dict[str, list[list[float]]] = {kind: [] for kind in KINDS}
        reads: dict[str, list[int]] = {kind: [] for kind in KINDS}
        # CPU seconds of each kind of change, from each write to the last process hearing it
        spent = {kind: dict.fromkeys(groups, 0.0) for kind in KINDS}
        registered: dict = {}
        for _ in range(args.changes):
            args.token += 1
            for kind in KINDS:
                before = quiet(host, port)
                cpu_before = _cpu(groups)
                written = time.monotonic()
                key = _change(writer, kind, args.token, registered)
                heard = [
                    at
                    for answer in ask(workers, {"cmd": "heard", "key": key})
                    for at in answer["at"]
                ]
                for group, seconds in _cpu(groups).items():
                    spent[kind][group] += seconds - cpu_before[group]
                if None in heard:
                    raise RuntimeError(
                        f"{mode}: {heard.count(None)} of {len(heard)} processes never heard "
                        f"the {kind} within {LOAD_TIMEOUT:g} s"
                    )
                delays[kind].append([at - written for at in heard])
                reads[kind].append((quiet(host, port) - before).reads)
        if agents:
            row["agents_rss_mib"] = sum(rss_mib(a.pid) for a in agents)
        row["clients_rss_mib"] = sum(rss_mib(p.pid) for p in workers)
        row["load_after"] = os.getloadavg()
        row["kinds"] = {
            kind: {
                **summarize(delays[kind]),
                "reads": statistics.median(reads[kind]),
                "cpu_ms": {g: t / args.changes * 1000 for g, t in spent[kind].items()},
            }
            for kind in KINDS
        }
    print(f"{mode}: measured", file=sys.stderr, flush=True)
    return row


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def table(rows: Sequence[dict]) -> list[tuple]:
    """The printed table: a row per run, mode and kind; p99 against the same run's single
    process's."""
    single = {
        (r["run"], kind): r["kinds"][kind]["p99"]
        for r in rows
        if r["mode"] == "single"
        for kind in KINDS
    }
    lines = []
    for r in rows:
        for kind in KINDS:
            k = r["kinds"][kind]
            one = single.get((r["run"], kind))
            lines.append(
                (
                    r["run"],
                    r["mode"],
                    f"{r['processes']:,} in {r['os_processes']}",
                    r["sessions"],
                    kind,
                    k["changes"],
                    _ms(k["p50"]),
                    _ms(k["p99"]),
                    f"x{k['p99'] / one:.1f}" if one else "-",
                    f"{_ms(k['last']['p50'])} / {_ms(k['last']['p99'])} / {_ms(k['last']['max'])}",
                    f"{k['reads']:g}",
                    " / ".join(f"{k['cpu_ms'][g]:.0f}" for g in CPU_GROUPS),
                    " / ".join(f"{r['idle_cores'][g]:.2f}" for g in CPU_GROUPS),
                    f"{r.get('agents_rss_mib', 0) + r['clients_rss_mib']:,.0f}",
                    f"{r['load_before'][0]:.1f} / {r['load_measuring'][0]:.1f}",
                )
            )
    return lines


CPU_GROUPS = ("zookeeper", "agents", "clients")
HEADERS = (
    "run",
    "mode",
    "processes in OS processes",
    "sessions",
    "change",
    "changes",
    "p50 ms",
    "p99 ms",
    "p99 vs single",
    "last process p50 / p99 / max ms",
    "reads/change",
    "CPU ms/change ZK / agents / clients",
    "idle cores ZK / agents / clients",
    "RSS MiB",
    "load before / measuring",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=5, help="host agents (the issue's: 50)")
    parser.add_argument(
        "--per-agent", type=int, default=4, help="processes per agent (the issue's: 20)"
    )
    parser.add_argument(
        "--per-os-process", type=int, default=20, help="clients packed in one OS process"
    )
    parser.add_argument(
        "--direct-processes",
        type=int,
        help="processes with sessions of their own (default: as many as through the agents)",
    )
    parser.add_argument("--instances", type=int, default=10, help="instances of the service")
    parser.add_argument("--changes", type=int, default=5, help="rounds of the three changes")
    parser.add_argument("--runs", type=int, default=1, help="repeats of every mode")
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}"
    )
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        hosts, agent, count, service = args.worker
        worker(hosts, agent, int(count), service)
        return
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: of {', '.join(MODES)}")
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    args.token = 0  # each change's token is new: a process hears each one
    rows = []
    with (
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "fanout-writer", NAMESPACE, announce=False) as writer,
    ):
        populate(writer, SERVICE, args.instances, partitions=1)
        for run in range(args.runs):
            for mode in modes if run % 2 == 0 else modes[::-1]:
                row = {"run": run + 1, **measure(mode, zk, writer, args)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)  # kept if a later fails
    report(
        "fanout",
        f"{args.agents} agents x {args.per_agent} processes ({args.per_os_process} per OS "
        f"process), one service of {args.instances} instances, {args.changes} changes of each "
        f"kind per mode",
        HEADERS,
        table(rows),
        {"args": {k: v for k, v in vars(args).items() if k != "token"}, "rows": rows},
    )


if __name__ == "__main__":
    main()
