"""The command line's start, whole processes: ``python -m benchmarks.cli_startup``.

Each round runs, in turn, ``python -c 'import kazoo.client'`` (the yardstick: what any kazoo
tool pays before it does anything), ``sentinel --help`` and ``sentinel ls`` against a local
ZooKeeper with a few services, each as a fresh process timed from its start to its exit.
``--other PATH`` adds another checkout's ``sentinel`` script (say a worktree of the previous
release's, with its own ``.venv``), run in the same rounds, so that before and after share the
machine's load. Rows: the median, fastest and slowest wall seconds of each command, and its
CPU seconds (user + system, the kernel's accounting of the finished child: what a loaded
machine's waiting does not inflate), each with the median over rounds of its ratio to the
yardstick of the same round.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import report
from sentinel import Sentinel
from sentinel.testing.zookeeper import LocalZooKeeper

YARDSTICK = "python -c 'import kazoo.client'"


def _seconds(command: list[str]) -> tuple[float, float]:
    """The wall and the CPU (user + system) seconds of one run of ``command``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="rounds (default 15)")
    parser.add_argument("--other", type=Path, help="another checkout's sentinel script")
    args = parser.parse_args()
    here = Path(sys.executable).with_name("sentinel")
    scripts = {"this checkout": here, **({"other": args.other} if args.other else {})}
    with (
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "bench-publisher", announce=False) as publisher,
    ):
        for index in range(5):
            publisher.register(f"service-{index}", "p1", "10.0.0.1", 8000 + index)
        commands = {YARDSTICK: [sys.executable, "-c", "import kazoo.client"]}
        for name, script in scripts.items():
            commands[f"sentinel --help ({name})"] = [str(script), "--help"]
            commands[f"sentinel ls ({name})"] = [str(script), "ls", "--zk", zk.connect_string]
        for command in commands.values():  # warm the file cache, untimed
            _seconds(command)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, command in commands.items():
                runs[name].append(_seconds(command))
    rows = []
    for name, samples in runs.items():
        row: list[object] = [name]
        for which in (0, 1):  # wall, then CPU
            seconds = [sample[which] for sample in samples]
            ratios = [t[which] / k[which] for t, k in zip(samples, runs[YARDSTICK], strict=True)]
            row += [
                f"{statistics.median(seconds):.3f} ({min(seconds):.3f}-{max(seconds):.3f})",
                f"x{statistics.median(ratios):.2f}",
            ]
        rows.append(row)
    report(
        "cli_startup",
        f"Whole processes, {args.runs} alternated rounds: seconds, median (min-max)",
        ("command", "wall", "wall ratio", "CPU", "CPU ratio"),
        rows,
        {"runs": args.runs, "wall_and_cpu_seconds": runs},
    )


if __name__ == "__main__":
    main()
