"""``sentinel shard import`` of 100,000 keys, end to end: ``python -m benchmarks.shardimport``.

Each round creates a fresh directory policy (256 buckets, 4 partitions), writes a CSV of
100,000 keys and times the console script importing it (process start-up included), then
times a second import of the same file, which must change nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import report, writer_and_reader

SENTINEL = str(Path(sys.executable).with_name("sentinel"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args(argv)

    first, again = [], []
    with writer_and_reader() as (zk, writer, _), tempfile.TemporaryDirectory() as directory:
        source = Path(directory) / "keys.csv"
        source.write_text(
            "key,partition\n" + "".join(f"tenant-{i:07d},p{i % 4}\n" for i in range(args.keys))
        )
        for round_number in range(args.rounds):
            policy = f"import-{round_number}"
            writer.create_shard_policy(policy, "directory", partitions=["p0", "p1", "p2", "p3"])
            for timings in (first, again):
                started = time.perf_counter()
                subprocess.run(
                    [
                        SENTINEL,
                        "shard",
                        "import",
                        str(source),
                        "--policy",
                        policy,
                        "--zk",
                        zk.connect_string,
                    ],
                    check=True,
                    capture_output=True,
                    timeout=300,
                )
                timings.append(time.perf_counter() - started)
    rows = [
        (
            f"first import of {args.keys:,} keys",
            f"{statistics.median(first):.2f}",
            f"{args.keys / statistics.median(first):,.0f}",
        ),
        ("the same file again (no change)", f"{statistics.median(again):.2f}", "-"),
    ]
    report(
        "shardimport",
        f"sentinel shard import through the console script (medians of {args.rounds} rounds)",
        ("run", "seconds", "keys/s"),
        rows,
        {"first_s": first, "again_s": again, "keys": args.keys},
    )


if __name__ == "__main__":
    main()
