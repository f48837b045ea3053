"""What one listing of a large section costs: ``python -m benchmarks.listing``.

A follower reads a section's names whole (``getChildren``; ZooKeeper 3.8 has no paginated
listing) before it reads at most ``MAX_SECTION_NODES`` of its nodes. This fills one parent with
children, step by step up to the largest size asked (60,000 by default, the flood
``docs/reliability.md`` names), and at each size times ``--repeats`` listings from a kazoo
client (the cache's own call) next to as many reads of one node, and gives the reply's size as
ZooKeeper encodes it (a 4-byte count, then a 4-byte length and the UTF-8 bytes of each name).
"""

from __future__ import annotations

import argparse
import time

from kazoo.client import KazooClient

from benchmarks.common import percentiles, report
from sentinel.testing.zookeeper import LocalZooKeeper

PARENT = "/section"
BATCH = 1_000  # creates in flight at once


def reply_bytes(names: list[str]) -> int:
    """The getChildren reply's body as ZooKeeper encodes it (reply header left out)."""
    return 4 + sum(4 + len(name.encode()) for name in names)


def fill(zk: KazooClient, start: int, stop: int, name_bytes: int) -> None:
    """Create children ``start`` to ``stop`` of PARENT, names ``name_bytes`` long."""
    for first in range(start, stop, BATCH):
        pending = [
            zk.create_async(f"{PARENT}/{str(i).rjust(name_bytes, 'n')}", b"")
            for i in range(first, min(first + BATCH, stop))
        ]
        for result in pending:
            result.get(timeout=60)


def timed(call, repeats: int) -> dict[str, float]:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return percentiles(samples)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,20000,60000", help="children, ascending")
    parser.add_argument("--name-bytes", type=int, default=24, help="length of each name")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]

    rows, figures = [], []
    with LocalZooKeeper() as server:
        zk = KazooClient(hosts=server.connect_string)
        zk.start(timeout=30)
        try:
            zk.create(PARENT, b"")
            zk.create("/one", b"x" * 200)
            made = 0
            for size in sizes:
                fill(zk, made, size, args.name_bytes)
                made = size
                names = zk.get_children(PARENT)
                assert len(names) == size, (len(names), size)
                listing = timed(lambda: zk.get_children(PARENT), args.repeats)
                one = timed(lambda: zk.get("/one"), args.repeats)
                size_bytes = reply_bytes(names)
                figures.append(
                    {"children": size, "reply_bytes": size_bytes, "listing": listing, "one": one}
                )
                rows.append(
                    (
                        size,
                        f"{size_bytes / 1024:.0f}",
                        f"{listing['p50']:.2f}",
                        f"{listing['p99']:.2f}",
                        f"{one['p50']:.2f}",
                    )
                )
        finally:
            zk.stop()
            zk.close()
    report(
        "listing",
        f"one getChildren of a section, names of {args.name_bytes} bytes, loopback, "
        f"{args.repeats} listings per size",
        ("children", "reply KiB", "listing p50 ms", "listing p99 ms", "one read p50 ms"),
        rows,
        {"name_bytes": args.name_bytes, "repeats": args.repeats, "figures": figures},
    )


if __name__ == "__main__":
    main()
