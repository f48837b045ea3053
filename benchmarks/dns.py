"""The agent's DNS server answering from its cache: ``python -m benchmarks.dns``.

``sentinel agent --dns 127.0.0.1:0`` runs as its own process on a local ZooKeeper, one
service registered with 3 instances and another with 64. A client in this process sends
one query at a time over UDP (the next once the last is answered) and times each round
trip; the agent's CPU per query is its process's user and system time (``/proc/PID/stat``)
over the queries of the case, after a warm-up (the service loaded, the code paths run).
``--dns-rate`` is raised for the run: the default rate of one source (1,000 queries a
second) is what a flood from one socket is held to, not what is measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import dns.message
import dns.rdatatype

from benchmarks.common import percentiles, report
from sentinel import Sentinel
from sentinel.testing.zookeeper import LocalZooKeeper

CASES = (
    ("A, 3 instances", "small.sentinel.", "A"),
    ("SRV, 3 instances", "_small._tcp.sentinel.", "SRV"),
    ("SRV, 64 instances", "_large._tcp.sentinel.", "SRV"),
)


def cpu_seconds(pid: int) -> float:
    """User and system time of process ``pid`` so far (its threads included)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ask(sock: socket.socket, wire: bytes) -> bytes:
    sock.send(wire)
    return sock.recv(65535)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=20_000, help="per case")
    args = parser.parse_args(argv)

    with (
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "bench-publisher", "/bench-dns") as publisher,
    ):
        publisher.ensure_namespace()
        for service, count in (("small", 3), ("large", 64)):
            for i in range(count):
                publisher.register(
                    service, "default", f"10.0.{i // 250}.{i % 250 + 1}", 8000 + i, label=f"i{i}"
                )
        directory = tempfile.mkdtemp(prefix="bench-dns-")
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sentinel.cli",
                "agent",
                "--socket",
                f"{directory}/agent.sock",
                "--dns",
                "127.0.0.1:0",
                "--dns-rate",
                "1000000",
                "--zk",
                zk.connect_string,
                "--namespace",
                "/bench-dns",
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # its log: the table is this run's output
            text=True,
        )
        try:
            assert agent.stdout is not None
            address = ""
            while not address:
                event = json.loads(agent.stdout.readline())
                address = event.get("address", "") if event["event"] == "serving_dns" else ""
            host, _, port = address.rpartition(":")
            rows, results = [], {}
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect((host, int(port)))
                sock.settimeout(5)
                for case, name, rdtype in CASES:
                    query = dns.message.make_query(name, rdtype, use_edns=0, payload=4096)
                    wire = query.to_wire()
                    for _ in range(500):  # warm: the service loaded, its answers built once
                        answer = dns.message.from_wire(ask(sock, wire))
                    assert answer.answer, f"{case}: no answer"
                    records = len(answer.answer[0])
                    cpu = cpu_seconds(agent.pid)
                    samples = []
                    for _ in range(args.queries):
                        started = time.perf_counter()
                        ask(sock, wire)
                        samples.append(time.perf_counter() - started)
                    cpu = cpu_seconds(agent.pid) - cpu
                    latency = percentiles(samples)
                    per_query = cpu / args.queries
                    rows.append(
                        (
                            case,
                            records,
                            f"{latency['p50'] * 1e6:.0f}",
                            f"{latency['p99'] * 1e6:.0f}",
                            f"{per_query * 1e6:.0f}",
                            f"{1 / per_query:,.0f}",
                        )
                    )
                    results[case] = {
                        "records": records,
                        "latency_s": latency,
                        "agent_cpu_per_query_s": per_query,
                    }
        finally:
            agent.terminate()
            agent.wait(10)
            os.rmdir(directory)
    report(
        "dns",
        f"the agent's DNS answers from its cache, over UDP ({args.queries:,} queries a case, "
        "one at a time)",
        ("case", "records", "p50 us", "p99 us", "agent CPU us/query", "queries/s of one CPU"),
        rows,
        {"queries": args.queries, "cases": results},
    )


if __name__ == "__main__":
    main()
