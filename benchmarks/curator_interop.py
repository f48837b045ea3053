"""A Java registration reaching a Python cache, against Java's own ``ServiceCache``, in one run:
``python -m benchmarks.curator_interop --runs 3``.

Apache Curator (``benchmarks/peers/CuratorBench.java``, compiled here against Debian's jars, as
``benchmarks.compare`` does) registers and then deregisters ``--changes`` instances of ``prop``
under its base path, one every ``--interval`` ms, and times each change to the
``cacheChanged()`` of a ``ServiceCache`` of another Curator client. In the same run a Sentinel
client of this process follows the same base path (``CacheConfig(curator_base_paths=...)``)
and times the same changes to its listener. Both sides time from when the Java writer began
each write, on the machine's monotonic clock (Java's ``System.nanoTime`` and Python's
``time.monotonic_ns`` are both ``CLOCK_MONOTONIC``), so the two columns measure the same
writes with the same start; each waits on an event (a listener), not a poll.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from kazoo.client import KazooClient

from benchmarks.common import percentiles, report
from benchmarks.compare import INSTALL, curator, curator_classpath
from sentinel import CacheConfig, Sentinel
from sentinel.events import InstancesChanged
from sentinel.testing.zookeeper import LocalZooKeeper

BASE = "/curator-bench"  # CuratorBench's base path
SERVICE = "prop"


def one_run(java: list[str], changes: int, interval_ms: int) -> dict[str, list[float]]:
    """Delays (ms) of every change, on each side, on a fresh ZooKeeper."""
    arrived: dict[str, int] = {}
    departed: dict[str, int] = {}
    lock = threading.Lock()

    def record(event: object) -> None:
        now = time.monotonic_ns()
        if isinstance(event, InstancesChanged):
            with lock:
                for endpoint in event.added:
                    arrived.setdefault(endpoint.label, now)
                for endpoint in event.removed:
                    departed.setdefault(endpoint.label, now)

    with LocalZooKeeper() as zk:
        plain = KazooClient(zk.connect_string)
        plain.start(timeout=10)
        plain.ensure_path(f"{BASE}/{SERVICE}")  # so the Python side follows it before any write
        plain.stop()
        plain.close()
        cache = CacheConfig(curator_base_paths=(BASE,))
        with Sentinel(zk.connect_string, "interop", announce=False, cache=cache) as reader:
            reader.prefetch(SERVICE)
            reader.listen(SERVICE, record)
            java_side = curator(
                java, zk.connect_string, "propagation", str(changes), str(interval_ms)
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with lock:
                    if sum(f"new-{i}" in departed for i in range(changes)) == changes:
                        break
                time.sleep(0.05)
    ours: dict[str, list[float]] = {"register": [], "deregister": []}
    for kind, seen, starts in (
        ("register", arrived, java_side["register_start_ns"]),
        ("deregister", departed, java_side["deregister_start_ns"]),
    ):
        for i, start in enumerate(starts):
            at = seen.get(f"new-{i}")
            if at is not None:
                ours[kind].append((at - start) / 1e6)
    theirs = {
        "register": [v for v in java_side["register_ms"] if v is not None],
        "deregister": [v for v in java_side["deregister_ms"] if v is not None],
    }
    return {f"python {k}": v for k, v in ours.items()} | {
        f"curator {k}": v for k, v in theirs.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--interval", type=int, default=20, help="ms between writes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as build:
        java, why_not = curator_classpath(Path(build))
        if java is None:
            raise SystemExit(f"Java Curator cannot run here: {why_not} ({INSTALL})")
        runs = [one_run(java, args.changes, args.interval) for _ in range(args.runs)]
    rows = []
    for kind in ("register", "deregister"):
        for side in ("curator", "python"):
            name = f"{side} {kind}"
            per_run = [percentiles(run[name]) for run in runs if run[name]]
            seen = [len(run[name]) for run in runs]
            rows.append(
                (
                    f"{kind}: {'Java ServiceCache' if side == 'curator' else 'Sentinel (Python)'}",
                    ", ".join(f"{p['p50']:.2f}" for p in per_run),
                    ", ".join(f"{p['p99']:.2f}" for p in per_run),
                    ", ".join(f"{n}/{args.changes}" for n in seen),
                )
            )
    report(
        "curator_interop",
        f"Java registration -> cache, ms ({args.runs} runs of {args.changes} changes, one every "
        f"{args.interval} ms; each cell: run 1, run 2, ...)",
        ("change -> cache", "p50 ms", "p99 ms", "seen"),
        rows,
        {"runs": runs, "changes": args.changes, "interval_ms": args.interval},
    )


if __name__ == "__main__":
    main()
