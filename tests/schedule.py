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

CPU as well: run the suite with ``-p tests.schedule`` and ``SENTINEL_SCHEDULE_CPU=DIR``, and each
process writes, per test, its wall time and the CPU time of the worker and its descendants
(``/proc``: its own, its reaped children's and its live descendants'; a process that outlives
its parent, as ``pg_ctl``'s server does, is not counted) to ``DIR/cpu-<worker>.jsonl``. Then::

    .venv/bin/python -m tests.schedule --cpu DIR --files 20        # CPU and wall per file
    .venv/bin/python -m tests.schedule --cpu DIR --workers 4 5 6 --stretch 8 10

replays the run on 2 cores shared in proportion (``--cores``): a test needs its CPU and, beyond
that, the time it waited in the measured run less ``stretch`` times its CPU (a loaded machine
stretches CPU work by about its load per core); calibrate ``stretch`` on a run whose idle time
is known, and compare worker counts, not clocks.
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
import time
from collections.abc import Sequence

import pytest

DURATION = re.compile(r"\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+)")
GROUPS_FILE = "SENTINEL_SCHEDULE_GROUPS"
GROUP_SUFFIX = re.compile(r"@(spark|[\w/.-]+\.py)$")  # the groups tests/conftest.py names
CPU_DIR = "SENTINEL_SCHEDULE_CPU"
TICKS = os.sysconf("SC_CLK_TCK")


def _collected_id(nodeid: str) -> str:
    """A test's id as collected: under ``--dist loadgroup`` a worker reports a grouped test
    with its group (``...::test@spark``, ``...::test[x]@tests/integration/test_tls.py``); a
    parameter may hold ``@`` too."""
    return GROUP_SUFFIX.sub("", nodeid)


def durations(log: str) -> dict[str, float]:
    """Each test's set-up, call and teardown time summed, from a ``--durations=0`` log."""
    found: dict[str, float] = collections.defaultdict(float)
    with open(log) as lines:
        for line in lines:
            match = DURATION.match(line)
            if match:
                found[_collected_id(match.group(2))] += float(match.group(1))
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


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its descendants: their own, and their reaped children's."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    spent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:  # it ended meanwhile
                continue
            children[int(fields[1])].append(int(name))
            spent[int(name)] = sum(int(ticks) for ticks in fields[11:15])
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += spent.get(pid, 0)
        stack.extend(children.get(pid, ()))
    return total / TICKS


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):  # type: ignore[no-untyped-def]
    """As a plug-in with ``SENTINEL_SCHEDULE_CPU`` set: each test's wall and CPU time."""
    if not os.environ.get(CPU_DIR):
        return (yield)
    cpu, started = tree_cpu(os.getpid()), time.monotonic()
    try:
        return (yield)
    finally:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        row = [item.nodeid, time.monotonic() - started, tree_cpu(os.getpid()) - cpu]
        with open(os.path.join(os.environ[CPU_DIR], f"cpu-{worker}.jsonl"), "a") as out:
            out.write(json.dumps(row) + "\n")


def cpu_log(directory: str) -> dict[str, tuple[float, float]]:
    """Each test's (wall, CPU) seconds from a ``SENTINEL_SCHEDULE_CPU`` directory."""
    found = {}
    for name in sorted(os.listdir(directory)):
        if name.startswith("cpu-") and name.endswith(".jsonl"):
            with open(os.path.join(directory, name)) as lines:
                for line in lines:
                    test, wall, cpu = json.loads(line)
                    found[_collected_id(test)] = (wall, cpu)
    return found


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


def _hand_out(
    items: Sequence[tuple[str, str | None]], workers: int, reorder: bool
) -> tuple[list[list[str]], list[collections.deque[str]]]:
    """xdist's loadgroup start: the scopes still queued (popped from the end), and each
    worker's first tests."""
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
    return queue, pending


def replay_cpu(
    items: Sequence[tuple[str, str | None]],
    took: dict[str, tuple[float, float]],
    workers: int,
    stretch: float,
    cores: float = 2.0,
) -> tuple[float, float]:
    """When the last worker would end on ``cores`` shared in proportion, and the cores busy
    on average: each test needs its CPU spread over its idle duration (its CPU plus what it
    waited, its wall less ``stretch`` times its CPU); while the running tests ask for more
    than ``cores``, each goes slower in proportion."""
    queue, pending = _hand_out(items, workers, reorder=False)

    def job(test: str) -> list[float]:
        wall, cpu = took.get(test, (0.0, 0.0))
        return [cpu + max(0.0, wall - stretch * cpu), cpu]  # [duration left, CPU left]

    running = {w: job(p.popleft()) for w, p in enumerate(pending) if p}
    now = busy = 0.0
    while running:
        demand = sum(cpu / left for left, cpu in running.values() if left > 0)
        speed = min(1.0, cores / demand) if demand else 1.0
        step = min(left for left, _ in running.values()) / speed
        for worker, (left, cpu) in list(running.items()):
            done = min(left, step * speed)
            running[worker] = [left - done, cpu - (cpu * done / left if left else 0.0)]
        busy += min(demand, cores) * step
        now += step
        for worker, (left, _) in list(running.items()):
            if left <= 1e-9:
                del running[worker]
                if queue and len(pending[worker]) <= 2:
                    pending[worker].extend(queue.pop())
                if pending[worker]:
                    running[worker] = job(pending[worker].popleft())
    return now, busy / now if now else 0.0


def replay(
    items: Sequence[tuple[str, str | None]], took: dict[str, float], workers: int, reorder: bool
) -> float:
    """When the last worker would end, xdist's loadgroup scheduling replayed."""
    queue, pending = _hand_out(items, workers, reorder)
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
    parser.add_argument("log", nargs="?", help="the output of a run with --durations=0")
    parser.add_argument("--workers", type=int, nargs="+", default=[3, 4])
    parser.add_argument("--reorder", action="store_true", help="xdist's --loadscope-reorder")
    parser.add_argument("--shards", nargs=2, metavar=("TEST", "N"))
    parser.add_argument("--files", type=int, metavar="N", help="only list the N longest files")
    parser.add_argument("--cpu", metavar="DIR", help="a SENTINEL_SCHEDULE_CPU directory")
    parser.add_argument("--stretch", type=float, nargs="+", default=[8.0])
    parser.add_argument("--cores", type=float, default=2.0)
    options = parser.parse_args(argv)
    if options.cpu:
        return _main_cpu(options)
    if not options.log:
        parser.error("a --durations=0 log, or --cpu DIR")
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


def _main_cpu(options: argparse.Namespace) -> int:
    took = cpu_log(options.cpu)
    if options.files:
        files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
        for test, (wall, cpu) in took.items():
            row = files[test.split("::")[0]]
            row[0], row[1], row[2] = row[0] + wall, row[1] + cpu, row[2] + 1
        total = sum(cpu for _, cpu in took.values())
        wall = sum(wall for wall, _ in took.values())
        print(f"{len(took)} tests: {total:.0f} s of CPU, {wall:.0f} s of test time")
        ranked = sorted(files.items(), key=lambda item: -item[1][1])[: options.files]
        for name, (wall, cpu, tests) in ranked:
            print(f"{cpu:7.1f} s CPU {wall:7.1f} s wall {tests:5d} tests  {name}")
        return 0
    items = collect()
    for stretch in options.stretch:
        for workers in options.workers:
            end, busy = replay_cpu(items, took, workers, stretch, options.cores)
            print(
                f"stretch {stretch:g}, {workers} workers: ends at {end:.0f} s, "
                f"{busy:.2f} cores busy"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
