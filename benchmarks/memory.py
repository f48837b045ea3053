"""Resident memory of a client holding 1,000,000 shard keys: ``python -m benchmarks.memory``.

A separate process (so nothing else sits in its heap) imports Sentinel, notes its resident set
size, loads a service sharded by a directory policy of 1,000,000 keys, collects garbage and
notes it again. Reported: the whole process and the growth due to the cache.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys

from benchmarks.common import build_world, report
from sentinel import Sentinel
from sentinel.testing.zookeeper import LocalZooKeeper


def rss_mb() -> float:
    """This process's resident set size in MB (VmRSS)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure_in_this_process(hosts: str, key: str) -> None:
    before = rss_mb()
    with Sentinel(hosts, "memory-probe") as client:
        client.get_service("db", key)
        gc.collect()
        after = rss_mb()
        keys = len(client._shard_maps["tenants"].keys)
    print(json.dumps({"before_mb": before, "after_mb": after, "keys": keys}))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=1024)
    parser.add_argument("--probe", nargs=2, metavar=("HOSTS", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        measure_in_this_process(*args.probe)
        return

    with LocalZooKeeper() as zk, Sentinel(zk.connect_string, "bench-writer") as writer:
        names = [f"p{i}" for i in range(50)]
        writer.shard_maps.create("tenants", "directory", partitions=names, buckets=args.buckets)
        keys = build_world(
            writer,
            service="db",
            instances=100,
            partitions=50,
            keys=args.keys,
            policy="tenants",
            create_policy=False,
        )
        probe = subprocess.run(
            [sys.executable, "-m", "benchmarks.memory", "--probe", zk.connect_string, keys[0]],
            capture_output=True,
            text=True,
            check=True,
        )
    figures = json.loads(probe.stdout)
    rows = [
        (
            f"{figures['keys']:,} keys, 100 instances",
            f"{figures['before_mb']:.0f}",
            f"{figures['after_mb']:.0f}",
            f"{figures['after_mb'] - figures['before_mb']:.0f}",
        )
    ]
    report(
        "memory",
        f"resident memory of a client process ({args.buckets} buckets)",
        ("cache", "RSS before MB", "RSS after MB", "growth MB"),
        rows,
        {"figures": figures, "buckets": args.buckets, "target_mb": 150},
    )


if __name__ == "__main__":
    main()
