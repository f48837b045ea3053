"""Change propagation, writer in another process: ``python -m benchmarks.propagation``.

A writer process registers instances, deregisters them, moves shard keys, publishes metrics
and publishes credentials (encrypted to the reader's key, decrypted in its cache), printing the
wall-clock time just before each write; this process's client records when each change reaches
its cache (the listener call, made right after the snapshot swap). Both use the same clock, so
a delay is "write issued" to "applied in the reader's cache", round trips included.

Metrics and credentials rewrite one node, so a value can be overwritten before the reader
reads it (one-shot watches); such a superseded write counts with its real delay (the arrival of
the later value minus its own start), inside the percentiles, and the table says how many there
were. Registrations and deregistrations each touch a node of their own and are never superseded,
the only kinds ``CuratorBench.java`` measures, so it has no such notion.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass

from benchmarks.common import percentiles, report
from sentinel import Sentinel
from sentinel.auth import ClientKeyring
from sentinel.auth.config import AuthConfig
from sentinel.errors import ShardPolicyExists
from sentinel.events import AuthChanged, InstancesChanged, MetricsChanged, ShardKeysChanged
from sentinel.testing.zookeeper import LocalZooKeeper


def writer(hosts: str, count: int, interval: float) -> None:
    """The writer process: every change, with its timestamps, one JSON line each, encoded and
    printed once every change is written. Between two changes the writer only sleeps, as
    ``CuratorBench.java``'s does: a line encoded and printed as its change is written would
    cost this process CPU, and wake the reader's main thread (reading this output), while the
    change is on its way to the reader's cache, inside the span measured."""
    written: list[tuple[str, str, float, float]] = []
    with Sentinel(hosts, "bench-writer") as client:
        warm_up(client, interval)

        def timed(op: str, change_id: str, write) -> object:
            started = time.time()
            result = write()
            written.append((op, change_id, started, time.time()))
            time.sleep(interval)
            return result

        registrations = [
            timed(
                "register",
                f"new-{i}",
                lambda i=i: client.register("db", "p0", "10.0.0.1", 6000 + i, label=f"new-{i}"),
            )
            for i in range(count)
        ]
        for i, registration in enumerate(registrations):
            timed("deregister", f"new-{i}", lambda r=registration: client.deregister(r))
        for i in range(count):
            timed(
                "shard key",
                f"moving-{i}",
                lambda i=i: client.shard_maps.assign("tenants", f"moving-{i}", "p1"),
            )
        for i in range(count):
            timed(
                "metric",
                f"lag-{i}",
                lambda i=i: client.update_metrics("db", "p0", "base", {"replication_lag": i}),
            )
        for i in range(count):
            timed(
                "auth",
                f"auth-{i}",
                lambda i=i: client.credentials.publish(
                    "db", "bench-reader", {"user": "bench", "password": "not-a-secret", "seq": i}
                ),
            )
    for op, change_id, started, done in written:
        print(json.dumps({"op": op, "id": change_id, "t": started, "done": done}))


# Untimed registrations and deregistrations before a writer measures, as many as
# ``CuratorBench.java``'s (which warms its JIT up so): the service's spec and shard policy
# read (a writer's first registration of a service costs two round trips more), and every
# function of both paths run once, on both sides.
WARM_UP = 20


def warm_up(client: Sentinel, interval: float) -> None:
    """``WARM_UP`` registrations of ``db``, each deregistered, ``interval`` apart; their labels
    (``warm-<i>``) are no change a reader waits for."""
    for i in range(WARM_UP):
        registration = client.register("db", "p0", "10.0.0.2", 7000 + i, label=f"warm-{i}")
        time.sleep(interval)
        client.deregister(registration)
        time.sleep(interval)


# Changes that rewrite one node again and again (the others each touch a node of their own).
OVERWRITES = ("metric", "auth")


@dataclass(frozen=True)
class Delays:
    """One round's delays in milliseconds per row (a kind of change, or a part of its path),
    and how many writes of each kind were superseded (their delays are in the rows)."""

    rows: dict[str, list[float]]
    superseded: Counter[str]


