"""Cold start of a client on a big world: ``python -m benchmarks.coldstart``.

The world: one service with 1,000 instances over 50 partitions, sharded by a directory policy
of 100,000 keys (256 buckets). Each round starts a fresh client and times ``start()`` plus the
first keyed ``get_service``, which loads the spec, every instance and the whole shard map and
sets their watches.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.common import build_world, report
from sentinel import Sentinel
from sentinel.testing.zookeeper import LocalZooKeeper


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--instances", type=int, default=1_000)
    args = parser.parse_args(argv)

    with LocalZooKeeper() as zk, Sentinel(zk.connect_string, "bench-writer") as writer:
        keys = build_world(
            writer, service="db", instances=args.instances, partitions=50, keys=args.keys
        )
        timings = []
        for round_number in range(args.rounds):
            started = time.perf_counter()
            with Sentinel(zk.connect_string, f"cold-{round_number}") as client:
                connected = time.perf_counter()
                client.get_service("db", keys[-1])
                loaded = time.perf_counter()
                assert len(client._shard_maps["tenants"].keys) == args.keys
                assert len(client._snapshots["db"].endpoints) == args.instances
            timings.append(
                {
                    "connect_s": connected - started,
                    "load_s": loaded - connected,
                    "total_s": loaded - started,
                }
            )

    rows = [
        (
            f"{args.keys:,} keys, {args.instances:,} instances",
            f"{statistics.median(t['connect_s'] for t in timings):.3f}",
            f"{statistics.median(t['load_s'] for t in timings):.3f}",
            f"{statistics.median(t['total_s'] for t in timings):.3f}",
            f"{max(t['total_s'] for t in timings):.3f}",
        )
    ]
    report(
        "coldstart",
        f"cold start to the first get_service (medians of {args.rounds} fresh clients)",
        ("world", "connect s", "load s", "total s", "worst total s"),
        rows,
        {"rounds": timings, "target_total_s": 1.0},
    )


if __name__ == "__main__":
    main()
