"""Where a cached instance's bytes go: ``python -m benchmarks.instance_memory``.

Registers ``--instances`` instances over ``--services`` services (the ladder's records and
shape, :mod:`benchmarks.ladder`) in a fresh ZooKeeper, then, in this process with
:mod:`tracemalloc` on, starts a client with a snapshot file, prefetches every service, lets the
snapshot writer write, collects garbage and reports the memory still traced: in total and by
the source line that allocated it, in bytes an instance. Run it on two commits (``git
archive`` and ``PYTHONPATH``) to compare them.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
import tracemalloc
from pathlib import Path

from kazoo.client import KazooClient

from benchmarks.common import report
from benchmarks.ladder import populate, spread
from sentinel import Sentinel
from sentinel.cache.config import CacheConfig
from sentinel.testing.zookeeper import LocalZooKeeper


def main(argv: list[str] | None = None) -> None:
    """Print the table and write ``benchmarks/results/instance_memory.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--services", type=int, default=100)
    parser.add_argument("--lines", type=int, default=12, help="source lines shown")
    args = parser.parse_args(argv)
    n = args.instances
    with LocalZooKeeper() as zk, tempfile.TemporaryDirectory() as directory:
        owner = KazooClient(zk.connect_string)
        owner.start()
        populate(zk, owner, spread(n, args.services))
        tracemalloc.start()
        cache = CacheConfig(snapshot_path=Path(directory) / "snapshot.json")
        with Sentinel(zk.connect_string, "memory", announce=False, cache=cache) as client:
            names = [f"s{s}" for s in range(args.services)]
            for name in names:  # one at a time: what is measured is what stays, not the load
                client.prefetch(name)
            time.sleep(2 * cache.snapshot_interval)  # a write after the last load
            gc.collect()
            traced = tracemalloc.take_snapshot()
            tracemalloc.stop()
        owner.stop()
        owner.close()
    total = sum(stat.size for stat in traced.statistics("filename"))
    lines = traced.statistics("lineno")[: args.lines]
    rows = [("all", f"{total / n:,.0f}", "")] + [
        (str(stat.traceback[0]).split("site-packages/")[-1], f"{stat.size / n:,.1f}", stat.count)
        for stat in lines
    ]
    report(
        "instance_memory",
        f"memory traced after loading {n:,} instances over {args.services} services, "
        "with a snapshot file (bytes an instance)",
        ("allocated at", "bytes an instance", "objects"),
        rows,
        {
            "instances": n,
            "services": args.services,
            "total_bytes": total,
            "lines": [[str(s.traceback[0]), s.size, s.count] for s in lines],
        },
    )


if __name__ == "__main__":
    main()
