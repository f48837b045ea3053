"""A host's processes on sessions of their own, then on one agent: ``python -m benchmarks.agent``.

``--processes`` processes (20) on this host each follow ``--services`` services (5) of
``--instances`` instances (4, each with a metrics node; several sizes may be given, each
measured in turn), first each with a ZooKeeper session of its own (``direct``), then all
through one ``sentinel agent`` sending each change as what changed (``agent``), and, with
``--compare-frames``, through one sending a service's whole state per change as before deltas
(``agent-whole``), on one ZooKeeper, in one run; with ``--runs`` above 1 the modes' order
alternates from run to run. For each mode:

* the server's sessions (``mntr``'s ``zk_global_sessions``, the writer's and the agent's
  included) and the watches it holds (``wchs``);
* reads the server served under the namespace for one metric change (``mntr``'s
  ``zk_cnt_<ns>_read_per_namespace`` around the change, median of ``--changes``);
* propagation: from just before the writer's ``update_metrics`` to each process's listener
  hearing it, on the host's monotonic clock (shared by every process on Linux): p50 and p99
  over every process and change;
* lookups: ``get_service`` on a warm cache, ``--lookups`` per process, each timed alone with
  ``perf_counter_ns`` (the same timer on both sides): p50 and p99 over every process;
* the agent's own CPU seconds (``/proc/<pid>/stat``) over the changes, per change, and its
  resident memory (``VmRSS``) at the end;
* the bytes the agent sent per change frame (its ``sentinel_agent_sent_bytes_total`` over its
  ``service`` and ``delta`` frames during the changes, from its ``--metrics-port``);
* each process's first write (``register``): in agent mode it opens the process's own
  session first; p50 over the processes, and the server's sessions once all have written.

``--runs`` repeats the whole measurement; each run is a row per size and mode.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack

from benchmarks.churn import populate
from benchmarks.common import percentiles, report
from benchmarks.zkcost import mntr, quiet, watches
from sentinel import Sentinel
from sentinel.tables import format_table
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper

NAMESPACE = "/zkcost"  # benchmarks.zkcost's counters read reads under this namespace
# Seconds a first load may take: 10,000 instances read by every process at once, on a
# loaded machine, take longer than a client's default.
LOAD_TIMEOUT = 120.0
# Each change writes a value no earlier change wrote: a process hears each one.
_VALUES = itertools.count(1)


def worker(hosts: str, agent: str, services: list[str], lookups: int) -> None:
    """One process: a client following ``services`` (through ``agent`` unless it is empty),
    answering the parent's commands (JSON lines) until ``stop``."""
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    heard: dict[float, float] = {}  # a metric value -> when this process heard it

    def listener(event: object) -> None:
        for _, new in getattr(event, "updated", ()):
            value = new.metrics.get("load")
            if value is not None and value not in heard:
                heard[value] = time.monotonic()

    with Sentinel(
        hosts,
        f"process-{os.getpid()}",
        NAMESPACE,
        announce=False,
        prometheus_registry=None,
        agent=agent or False,
        connect_timeout=LOAD_TIMEOUT,
    ) as client:
        for service in services:
            client.prefetch(service)
        client.listen(services[0], listener)
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            command = json.loads(line)
            if command["cmd"] == "heard":
                value = command["value"]
                wait_until(lambda value=value: value in heard, timeout=LOAD_TIMEOUT)
                answer: dict[str, object] = {"at": heard.get(value)}
            elif command["cmd"] == "write":
                started = time.perf_counter()
                client.register(services[0], "p0", "10.0.9.1", 7000, label=f"w{os.getpid()}")
                answer = {"seconds": time.perf_counter() - started}
            elif command["cmd"] == "lookups":
                samples = []
                for i in range(lookups):
                    service = services[i % len(services)]
                    started = time.perf_counter_ns()
                    client.get_service(service)
                    samples.append(time.perf_counter_ns() - started)
                answer = {"samples": samples}
            else:
                break
            print(json.dumps(answer), flush=True)


def start_agent(
    stack: ExitStack,
    hosts: str,
    socket_path: str,
    *options: str,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.Popen:
    """A ``sentinel agent`` on ``socket_path`` (more ``options`` given to it; ``env`` and
    ``cwd``: its environment and directory, default this process's), started; ``stack``
    stops it. :func:`serving` waits until it serves."""
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sentinel.cli",
            "agent",
            "--zk",
            hosts,
            "--namespace",
            NAMESPACE,
            "--socket",
            socket_path,
            "--timeout",
            str(LOAD_TIMEOUT),
            "--json",
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=cwd,
    )
    stack.callback(agent.wait, 30)
    stack.callback(agent.terminate)
    return agent