def delays_of(writes: list[dict], arrivals: dict[tuple[str, str], float]) -> Delays:
    """Milliseconds from each write to its arrival, per kind of change (and derived rows).

    A write of a node rewritten again and again (``OVERWRITES``) may never be seen as such: a
    watch is one-shot, so a value overwritten before the reader's read is skipped and the reader
    goes straight to a later one. Such a *superseded* write is counted with its real delay, the
    first arrival of any later value of the same kind minus its own start, stays in the
    percentiles, and is counted in ``superseded``.
    """
    delays: dict[str, list[float]] = {}
    superseded: Counter[str] = Counter()
    for index, write in enumerate(writes):
        op = write["op"]
        arrived = arrivals.get((op, write["id"]))
        if arrived is None and op in OVERWRITES:
            later = [
                arrivals[(w["op"], w["id"])]
                for w in writes[index + 1 :]
                if w["op"] == op and (w["op"], w["id"]) in arrivals
            ]
            if later:
                arrived = min(later)
                superseded[op] += 1
        if arrived is None:
            raise RuntimeError(f"change never arrived: {write}")
        delays.setdefault(op, []).append((arrived - write["t"]) * 1000)
        delays.setdefault(f"{op} (writer's call)", []).append((write["done"] - write["t"]) * 1000)
        # The server sends the watch event and the writer's reply together, so this can be < 0.
        delays.setdefault(f"{op} (after the call returned)", []).append(
            (arrived - write["done"]) * 1000
        )
    return Delays(delays, superseded)


def one_round(hosts: str, count: int, interval: float) -> Delays:
    arrivals: dict[tuple[str, str], float] = {}
    lock = threading.Lock()

    def on_change(event) -> None:
        now = time.time()
        with lock:
            if isinstance(event, InstancesChanged):
                for endpoint in event.added:
                    arrivals.setdefault(("register", endpoint.label), now)
                for endpoint in event.removed:
                    arrivals.setdefault(("deregister", endpoint.label), now)
            elif isinstance(event, MetricsChanged):
                for _, endpoint in event.updated:
                    lag = endpoint.metrics.get("replication_lag")
                    arrivals.setdefault(("metric", f"lag-{lag}"), now)
            elif isinstance(event, ShardKeysChanged):
                for key, (_, new) in event.changes.items():
                    if new == "p1":
                        arrivals.setdefault(("shard key", key), now)
            elif isinstance(event, AuthChanged) and event.credential is not None:
                arrivals.setdefault(("auth", f"auth-{event.credential['seq']}"), now)

    with Sentinel(hosts, "bench-reader", auth=AuthConfig(keys=ClientKeyring.generate())) as reader:
        reader.get_service("db", "seed")
        reader.listen("db", on_change)
        process = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.propagation",
                "--writer",
                hosts,
                "--count",
                str(count),
                "--interval",
                str(interval),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        writes = [json.loads(line) for line in process.stdout.splitlines()]
        wanted = {(write["op"], write["id"]) for write in writes}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not wanted <= arrivals.keys():
            time.sleep(0.05)
    return delays_of(writes, arrivals)


def prepare(setup: Sentinel, count: int) -> None:
    """The world the writer changes (built once), with every moving key back in p0."""
    with contextlib.suppress(ShardPolicyExists):  # an earlier round built it
        setup.shard_maps.create("tenants", "directory", partitions=["p0", "p1"])
        setup.ensure_service("db", shard_policy="tenants")
        setup.register("db", "p0", "10.0.0.1", 5432, label="base")
    setup.shard_maps.assign_many(
        "tenants", {"seed": "p0", **{f"moving-{i}": "p0" for i in range(count)}}
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=100, help="changes of each kind per round")
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument(
        "--no-fsync",
        action="store_true",
        help="run ZooKeeper with forceSync=no, to take the disk out of the tail",
    )
    parser.add_argument("--writer", metavar="HOSTS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.writer:
        writer(args.writer, args.count, args.interval)
        return

    config = {"forceSync": "no"} if args.no_fsync else {}
    with LocalZooKeeper(config=config) as zk, Sentinel(zk.connect_string, "bench-setup") as setup:
        samples: dict[str, list[float]] = {}
        superseded: Counter[str] = Counter()
        for _ in range(args.rounds):
            prepare(setup, args.count)
            measured = one_round(zk.connect_string, args.count, args.interval)
            superseded.update(measured.superseded)
            for op, delays in measured.rows.items():
                samples.setdefault(op, []).extend(delays)

    rows, figures = [], {}
    for op, delays in samples.items():
        figures[op] = {**percentiles(delays), "superseded": superseded[op]}
        rows.append(
            (
                op,
                f"{figures[op]['p50']:.2f}",
                f"{figures[op]['p95']:.2f}",
                f"{figures[op]['p99']:.2f}",
                f"{figures[op]['max']:.2f}",
                len(delays),
                superseded[op] if op in OVERWRITES else "-",
            )
        )
    report(
        "propagation-nofsync" if args.no_fsync else "propagation",
        f"change propagation, write issued -> applied in another process's cache, loopback, "
        f"ZooKeeper forceSync={'no' if args.no_fsync else 'yes'} "
        f"({args.rounds} rounds x {args.count} changes of each kind)",
        ("change", "p50 ms", "p95 ms", "p99 ms", "max ms", "n", "of which superseded"),
        rows,
        {"figures": figures, "target_p99_ms": 15.0, "force_sync": not args.no_fsync},
    )


if __name__ == "__main__":
    main()
