"""Change propagation, writer in another process: ``python -m benchmarks.propagation``.

A writer process registers instances, deregisters them, moves shard keys, publishes metrics
and publishes credentials (encrypted to the reader's key, decrypted in its cache), printing the
wall-clock time just before each write; this process's client records when each change reaches
its cache (the listener call, made right after the snapshot swap). Both use the same clock, so
a delay is "write issued" to "applied in the reader's cache", round trips included.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import threading
import time

from benchmarks.common import percentiles, report
from sentinel import Sentinel
from sentinel.auth import ClientKeyring
from sentinel.errors import ShardPolicyExists
from sentinel.events import AuthChanged, InstancesChanged, MetricsChanged, ShardKeysChanged
from sentinel.testing.zookeeper import LocalZooKeeper


def writer(hosts: str, count: int, interval: float) -> None:
    """The writer process: every change, with its timestamp, one JSON line each."""
    with Sentinel(hosts, "bench-writer") as client:

        def timed(op: str, change_id: str, write) -> object:
            started = time.time()
            result = write()
            done = time.time()
            print(json.dumps({"op": op, "id": change_id, "t": started, "done": done}), flush=True)
            time.sleep(interval)
            return result

        registrations = [
            timed(
                "register",
                f"new-{i}",
                lambda i=i: client.register_service(
                    "db", "p0", "10.0.0.1", 6000 + i, label=f"new-{i}"
                ),
            )
            for i in range(count)
        ]
        for i, registration in enumerate(registrations):
            timed("deregister", f"new-{i}", lambda r=registration: client.deregister_service(r))
        for i in range(count):
            timed(
                "shard key",
                f"moving-{i}",
                lambda i=i: client.update_shard_info("tenants", f"moving-{i}", "p1"),
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
                lambda i=i: client.update_auth(
                    "db", "bench-reader", {"user": "bench", "password": "not-a-secret", "seq": i}
                ),
            )


# Changes that rewrite one node again and again (the others each touch a node of their own).
OVERWRITES = ("metric", "auth")


def one_round(hosts: str, count: int, interval: float) -> dict[str, list[float]]:
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

    with Sentinel(hosts, "bench-reader", auth_keys=ClientKeyring.generate()) as reader:
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
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(arrivals) < len(writes):
            time.sleep(0.05)
    delays: dict[str, list[float]] = {}
    for index, write in enumerate(writes):
        arrived = arrivals.get((write["op"], write["id"]))
        later = (w for w in writes[index:] if w["op"] == write["op"])
        if (
            arrived is None
            and write["op"] in OVERWRITES
            and any((w["op"], w["id"]) in arrivals for w in later)
        ):
            # One node rewritten: a watch is one-shot, so a value overwritten before the
            # reader's read is never seen. Fine when a later value of the same node arrived.
            delays.setdefault(f"{write['op']} (superseded)", []).append(0.0)
            continue
        if arrived is None:
            raise RuntimeError(f"change never arrived: {write}")
        delays.setdefault(write["op"], []).append((arrived - write["t"]) * 1000)
        delays.setdefault(f"{write['op']} (writer's call)", []).append(
            (write["done"] - write["t"]) * 1000
        )
        # The server sends the watch event and the writer's reply together, so this can be < 0.
        delays.setdefault(f"{write['op']} (after the call returned)", []).append(
            (arrived - write["done"]) * 1000
        )
    return delays


def prepare(setup: Sentinel, count: int) -> None:
    """The world the writer changes (built once), with every moving key back in p0."""
    with contextlib.suppress(ShardPolicyExists):  # an earlier round built it
        setup.create_shard_policy("tenants", "directory", partitions=["p0", "p1"])
        setup.ensure_service("db", shard_policy="tenants")
        setup.register_service("db", "p0", "10.0.0.1", 5432, label="base")
    setup.update_shard_info_many(
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
        for _ in range(args.rounds):
            prepare(setup, args.count)
            for op, delays in one_round(zk.connect_string, args.count, args.interval).items():
                samples.setdefault(op, []).extend(delays)

    rows, figures = [], {}
    for op, delays in samples.items():
        if op.endswith("(superseded)"):
            figures[op] = {"count": len(delays)}
            rows.append((op, "-", "-", "-", "-", len(delays)))
            continue
        figures[op] = percentiles(delays)
        rows.append(
            (
                op,
                f"{figures[op]['p50']:.2f}",
                f"{figures[op]['p95']:.2f}",
                f"{figures[op]['p99']:.2f}",
                f"{figures[op]['max']:.2f}",
                len(delays),
            )
        )
    report(
        "propagation-nofsync" if args.no_fsync else "propagation",
        f"change propagation, write issued -> applied in another process's cache, loopback, "
        f"ZooKeeper forceSync={'no' if args.no_fsync else 'yes'} "
        f"({args.rounds} rounds x {args.count} changes of each kind)",
        ("change", "p50 ms", "p95 ms", "p99 ms", "max ms", "n"),
        rows,
        {"figures": figures, "target_p99_ms": 15.0, "force_sync": not args.no_fsync},
    )


if __name__ == "__main__":
    main()