def serving(agent: subprocess.Popen) -> None:
    """Return once ``agent`` (:func:`start_agent`) says it serves; raise if it ended first."""
    assert agent.stdout is not None
    if json.loads(agent.stdout.readline() or "{}").get("event") != "serving":
        raise RuntimeError(f"an agent did not start (exit status {agent.poll()})")


def start_worker(stack: ExitStack, module: str, *args: str) -> subprocess.Popen:
    """``python -m module --worker args...``, answering commands (JSON lines, :func:`ask`) on
    its standard input; ``stack`` closes its input and waits for it to end."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--worker", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    stack.callback(process.wait, 60)
    stack.callback(process.stdin.close)
    return process


def ask(processes: list[subprocess.Popen], command: dict) -> list[dict]:
    for process in processes:
        process.stdin.write(json.dumps(command) + "\n")
        process.stdin.flush()
    return [json.loads(process.stdout.readline()) for process in processes]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _sent(port: int) -> tuple[float, float]:
    """The agent's bytes sent and its ``service`` and ``delta`` frames, so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    sent = frames = 0.0
    for line in text.splitlines():
        if line.startswith("sentinel_agent_sent_bytes_total "):
            sent = float(line.split()[1])
        elif line.startswith(
            ('sentinel_agent_frames_total{op="service"}', 'sentinel_agent_frames_total{op="delta"}')
        ):
            frames += float(line.split()[1])
    return sent, frames


