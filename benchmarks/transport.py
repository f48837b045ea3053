"""What kazoo's ``select`` costs on Sentinel's transport, and a round trip's CPU:
``python -m benchmarks.transport``.

kazoo's connection asks its handler's ``select`` before every read and every write of its
socket and in its loop: four times per round trip, three times between a watch event's bytes
arriving and the event's dispatch. Two parts, each in this process:

* **per call**: :func:`sentinel.zk.transport.poll_select` on one readable socket, as kazoo's
  reads ask (``[socket], [], []``: the short path for plain sockets asked one way), on the
  same socket as an instance of a subclass (which takes the general path, building and
  filtering all three lists: what every call took before the short path), and
  ``select.select`` itself; the best of ``--repeat`` timings of ``--calls`` calls each,
  alternated;
* **per round trip**: ``exists("/")`` through a Sentinel client's kazoo session on a local
  ZooKeeper, ``--requests`` of them after 300 untimed ones: p50 and p95 of the call, and the
  CPU the whole process used per call (``time.process_time``: the caller's thread, kazoo's
  connection thread, the kernel's work for both).

Run it in two trees alternated (``git archive`` of the commit before into a directory, this
file copied there, ``PYTHONPATH`` set to it) to compare the round trips before and after.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import time
import timeit

from benchmarks.common import percentiles, report
from sentinel import Sentinel
from sentinel.testing.zookeeper import LocalZooKeeper
from sentinel.zk.transport import poll_select


class _Subclass(socket.socket):
    """A socket :func:`poll_select` does not take the short path for."""


def per_call(calls: int, repeat: int) -> dict[str, float]:
    """Microseconds per call of each way to ask whether one readable socket is readable."""
    reader, writer = socket.socketpair()
    # The same socket (a duplicate of its descriptor) as another class: the general path.
    other = _Subclass(fileno=os.dup(reader.fileno()))
    with reader, writer, other:
        writer.send(b"x")
        ways = {
            "poll_select, a socket (kazoo's calls)": lambda: poll_select([reader], [], [], 10.0),
            "poll_select, the general path": lambda: poll_select([other], [], [], 10.0),
            "select.select": lambda: select.select([reader], [], [], 10.0),
        }
        best = dict.fromkeys(ways, float("inf"))
        for _ in range(repeat):  # alternated, so a busy moment hits every way alike
            for name, call in ways.items():
                best[name] = min(best[name], timeit.timeit(call, number=calls) / calls * 1e6)
    return best


def round_trips(requests: int) -> dict[str, float]:
    """p50, p95 (ms) and process CPU per call (µs) of ``exists`` through Sentinel's session."""
    with LocalZooKeeper() as zk, Sentinel(zk.connect_string, "bench-transport") as client:
        kazoo = client.session.zk
        for _ in range(300):
            kazoo.exists("/")
        took = []
        cpu = time.process_time_ns()
        for _ in range(requests):
            start = time.perf_counter_ns()
            kazoo.exists("/")
            took.append((time.perf_counter_ns() - start) / 1e6)
        cpu = time.process_time_ns() - cpu
    spread = percentiles(took)
    return {"p50_ms": spread["p50"], "p95_ms": spread["p95"], "cpu_us": cpu / requests / 1e3}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=5, help="timings per way (the best kept)")
    parser.add_argument("--requests", type=int, default=3_000, help="round trips")
    args = parser.parse_args(argv)
    calls = per_call(args.calls, args.repeat)
    trips = round_trips(args.requests)
    rows = [[name, f"{us:.2f} µs", ""] for name, us in calls.items()]
    rows.append(
        [
            "exists round trip (p50 / p95)",
            f"{trips['p50_ms']:.3f} / {trips['p95_ms']:.3f} ms",
            f"{trips['cpu_us']:.1f} µs CPU per call",
        ]
    )
    report(
        "transport",
        f"kazoo's select on Sentinel's transport ({args.calls} calls, best of {args.repeat}) "
        f"and {args.requests} round trips",
        ["what", "time", "process CPU"],
        rows,
        {"per_call_us": calls, "round_trip": trips},
    )


if __name__ == "__main__":
    main()
