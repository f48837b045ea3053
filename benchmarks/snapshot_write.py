"""The snapshot file's write, on its own: ``python -m benchmarks.snapshot_write``.

For each size in ``--instances`` (spread over ``--services`` services, the ladder's shape and
instance records), builds the cache's snapshots as the cache builds them (no ZooKeeper) and
times, in CPU seconds of the writing thread, the :class:`SnapshotWriter`'s first write (the
whole cache) and its write after one instance of one service changed (``--changes`` of them,
the median). Run it on two commits (``git archive`` and ``PYTHONPATH``) to compare them: it
uses only the writer's constructor and ``write_now``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import report
from sentinel.cache.snapshot_file import SnapshotWriter
from sentinel.cache.views import ServiceSnapshot
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.records import InstanceRecord, ServiceSpec


def endpoint(service: str, i: int, weight: float = 1) -> Endpoint:
    """Instance ``i`` of ``service`` as the cache holds it (the ladder's record)."""
    host = f"10.{i // 62500}.{i // 250 % 250}.{i % 250}"
    record = InstanceRecord(service, "p0", f"i{i}", host, 8080, weight=weight)
    return Endpoint.from_record(record, joined=1_000 + i)


def measure(instances: int, services: int, changes: int) -> dict:
    """One size's figures: file size, first write's CPU, each change's write's CPU."""
    per_service = instances // services
    snapshots = {
        f"s{s}": ServiceSnapshot.first(
            ServiceSpec(f"s{s}"),
            {f"p0:i{i}": endpoint(f"s{s}", i) for i in range(per_service)},
            {},
            frozenset(),
        )
        for s in range(services)
    }
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "snapshot.json"
        writer = SnapshotWriter(path, snapshots, {}, "/sentinel", "127.0.0.1:2181")
        started = time.thread_time()
        writer.write_now()
        first = time.thread_time() - started
        size = os.path.getsize(path)
        each = []
        for change in range(changes):  # one instance's weight, in one service
            changed = {"p0:i1": endpoint("s0", 1, weight=2 + change)}
            snapshots["s0"] = snapshots["s0"].updated(frozenset(), endpoints=changed)
            started = time.thread_time()
            writer.write_now()
            each.append(time.thread_time() - started)
    return {"instances": instances, "bytes": size, "first_cpu_s": first, "change_cpu_s": each}


def main(argv: list[str] | None = None) -> None:
    """Print the table and write ``benchmarks/results/snapshot_write.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", default="10000,100000")
    parser.add_argument("--services", type=int, default=100)
    parser.add_argument("--changes", type=int, default=5)
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.instances.split(",")]
    results = [measure(n, args.services, args.changes) for n in sizes]
    report(
        "snapshot_write",
        f"the snapshot file's write, CPU of the writing thread ({args.services} services)",
        ("instances", "file MiB", "first write ms", "a change's write ms (median)"),
        [
            (
                f"{r['instances']:,}",
                f"{r['bytes'] / 1048576:.1f}",
                f"{r['first_cpu_s'] * 1000:.0f}",
                f"{statistics.median(r['change_cpu_s']) * 1000:.1f}",
            )
            for r in results
        ],
        {"services": args.services, "results": results},
    )


if __name__ == "__main__":
    main()