def measure(
    mode: str,
    zk: LocalZooKeeper,
    writer: Sentinel,
    services: list[str],
    args: argparse.Namespace,
) -> dict:
    """One mode's figures (see the module)."""
    host, port = zk.connect_string.split(":")
    with ExitStack() as stack:
        socket_path, agent_pid, metrics_port = "", None, 0
        if mode != "direct":
            socket_path = os.path.join(tempfile.mkdtemp(prefix="agent-bench-"), "agent.sock")
            metrics_port = _free_port()
            agent = start_agent(
                stack,
                zk.connect_string,
                socket_path,
                "--metrics-port",
                str(metrics_port),
                *(["--whole-state-frames"] if mode == "agent-whole" else []),
            )
            serving(agent)
            agent_pid = agent.pid
        processes = [
            start_worker(
                stack,
                "benchmarks.agent",
                zk.connect_string,
                socket_path,
                str(args.lookups),
                *services,
            )
            for _ in range(args.processes)
        ]
        assert all(json.loads(p.stdout.readline())["ready"] for p in processes)
        quiet(host, int(port))
        server = mntr(host, int(port))
        row: dict = {
            "mode": mode,
            "sessions": int(server["zk_global_sessions"]),
            "watches": watches(host, int(port)),
        }
        cpu_before = None if agent_pid is None else cpu_seconds(agent_pid)
        sent_before = _sent(metrics_port) if metrics_port else None
        reads, delays = [], []
        count = args.whole_changes if mode == "agent-whole" else args.changes
        for _ in range(count):
            value = float(next(_VALUES))
            before = quiet(host, int(port))
            written = time.monotonic()
            writer.update_metrics(services[0], "p0", "r0", {"load": value})
            heard = ask(processes, {"cmd": "heard", "value": value})
            assert all(h["at"] is not None for h in heard), f"{mode}: a process never heard it"
            delays += [h["at"] - written for h in heard]
            reads.append((quiet(host, int(port)) - before).reads)
        if agent_pid is not None and sent_before is not None:
            row["agent_cpu_seconds"] = cpu_seconds(agent_pid) - (cpu_before or 0.0)
            sent, frames = (a - b for a, b in zip(_sent(metrics_port), sent_before, strict=True))
            row["changes"] = count
            row["frames_per_change"] = frames / count
            row["bytes_per_frame"] = sent / frames if frames else float("nan")
        row["reads_per_change"] = statistics.median(reads)
        row["propagation"] = percentiles(delays)
        samples = [s for a in ask(processes, {"cmd": "lookups"}) for s in a["samples"]]
        row["lookup_ns"] = percentiles(samples)
        # A first write: in agent mode it opens the process's own session first.
        row["first_write"] = percentiles([a["seconds"] for a in ask(processes, {"cmd": "write"})])
        row["sessions_after_writes"] = int(mntr(host, int(port))["zk_global_sessions"])
        if agent_pid is not None:
            row["agent_rss_mib"] = rss_mib(agent_pid)
        print(f"{mode}, {services[0]}: measured", file=sys.stderr, flush=True)
        return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=20)
    parser.add_argument("--services", type=int, default=5, help="services each process follows")
    parser.add_argument(
        "--instances", type=int, nargs="+", default=[4], help="instances per service (sizes)"
    )
    parser.add_argument("--changes", type=int, default=20, help="metric changes per mode")
    parser.add_argument("--lookups", type=int, default=20_000, help="timed lookups per process")
    parser.add_argument("--runs", type=int, default=1, help="repeats of the whole measurement")
    parser.add_argument(
        "--compare-frames",
        action="store_true",
        help="measure an agent sending whole states per change too (agent-whole)",
    )
    parser.add_argument(
        "--whole-changes",
        type=int,
        help="metric changes through agent-whole (default --changes: at 10,000 instances each "
        "takes tens of seconds there)",
    )
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        hosts, agent, lookups, *services = args.worker
        worker(hosts, agent, services, int(lookups))
        return
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    args.whole_changes = args.whole_changes or args.changes
    modes = ["direct", "agent", *(["agent-whole"] if args.compare_frames else [])]
    with (
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "agent-bench-writer", NAMESPACE, announce=False) as writer,
    ):
        by_size = {}
        for size in args.instances:
            by_size[size] = [f"n{size}-svc{s}" for s in range(args.services)]
            for service in by_size[size]:
                populate(writer, service, size, partitions=1)
        rows = []
        for run in range(args.runs):
            order = modes if run % 2 == 0 else modes[::-1]  # alternated: neither always first
            for size in args.instances:
                for mode in order:
                    row = {"run": run + 1, "instances": size}
                    row.update(measure(mode, zk, writer, by_size[size], args))
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)  # kept if a later fails
    table = [
        (
            r["run"],
            r["instances"],
            r["mode"],
            r["sessions"],
            r["watches"],
            f"{r['reads_per_change']:g}",
            f"{r['propagation']['p50'] * 1000:.2f} / {r['propagation']['p99'] * 1000:.2f}",
            f"{r['lookup_ns']['p50'] / 1000:.2f} / {r['lookup_ns']['p99'] / 1000:.2f}",
            f"{r['agent_cpu_seconds'] / r['changes'] * 1000:.1f} ms"
            if "agent_cpu_seconds" in r
            else "-",
            f"{r['bytes_per_frame']:,.0f} B x {r['frames_per_change']:g}"
            if "bytes_per_frame" in r
            else "-",
            f"{r['agent_rss_mib']:.0f} MiB" if "agent_rss_mib" in r else "-",
            f"{r['first_write']['p50'] * 1000:.1f} ms, {r['sessions_after_writes']} sessions",
        )
        for r in rows
    ]
    report(
        "agent",
        f"{args.processes} processes x {args.services} services of {args.instances} instances, "
        f"{args.changes} metric changes, {args.lookups:,} lookups per process",
        (
            "run",
            "instances",
            "mode",
            "sessions",
            "watches",
            "reads/change",
            "propagation p50/p99 ms",
            "lookup p50/p99 µs",
            "agent CPU/change",
            "bytes/frame x frames/change",
            "agent RSS",
            "first write p50",
        ),
        table,
        {"args": vars(args), "rows": rows},
    )
    summary = []
    for size in args.instances:
        direct = [
            r["propagation"]["p50"]
            for r in rows
            if r["instances"] == size and r["mode"] == "direct"
        ]
        for mode in modes[1:]:
            p50s = [
                r["propagation"]["p50"]
                for r in rows
                if r["instances"] == size and r["mode"] == mode
            ]
            ratio = statistics.median(p50s) / statistics.median(direct)
            summary.append(
                (size, mode, f"{statistics.median(p50s) * 1000:.2f} ms", f"x{ratio:.2f}")
            )
    print("\nmedian over runs of the propagation p50, and its ratio to direct's")
    print(format_table(summary, headers=("instances", "mode", "p50", "vs direct")))


if __name__ == "__main__":
    main()
