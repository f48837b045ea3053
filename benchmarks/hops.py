"""Where a change spends its time on the way to a listener: ``python -m benchmarks.hops``.

One ZooKeeper on loopback, two Sentinel clients in this process: a writer publishes a metric
of one instance, and a follower that holds the service (persistent recursive watch) hears it
in a ``listen()`` callback. One change at a time; each is traced through both clients' threads
by wrappers that take ``time.perf_counter()`` (one clock for every thread) as it passes:

1. ``write``: ``update_metrics`` called on the writer;
2. ``write sent``: the writer's transaction written to its socket (its connection thread);
3. ``event on connection thread``: the watch event read off the follower's socket
   (``sentinel.zk.kazoo_internals.HookedConnection._read_watch_event``);
4. ``cache's watcher``: the cache's watcher called (``PersistentFollower._on_event``; on the
   connection thread, or on kazoo's callback thread with ``--worker-reads``);
5. ``read sent``: the changed node's read written to the follower's socket;
6. ``task on worker``: the cache's worker starts the event's task (``_apply_event``);
7. ``reply on connection thread``: the read's reply read off the socket;
8. ``reply on worker``: the worker has the reply;
9. ``listener``: the node decoded, the snapshot swapped, the listener called.

Stages 5 and 6 run in parallel when the read is sent where the event arrives (the default):
the worker wakes while the read is on the wire. ``--worker-reads`` traces the path before the
hops were cut (``CacheConfig(events_on_connection_thread=False)``): the event handed to kazoo's
callback thread, which queues the task, and the read sent by the worker. The table gives each
stage's p50 and p99 after the write over every change (``--changes``, after 100 untimed ones), and
each stage's p50 and p99 after the one before it, in the order the stages are passed (by their
median time after the write).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.protocol.serialization import GetData, Transaction

from benchmarks.common import percentiles, report
from sentinel import Sentinel
from sentinel.cache import reads
from sentinel.cache.config import CacheConfig
from sentinel.cache.followers import PersistentFollower
from sentinel.events import MetricsChanged
from sentinel.testing.zookeeper import LocalZooKeeper
from sentinel.zk.kazoo_internals import HookedConnection

WARM_UP = 100
STAGES = (
    "write",
    "write sent",
    "event on connection thread",
    "cache's watcher",
    "read sent",
    "task on worker",
    "reply on connection thread",
    "reply on worker",
    "listener",
)


class Trace:
    """The first time each stage is passed during the current change."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.active = False

    def mark(self, stage: str) -> None:
        if self.active and stage not in self.times:
            self.times[stage] = time.perf_counter()


def _wrap(owner: Any, name: str, before: Callable[..., None]) -> Callable[[], None]:
    """Call ``before(*args)`` ahead of ``owner.name``; returns the undo."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before(*args)
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original)


def traced_changes(hosts: str, changes: int, at_once: bool = True) -> list[dict[str, float]]:
    """Milliseconds from the write to each stage, per change; ``at_once=False``: events on
    kazoo's callback thread and reads sent by the worker."""
    trace = Trace()
    cache = CacheConfig(events_on_connection_thread=at_once)
    with (
        Sentinel(hosts, "hops-writer", announce=False) as writer,
        Sentinel(hosts, "hops-follower", announce=False, cache=cache) as follower,
    ):
        registration = writer.register("hops", "p1", "127.0.0.1", 5432, label="a")
        writer.update_metrics(registration, {"n": -1})
        zk = follower.session.zk

        def submitted(conn: Any, request: Any, *_: Any) -> None:
            if conn.client is writer.session.zk and isinstance(request, Transaction):
                trace.mark(STAGES[1])
            elif conn.client is zk and isinstance(request, GetData):
                trace.mark(STAGES[4])

        # Before the follower follows the service: its watcher is bound when the watch is set.
        undo = [
            _wrap(HookedConnection, "_submit", submitted),
            _wrap(
                HookedConnection,
                "_read_watch_event",
                lambda conn, *_: conn.client is zk and trace.mark(STAGES[2]),
            ),
            _wrap(
                HookedConnection,
                "_read_response",
                lambda conn, *_: (
                    conn.client is zk and STAGES[4] in trace.times and trace.mark(STAGES[6])
                ),
            ),
            _wrap(PersistentFollower, "_on_event", lambda *_: trace.mark(STAGES[3])),
            _wrap(PersistentFollower, "_apply_event", lambda *_: trace.mark(STAGES[5])),
            _wrap(reads, "observe_propagation", lambda *_: trace.mark(STAGES[7])),
        ]
        follower.prefetch("hops")
        heard = threading.Event()
        expected = [-1.0]

        def listener(event: object) -> None:
            if isinstance(event, MetricsChanged) and any(
                new.metrics.get("n") == expected[0] for _, new in event.updated
            ):
                trace.mark(STAGES[8])
                heard.set()

        follower.listen("hops", listener)
        traces = []
        try:
            for i in range(WARM_UP + changes):
                heard.clear()
                trace.times = {}
                trace.active = True
                expected[0] = float(i)
                trace.mark(STAGES[0])
                writer.update_metrics(registration, {"n": i})
                assert heard.wait(10), f"change {i} not heard"
                trace.active = False
                if i >= WARM_UP and all(stage in trace.times for stage in STAGES):
                    start = trace.times[STAGES[0]]
                    traces.append({s: (trace.times[s] - start) * 1000 for s in STAGES})
        finally:
            for restore in undo:
                restore()
    return traces


def main(argv: list[str] | None = None) -> None:
    """Trace the changes, print the table and write ``benchmarks/results/hops.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=500)
    parser.add_argument(
        "--worker-reads",
        action="store_true",
        help="trace the path before the hops were cut: events on kazoo's callback thread, "
        "reads sent by the worker",
    )
    args = parser.parse_args(argv)
    with LocalZooKeeper() as zk:
        traces = traced_changes(zk.connect_string, args.changes, at_once=not args.worker_reads)
    # In the order the stages are passed (the worker's task comes before the read is sent in
    # one mode and after its reply in the other): by their median time after the write.
    order = sorted(STAGES, key=lambda stage: percentiles([t[stage] for t in traces])["p50"])
    rows, stages = [], {}
    for before, stage in zip((None, *order), order, strict=False):
        since_write = percentiles([t[stage] for t in traces])
        since_before = percentiles([t[stage] - t[before] for t in traces]) if before else None
        stages[stage] = {"since_write": since_write, "since_previous": since_before}
        rows.append(
            [
                stage,
                f"{since_write['p50']:.3f}",
                f"{since_write['p99']:.3f}",
                f"{since_before['p50']:.3f}" if since_before else "",
                f"{since_before['p99']:.3f}" if since_before else "",
            ]
        )
    mode = "worker reads" if args.worker_reads else "reads sent as the event arrives"
    report(
        "hops",
        f"A metric change's way to a listener ({mode}), {len(traces)} traced changes of "
        f"{args.changes} (ms)",
        ["stage", "after the write p50", "p99", "after the stage before p50", "p99"],
        rows,
        {"changes": len(traces), "worker_reads": args.worker_reads, "stages": stages},
    )


if __name__ == "__main__":
    main()
