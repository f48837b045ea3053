"""``sentinel shard import`` of 100,000 keys, and ``sentinel export``/``import`` of a namespace
holding that map, end to end: ``python -m benchmarks.shardimport``.

Each round creates a fresh namespace with a directory policy (256 buckets, 4 partitions),
writes a CSV of 100,000 keys and times the console script importing it (process start-up
included), then a second import of the same file, which must change nothing. It then times
``sentinel export`` of that namespace, ``sentinel import`` of the export into a new namespace
(the map is 2 MB of buckets: several multi requests) and the same import again, which must
change nothing; the copy's export must equal the original's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import report
from sentinel import Sentinel
from sentinel.testing.zookeeper import LocalZooKeeper

SENTINEL = str(Path(sys.executable).with_name("sentinel"))


def _timed(*args: str) -> tuple[float, str]:
    """Seconds the console script took, and its stdout; fails on a non-zero exit."""
    started = time.perf_counter()
    done = subprocess.run(
        [SENTINEL, *args], check=True, capture_output=True, text=True, timeout=300
    )
    return time.perf_counter() - started, done.stdout


def _persistent(export: Path) -> list[tuple[str, str]]:
    nodes = json.loads(export.read_text())["nodes"]
    return [(n["path"], json.dumps(n.get("json"))) for n in nodes if not n["ephemeral"]]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args(argv)

    timings: dict[str, list[float]] = {
        name: [] for name in ("first", "again", "export", "ns_import", "ns_again")
    }
    nodes = 0
    with LocalZooKeeper() as zk, tempfile.TemporaryDirectory() as directory:
        source = Path(directory) / "keys.csv"
        source.write_text(
            "key,partition\n" + "".join(f"tenant-{i:07d},p{i % 4}\n" for i in range(args.keys))
        )
        for round_number in range(args.rounds):
            namespace = f"/bench-import-{round_number}"
            connection = ("--zk", zk.connect_string, "--namespace", namespace)
            with Sentinel(zk.connect_string, "bench-writer", namespace) as writer:
                writer.shard_maps.create(
                    "tenants", "directory", partitions=["p0", "p1", "p2", "p3"]
                )
            for name in ("first", "again"):
                seconds, _ = _timed(
                    "shard", "import", str(source), "--policy", "tenants", *connection
                )
                timings[name].append(seconds)
            export, copy = Path(directory) / "export.json", Path(directory) / "copy.json"
            timings["export"].append(_timed("export", str(export), *connection)[0])
            target = ("--zk", zk.connect_string, "--namespace", f"{namespace}-copy", "--json")
            for name in ("ns_import", "ns_again"):
                seconds, out = _timed("import", str(export), *target)
                timings[name].append(seconds)
            if json.loads(out)["unchanged"] != len(_persistent(export)):
                raise SystemExit("the second namespace import changed something")
            _timed("export", str(copy), *target[:-1])
            if _persistent(copy) != _persistent(export):
                raise SystemExit("the imported namespace differs from the exported one")
            nodes = len(_persistent(export))

    def median(name: str) -> float:
        return statistics.median(timings[name])

    rows = [
        (
            f"shard import of {args.keys:,} keys",
            f"{median('first'):.2f}",
            f"{args.keys / median('first'):,.0f}",
        ),
        ("the same file again (no change)", f"{median('again'):.2f}", "-"),
        (
            f"export of the namespace ({nodes} nodes, {args.keys:,} keys)",
            f"{median('export'):.2f}",
            f"{args.keys / median('export'):,.0f}",
        ),
        (
            "import of that export into a new namespace",
            f"{median('ns_import'):.2f}",
            f"{args.keys / median('ns_import'):,.0f}",
        ),
        ("the same import again (no change)", f"{median('ns_again'):.2f}", "-"),
    ]
    report(
        "shardimport",
        "sentinel shard import, export and import through the console script "
        f"(medians of {args.rounds} rounds)",
        ("run", "seconds", "keys/s"),
        rows,
        {
            "first_s": timings["first"],
            "again_s": timings["again"],
            "export_s": timings["export"],
            "namespace_import_s": timings["ns_import"],
            "namespace_import_again_s": timings["ns_again"],
            "keys": args.keys,
            "nodes": nodes,
        },
    )


if __name__ == "__main__":
    main()
