"""Instructions per change on the follower's path: ``python -m benchmarks.event_cost``.

A propagation's p50 on a shared machine moves with the load by more than a change to the
follower's code can move it; the number of instructions the code executes does not. This
drives the persistent follower's path from a watch event to the listener, in one process with
the real cache, follower and worker (no ZooKeeper: the node's read is a reply already in
hand, as ``PersistentWatches.read_now`` completes it on the connection thread), for
``--changes`` registrations then as many deregistrations of one service holding
``--instances``, each waited for at the listener (the worker idle between changes, as when
they are paced). It runs itself under ``valgrind --tool=callgrind`` twice, with no change and
with ``--changes``, and divides the difference of the instructions both threads executed
(callgrind's ``Collected``) by the number of changes: the interpreter's start, the imports and
the set-up cancel out.

``--before DIR`` counts another tree of the library (``git worktree add DIR <commit>``) the
same way, in the same command (this driver, that tree's library). Needs valgrind
(``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import report

DRIVE = "--drive"


class _Watches:
    """The follower's watches on the connection thread: a child's read is sent at once and its
    reply is in hand (released by the driver)."""

    def __init__(self, reply) -> None:
        self.reply = reply
        self.then = None

    def read_now(self, path, then):
        self.then = then
        return self.reply(path)

    def after_message(self, run):
        return False  # the driver's thread holds no connection: the worker is woken at once


def drive(changes: int, instances: int) -> None:
    """``changes`` registrations then as many deregistrations through the follower's path."""
    from kazoo.protocol.states import EventType, KazooState, WatchedEvent, ZnodeStat

    from sentinel.cache import RegistryCache
    from sentinel.cache.followers import PersistentFollower
    from sentinel.cache.views import ServiceSnapshot
    from sentinel.registry.endpoint import Endpoint
    from sentinel.registry.records import InstanceRecord, ServiceSpec

    now = int(time.time() * 1000)
    stat = ZnodeStat(*[now] * 11)

    class Reply:
        def __init__(self, path: str) -> None:
            self.value = (records[path], stat)

        def successful(self) -> bool:
            return True

        def get(self):
            return self.value

    def path_of(label: str) -> str:
        return f"/services/db/p1:{label}"

    def record(label: str, port: int) -> InstanceRecord:
        return InstanceRecord("db", "p1", label, "10.0.0.1", port)

    records = {path_of(f"new-{i}"): record(f"new-{i}", 6000 + i) for i in range(changes)}
    records = {path: r.to_bytes(path) for path, r in records.items()}
    held = {
        f"p1:base-{i}": Endpoint.from_record(record(f"base-{i}", 1000 + i))
        for i in range(instances)
    }
    cache = RegistryCache(None, "bench", None)
    cache.snapshots["db"] = ServiceSnapshot.first(ServiceSpec("db"), held, {}, frozenset(), None)
    watches = _Watches(Reply)
    follower = PersistentFollower(cache, None, None, watches)
    heard = threading.Event()
    cache.listen("db", lambda change: heard.set())
    cache.worker.start()

    def one(kind: str, path: str) -> None:
        heard.clear()
        watches.then = None
        follower._on_event("/services/db", WatchedEvent(kind, KazooState.CONNECTED, path))
        if watches.then is not None:
            watches.then()  # the reply is in
        if not heard.wait(30):
            raise RuntimeError(f"no listener call for {kind} {path}")

    for path in records:
        one(EventType.CREATED, path)
    for path in records:
        one(EventType.DELETED, path)
    cache.worker.stop(lambda task: None, timeout=5)


def collected(tree: Path, changes: int, instances: int) -> int:
    """Instructions callgrind counted for one driven run in ``tree``."""
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}/callgrind.out",
                sys.executable,
                str(Path(__file__).resolve()),  # this driver, the library of ``tree``
                DRIVE,
                str(changes),
                str(instances),
            ],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"},
            capture_output=True,
            text=True,
            timeout=1800,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from callgrind: {run.stderr[-500:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=200, help="of each kind (default 200)")
    parser.add_argument("--instances", type=int, default=100, help="held by the service")
    parser.add_argument("--before", type=Path, metavar="DIR", help="another tree, counted too")
    parser.add_argument(DRIVE, nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.drive:
        drive(*args.drive)
        return
    trees = {"this tree": Path.cwd()}
    if args.before is not None:
        trees["before"] = args.before.resolve()
    rows, figures = [], {}
    for name, tree in trees.items():
        idle = collected(tree, 0, args.instances)
        busy = collected(tree, args.changes, args.instances)
        per_change = (busy - idle) / (2 * args.changes)
        figures[name] = {"tree": str(tree), "idle": idle, "busy": busy, "per_change": per_change}
        rows.append((name, str(tree), f"{idle:,}", f"{busy:,}", f"{per_change:,.0f}"))
    report(
        "event_cost",
        f"Instructions per change, watch event to listener ({args.changes} registrations and "
        f"{args.changes} deregistrations, {args.instances} instances held; callgrind)",
        ("tree", "directory", "no change", "with the changes", "per change"),
        rows,
        {"figures": figures, "changes": args.changes, "instances": args.instances},
    )


if __name__ == "__main__":
    main()
