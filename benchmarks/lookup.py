"""Warm ``get_service`` latency and throughput: ``python -m benchmarks.lookup``.

Per-call latency is timed call by call with ``perf_counter_ns``, minus the timer's own cost:
the median of an empty clock pair (``start = clock(); samples.append(clock() - start)`` with
nothing between), exactly as ``benchmarks/peers/CuratorBench.java`` subtracts ``timerOverhead``
(``System.nanoTime()`` twice, nothing between). Both sides therefore charge the lookup with the
call itself (Python's frame set-up, the JVM's invocation) and subtract only the clock; an empty
*function call* is not subtracted on either side. Throughput is a tight loop of calls.
Cases: unsharded; keyed with keys drawn at random from 100,000 (every lookup misses the CPU
caches); keyed with 1,000 hot keys; unsharded with a decrypted credential attached; unsharded
read from a Curator x-discovery base path (Curator's JSON, followed by a client with
``CacheConfig(curator_base_paths=...)``); unsharded with one of the instances ejected for its
reported failures (a client of its own, whose ejections last the whole run); unsharded during a mass
loss, 11 of the 20 instances deleted without their owner's departure mark and served protected
(``CacheConfig(mass_loss_protection=...)``). All with 20 instances and round robin.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time

from kazoo.client import KazooClient

from benchmarks.common import build_world, median_of, percentiles, report, writer_and_reader
from sentinel import CacheConfig, Sentinel
from sentinel.cache.protection import MassLossProtection
from sentinel.feedback import OutlierDetection
from sentinel.testing.helpers import wait_until


def _timed(call, args_list) -> list[float]:
    """Nanoseconds per call, one timing per call."""
    clock = time.perf_counter_ns
    samples = []
    for args in args_list:
        start = clock()
        call(*args)
        samples.append(clock() - start)
    return samples


def timer_overhead(calls: int) -> float:
    """Nanoseconds of an empty clock pair (median of ``calls``): what ``_timed`` adds to a call.

    The same measurement as ``CuratorBench.timerOverhead``: two clock reads, nothing between.
    """
    clock = time.perf_counter_ns
    samples = []
    for _ in range(calls):
        start = clock()
        samples.append(clock() - start)
    return percentiles(samples)["p50"]


CURATOR_BASE = "/curator-bench"


def curator_reader(connect_string: str, instances: int) -> Sentinel:
    """A started client following ``orders``, ``instances`` Curator-format nodes (the JSON
    Curator 5 writes) under :data:`CURATOR_BASE`."""
    zk = KazooClient(connect_string)
    zk.start(timeout=10)
    try:
        for i in range(instances):
            node = {
                "name": "orders",
                "id": f"c{i}",
                "address": f"10.3.0.{i}",
                "port": 8080,
                "sslPort": None,
                "payload": None,
                "registrationTimeUTC": 1795576186745,
                "serviceType": "DYNAMIC",
                "uriSpec": None,
            }
            zk.create(f"{CURATOR_BASE}/orders/c{i}", json.dumps(node).encode(), makepath=True)
    finally:
        zk.stop()
        zk.close()
    cache = CacheConfig(curator_base_paths=(CURATOR_BASE,))
    return Sentinel(connect_string, "bench-curator", announce=False, cache=cache).start()


def protecting_reader(connect_string: str, writer: Sentinel, instances: int) -> Sentinel:
    """A started client following ``held``, whose ``instances`` instances lost more than half
    their number to unmarked deletes: it serves those protected for the whole benchmark."""
    for i in range(instances):
        writer.register("held", "p0", f"10.4.0.{i}", 80, label=f"h{i}")
    cache = CacheConfig(mass_loss_protection=MassLossProtection(hold=3600.0))
    reader = Sentinel(connect_string, "bench-protecting", announce=False, cache=cache).start()
    reader.get_service("held")
    zk = KazooClient(connect_string)
    zk.start(timeout=10)
    try:
        for i in range(instances // 2 + 1):
            zk.delete(f"/sentinel/services/held/p0:h{i}")  # unmarked, as a session's end
    finally:
        zk.stop()
        zk.close()
    lost = instances // 2 + 1
    wait_until(lambda: sum(e.protected for e in reader.cached_instances("held")) == lost)
    return reader


def measure(client: Sentinel, label: str, args_list, calls: int) -> dict[str, float]:
    """Latency percentiles (timer overhead subtracted) and throughput of ``get_service``."""
    overhead = timer_overhead(calls)
    get = client.get_service
    gc.disable()
    try:
        latency = percentiles([max(s - overhead, 0) / 1000 for s in _timed(get, args_list[:calls])])
        start = time.perf_counter()
        for args in args_list[:calls]:
            get(*args)
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    return {
        "case": label,
        "p50_us": latency["p50"],
        "p95_us": latency["p95"],
        "p99_us": latency["p99"],
        "calls_per_s": calls / elapsed,
        "timer_overhead_ns": overhead,
        "quantiles_us": latency["quantiles"],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args(argv)

    # Ejections that outlast the run: the case measures a lookup while one is in force.
    lasting = OutlierDetection(base_ejection_time=86_400, max_ejection_time=86_400)
    with (
        writer_and_reader() as (zk, writer, reader),
        curator_reader(zk.connect_string, 20) as jvm,
        Sentinel(zk.connect_string, "bench-ejecting", announce=False, feedback=lasting) as ejecting,
        protecting_reader(zk.connect_string, writer, 20) as protecting,
    ):
        keys = build_world(writer, service="db", instances=20, partitions=4, keys=args.keys)
        for i in range(20):
            writer.register("api", "p0", f"10.1.0.{i}", 80, label=f"a{i}")
            writer.register("vault", "p0", f"10.2.0.{i}", 80, label=f"v{i}")
        writer.credentials.publish(
            "vault", "bench-reader", {"user": "bench", "password": "not-secret"}
        )
        rng = random.Random(7)
        keyed_args = [("db", keys[rng.randrange(len(keys))]) for _ in range(args.calls)]
        hot = keys[:1000]
        hot_args = [("db", hot[rng.randrange(len(hot))]) for _ in range(args.calls)]
        plain_args = [("api",)] * args.calls
        reader.get_service("db", keys[0])
        reader.get_service("api")
        wait_until(lambda: reader.get_service("vault").auth is not None)
        jvm.get_service("orders")
        failing = ejecting.get_service("api")
        for _ in range(lasting.consecutive_failures):
            ejecting.report(failing, ok=False)
        assert len(ejecting.eligible_instances("api")) == 19
        cases = {
            "unsharded, 20 instances": (reader, plain_args),
            "unsharded, 20 instances, Curator format": (jvm, [("orders",)] * args.calls),
            "unsharded, 20 instances, with auth": (reader, [("vault",)] * args.calls),
            "unsharded, 20 instances, 1 ejected": (ejecting, plain_args),
            "unsharded, 20 instances, 11 served protected": (protecting, [("held",)] * args.calls),
            f"keyed, 20 instances, random of {args.keys:,} keys": (reader, keyed_args),
            "keyed, 20 instances, 1,000 hot keys": (reader, hot_args),
        }
        rounds = {case: [] for case in cases}
        for _ in range(args.rounds):  # interleave the cases so all see the same noise
            for case, (client, case_args) in cases.items():
                rounds[case].append(measure(client, case, case_args, args.calls))

    rows = []
    for case, results in rounds.items():
        rows.append(
            (
                case,
                f"{median_of(results, 'p50_us'):.2f}",
                f"{median_of(results, 'p95_us'):.2f}",
                f"{median_of(results, 'p99_us'):.2f}",
                f"{median_of(results, 'calls_per_s') / 1e6:.2f} M",
            )
        )
    report(
        "lookup",
        f"get_service, warm cache, round robin: medians of {args.rounds} rounds of "
        f"{args.calls:,} calls (one thread)",
        ("case", "p50 µs", "p95 µs", "p99 µs", "calls/s"),
        rows,
        {"rounds": rounds, "targets": {"p50_us": 1.0, "p99_us": 3.0, "calls_per_s": 1e6}},
    )


if __name__ == "__main__":
    main()
