"""Where a change spends its time on the way to a listener: ``python -m benchmarks.hops``.

One ZooKeeper on loopback, two Sentinel clients in this process: a writer publishes a metric
of one instance, and a follower that holds the service (persistent recursive watch) hears it
in a ``listen()`` callback. One change at a time; each is traced through the follower's
threads by wrappers that take ``time.perf_counter()`` (one clock for every thread) as it passes:

1. ``write``: ``update_metrics`` called on the writer;
2. ``event on connection thread``: the watch event read off the follower's socket (kazoo's
   connection thread, ``sentinel.zk.protocol``'s ``_read_watch_event``);
3. ``event on callback thread``: the cache's watcher called (kazoo's callback thread,
   ``RegistryCache._on_persistent``), which only queues a task;
4. ``task on worker``: the cache's worker starts the task (``_apply_event``);
5. ``read sent``: the worker's ``get`` of the changed node called;
6. ``reply on connection thread``: the reply read off the socket;
7. ``reply on worker``: ``get`` returns on the worker;
8. ``listener``: the snapshot swapped, the listener called.

The table gives each hop's p50 and p99 over every change (``--changes``, after 100 untimed
ones) and its share of the median total; the thread hand-offs are hops 2->3, 3->4, 4->5 and
6->7, each a thread woken under the GIL.
"""

from __future__ import annotations

import argparse
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import percentiles, report
from sentinel import Sentinel
from sentinel.cache.followers import PersistentFollower
from sentinel.events import MetricsChanged
from sentinel.testing.zookeeper import LocalZooKeeper
from sentinel.zk import protocol as zkprotocol

WARM_UP = 100
STAGES = (
    "write",
    "event on connection thread",
    "event on callback thread",
    "task on worker",
    "read sent",
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


def traced_changes(hosts: str, changes: int) -> list[dict[str, float]]:
    """Milliseconds from the write to each stage, per change."""
    trace = Trace()
    with (
        Sentinel(hosts, "hops-writer", announce=False) as writer,
        Sentinel(hosts, "hops-follower", announce=False) as follower,
    ):
        registration = writer.register("hops", "p1", "127.0.0.1", 5432, label="a")
        writer.update_metrics(registration, {"n": -1})
        zk = follower._zk
        # Before the follower follows the service: its watcher is bound when the watch is set.
        undo = [
            _wrap(
                zkprotocol._Connection,
                "_read_watch_event",
                lambda conn, *_: conn.client is zk and trace.mark(STAGES[1]),
            ),
            _wrap(
                zkprotocol._Connection,
                "_read_response",
                lambda conn, *_: (
                    conn.client is zk and STAGES[4] in trace.times and trace.mark(STAGES[5])
                ),
            ),
            _wrap(PersistentFollower, "_on_event", lambda *_: trace.mark(STAGES[2])),
            _wrap(PersistentFollower, "_apply_event", lambda *_: trace.mark(STAGES[3])),
        ]
        follower.prefetch("hops")
        get = zk.get

        def traced_get(*args: Any, **kwargs: Any) -> Any:
            trace.mark(STAGES[4])
            result = get(*args, **kwargs)
            trace.mark(STAGES[6])
            return result

        zk.get = traced_get
        heard = threading.Event()
        expected = [-1.0]

        def listener(event: object) -> None:
            if isinstance(event, MetricsChanged) and any(
                new.metrics.get("n") == expected[0] for _, new in event.updated
            ):
                trace.mark(STAGES[7])
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
            zk.get = get
            for restore in undo:
                restore()
    return traces


def main(argv: list[str] | None = None) -> None:
    """Trace the changes, print the table and write ``benchmarks/results/hops.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=500)
    args = parser.parse_args(argv)
    with LocalZooKeeper() as zk:
        traces = traced_changes(zk.connect_string, args.changes)
    total = percentiles([t[STAGES[-1]] for t in traces])["p50"]
    rows, hops = [], {}
    for before, after in itertools.pairwise(STAGES):
        tails = percentiles([t[after] - t[before] for t in traces])
        hops[f"{before} -> {after}"] = tails
        rows.append(
            [
                f"{before} -> {after}",
                f"{tails['p50']:.3f}",
                f"{tails['p99']:.3f}",
                f"{tails['p50'] / total:.0%}",
            ]
        )
    whole = percentiles([t[STAGES[-1]] for t in traces])
    rows.append(["write -> listener (whole)", f"{whole['p50']:.3f}", f"{whole['p99']:.3f}", ""])
    report(
        "hops",
        f"A metric change's hops to a listener, {len(traces)} traced changes of "
        f"{args.changes} (ms; share of the median whole)",
        ["hop", "p50", "p99", "share"],
        rows,
        {"changes": len(traces), "hops": hops, "whole": whole},
    )


if __name__ == "__main__":
    main()
