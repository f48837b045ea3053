"""What keeping the cache costs under metric churn: ``python -m benchmarks.churn``.

One client process follows one service of N instances (each with its metrics node) while this
process writes metrics at a fixed rate, one instance after the other, printing nothing and
noting the wall-clock time just before each write. The client notes its own CPU time
(``time.process_time()``, every thread of the process) and wall time between the first and the
last write, and when each write reached its cache (its listener, called right after the
snapshot swap). Sizes are interleaved within each run so that all see the same machine; the
table gives medians over the runs of the client's CPU share (CPU seconds / wall seconds) and of
each run's propagation percentiles (write issued -> applied in the client's cache).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common import percentiles, report
from sentinel import Sentinel
from sentinel.events import MetricsChanged
from sentinel.testing.zookeeper import LocalZooKeeper


def follower(hosts: str, service: str) -> None:
    """The measured client process, driven by lines on stdin.

    ``start`` and ``stop`` bound the measured window; ``exit N`` waits (at most 10 s) until
    writes 0..N-1 have arrived, then prints the figures as one JSON line.
    """
    arrivals: dict[int, float] = {}

    def on_change(event: object) -> None:
        now = time.time()
        if isinstance(event, MetricsChanged):
            for _, endpoint in event.updated:
                arrivals.setdefault(int(endpoint.metrics["seq"]), now)

    with Sentinel(hosts, f"churn-{service}", connect_timeout=120) as client:
        client.prefetch(service)
        client.listen(service, on_change)
        print("ready", flush=True)
        cpu = wall = 0.0
        for line in sys.stdin:
            command, *rest = line.split()
            if command == "start":
                cpu, wall = time.process_time(), time.monotonic()
            elif command == "stop":
                cpu, wall = time.process_time() - cpu, time.monotonic() - wall
            elif command == "exit":
                deadline = time.monotonic() + 10
                while len(arrivals) < int(rest[0]) and time.monotonic() < deadline:
                    time.sleep(0.01)
                print(json.dumps({"cpu": cpu, "wall": wall, "arrivals": arrivals}), flush=True)
                return


def populate(setup: Sentinel, service: str, instances: int, partitions: int) -> list[tuple]:
    """``instances`` registered over ``partitions``, each with a metrics node; their names."""
    setup.ensure_service(service)
    names = [(f"p{i % partitions}", f"r{i}") for i in range(instances)]

    def one(index: int) -> None:
        partition, label = names[index]
        setup.register(service, partition, f"10.{index // 250}.{index % 250}.1", 5432, label=label)
        setup.update_metrics(service, partition, label, {"seq": -1, "load": 0.0})

    with ThreadPoolExecutor(16) as pool:  # kazoo pipelines the requests of several threads
        list(pool.map(one, range(instances)))
    return names


def one_run(
    hosts: str, setup: Sentinel, service: str, names: list[tuple], rate: float, seconds: float
) -> dict[str, float]:
    """Start a follower, write metrics at ``rate`` for ``seconds``; its figures."""
    client = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.churn", "--follower", hosts, service],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdin is not None and client.stdout is not None
    try:
        if client.stdout.readline().strip() != "ready":
            raise RuntimeError("the follower did not start")
        count = int(rate * seconds)
        started: list[float] = []
        client.stdin.write("start\n")
        client.stdin.flush()
        origin = time.monotonic()
        for seq in range(count):
            pause = origin + seq / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            partition, label = names[seq % len(names)]
            started.append(time.time())
            setup.update_metrics(service, partition, label, {"seq": seq, "load": seq % 100})
        elapsed = time.monotonic() - origin
        client.stdin.write(f"stop\nexit {count}\n")
        client.stdin.flush()
        result = json.loads(client.stdout.readline())
    finally:
        # Killed, not closed: a client that fell behind would first work off its backlog.
        client.kill()
        client.wait()
    arrivals = {int(seq): at for seq, at in result["arrivals"].items()}
    delays = [(arrivals[seq] - at) * 1000 for seq, at in enumerate(started) if seq in arrivals]
    figures = percentiles(delays)
    return {
        "cpu_share": result["cpu"] / result["wall"],
        "cpu_us_per_write": result["cpu"] / count * 1e6,
        "writes_per_s": count / elapsed,
        "written": count,
        "applied": len(delays),
        "p50_ms": figures["p50"],
        "p99_ms": figures["p99"],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,2000,10000", help="instance counts")
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--rate", type=float, default=150.0, help="metric writes per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="writing time per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--follower", nargs=2, metavar=("HOSTS", "SERVICE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.follower:
        follower(*args.follower)
        return

    sizes = [int(s) for s in args.sizes.split(",")]
    with LocalZooKeeper() as zk, Sentinel(zk.connect_string, "churn-writer") as setup:
        worlds = {n: populate(setup, f"churn-{n}", n, args.partitions) for n in sizes}
        runs: dict[int, list[dict[str, float]]] = {n: [] for n in sizes}
        for _ in range(args.runs):
            for n in sizes:  # interleaved, so every size sees the same noise
                runs[n].append(
                    one_run(
                        zk.connect_string, setup, f"churn-{n}", worlds[n], args.rate, args.seconds
                    )
                )

    def median(n: int, field: str) -> float:
        return statistics.median(r[field] for r in runs[n])

    base = median(sizes[0], "cpu_share")
    rows = [
        (
            f"{n:,}",
            f"{median(n, 'writes_per_s'):.0f}",
            f"{median(n, 'cpu_share') * 100:.1f} %",
            f"x{median(n, 'cpu_share') / base:.2f}",
            f"{median(n, 'cpu_us_per_write'):.0f}",
            f"{median(n, 'p50_ms'):.2f}",
            f"{median(n, 'p99_ms'):.2f}",
            f"{sum(r['applied'] for r in runs[n])}/{sum(r['written'] for r in runs[n])}",
        )
        for n in sizes
    ]
    report(
        "churn",
        f"metric churn: one client following N instances ({args.partitions} partitions), "
        f"metrics written at {args.rate:g}/s for {args.seconds:g} s, medians of {args.runs} runs",
        (
            "instances",
            "writes/s",
            "client CPU",
            f"vs {sizes[0]:,}",
            "CPU µs/write",
            "propagation p50 ms",
            "p99 ms",
            "applied",
        ),
        rows,
        {
            "sizes": sizes,
            "partitions": args.partitions,
            "rate": args.rate,
            "seconds": args.seconds,
            "runs": {str(n): r for n, r in runs.items()},
        },
    )


if __name__ == "__main__":
    main()
