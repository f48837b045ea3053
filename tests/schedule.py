"""How long the suite would take on N xdist workers, replayed from a run's ``--durations=0``.

Not a pytest file (``./run.sh test`` does not run it). It collects the suite as ``./run.sh
test`` does (``tests/conftest.py``'s order and ``xdist_group`` marks), then hands the work out
as pytest-xdist's ``--dist loadgroup`` does (one scope a worker, then one more while a worker
has at most two tests pending; ``--loadscope-reorder`` sorts the scopes by size first) and
replays each test's measured time (set-up, call and teardown) on its worker. A test the log does
not list took under 5 ms. Waiting and CPU contention are not modelled: each test takes what it
took in the measured run, so compare layouts against each other, not against a clock::

    .venv/bin/python -m tests.schedule LOG --workers 3 4 5 [--reorder] [--shards kazoo-test-id N]
    .venv/bin/python -m tests.schedule LOG --files 15   # the files that took longest, and totals

``--shards ID N`` spreads the time ``ID`` took over the N tests ``ID[shard0]`` ... (as the log of
a run before kazoo's suite was split gives it).
"""

from __future__ import annotations

import argparse
import collections
import heapq
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence

DURATION = re.compile(r"\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+)")
GROUPS_FILE = "SENTINEL_SCHEDULE_GROUPS"


def durations(log: str) -> dict[str, float]:
    """Each test's set-up, call and teardown time summed, from a ``--durations=0`` log."""
    found: dict[str, float] = collections.defaultdict(float)
    with open(log) as lines:
        for line in lines:
            match = DURATION.match(line)
            if match:
                found[match.group(2)] += float(match.group(1))
    return found


def pytest_collection_finish(session) -> None:  # type: ignore[no-untyped-def]
    """As a plug-in (``-p tests.schedule``): write the collected order and groups."""
    if os.environ.get(GROUPS_FILE):
        items = []
        for item in session.items:
            marker = item.get_closest_marker("xdist_group")
            items.append([item.nodeid, marker.args[0] if marker else None])
        with open(os.environ[GROUPS_FILE], "w") as out:
            json.dump(items, out)


def collect() -> list[tuple[str, str | None]]:
    """The suite's tests in the order collected, each with its ``xdist_group`` (or None)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as groups:
        subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "tests.schedule"],
            env={**os.environ, GROUPS_FILE: groups.name},
            stdout=subprocess.DEVNULL,
            check=True,
        )
        return [tuple(item) for item in json.load(groups)]  # type: ignore[misc]


def replay(
    items: Sequence[tuple[str, str | None]], took: dict[str, float], workers: int, reorder: bool
) -> float:
    """When the last worker would end, xdist's loadgroup scheduling replayed."""
    scopes: dict[str, list[str]] = {}
    for test, group in items:
        scopes.setdefault(group or test, []).append(test)
    queue = list(scopes.values())
    if reorder:
        queue.sort(key=lambda tests: -len(tests))
    queue.reverse()  # popped from the end
    pending: list[collections.deque[str]] = [collections.deque() for _ in range(workers)]
    for rounds in range(2):
        for worker in range(workers):
            if queue and (rounds == 0 or len(pending[worker]) <= 2):
                pending[worker].extend(queue.pop())
    running = [(took.get(p.popleft(), 0.0), w) for w, p in enumerate(pending) if p]
    heapq.heapify(running)
    end = 0.0
    while running:
        now, worker = heapq.heappop(running)
        end = max(end, now)
        if queue and len(pending[worker]) <= 2:
            pending[worker].extend(queue.pop())
        if pending[worker]:
            heapq.heappush(running, (now + took.get(pending[worker].popleft(), 0.0), worker))
    return end


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.schedule", description=__doc__)
    parser.add_argument("log", help="the output of a run with --durations=0")
    parser.add_argument("--workers", type=int, nargs="+", default=[3, 4])
    parser.add_argument("--reorder", action="store_true", help="xdist's --loadscope-reorder")
    parser.add_argument("--shards", nargs=2, metavar=("TEST", "N"))
    parser.add_argument("--files", type=int, metavar="N", help="only list the N longest files")
    options = parser.parse_args(argv)
    took = durations(options.log)
    if options.files:
        files: dict[str, float] = collections.defaultdict(float)
        for test, seconds in took.items():
            files[test.split("::")[0]] += seconds
        total = sum(files.values())
        print(f"{total:.0f} s of test time in {len(files)} files")
        for name, seconds in sorted(files.items(), key=lambda item: -item[1])[: options.files]:
            print(f"{seconds:7.0f} s {100 * seconds / total:4.0f} %  {name}")
        return 0
    items = collect()
    if options.shards:
        test, count = options.shards[0], int(options.shards[1])
        whole = took.pop(test)
        for shard in (f"{test}[shard{index}]" for index in range(count)):
            took[shard] = whole / count
    missing = sorted({test for test, _ in items} - took.keys())
    print(f"{len(items)} tests, {sum(took.values()):.0f} s of test time, {len(missing)} unlisted")
    for workers in options.workers:
        end = replay(items, took, workers, options.reorder)
        print(f"{workers} workers: the last ends at {end:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
