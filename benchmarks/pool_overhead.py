"""What ReplicaPools adds to a pooled query: ``python -m benchmarks.pool_overhead``.

One PostgreSQL server on loopback (:class:`~sentinel.testing.postgres.LocalPostgres`),
registered in a fresh ZooKeeper under a service sharded by a directory policy. Each round
runs ``SELECT 1`` the same number of times through three ways of getting a pooled connection,
taking turns call by call in an order reversed at every turn:

* ``direct``: ``psycopg_pool.ConnectionPool.connection()`` with psycopg_pool's defaults;
* ``direct+check``: the same with ``check=ConnectionPool.check_connection``, which
  :class:`~sentinel.integrations.postgres.ReplicaPools` sets by default (an empty query before
  a connection is handed out, so that one left on a dead server is never given to the caller);
* ``sentinel``: ``ReplicaPools.connection(key=...)``: ``get_service`` for the key, the pool
  of the chosen instance, the same check, and the retry bookkeeping.

Each pool holds one open connection to the same server. A round's figure is each way's mean
time per call; the overheads are the medians over rounds of each round's ratio, minus one.
The p99 comes from every call of every round. Target: below 5 % of a loopback round trip.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from benchmarks.common import median_of, percentiles, report
from sentinel import Sentinel
from sentinel.integrations.postgres import ReplicaPools
from sentinel.testing.postgres import LocalPostgres
from sentinel.testing.zookeeper import LocalZooKeeper

TARGET = 0.05
SERVICE = "bench-db"
KEY = "tenant-1"


def pooled_select(
    connection: Callable[[], AbstractContextManager[psycopg.Connection[Any]]],
) -> Callable[[], None]:
    """One ``SELECT 1`` on a pooled connection from ``connection()``, its row fetched."""

    def call() -> None:
        with connection() as conn:
            conn.execute("SELECT 1").fetchone()

    return call


def one_round(
    ways: dict[str, Callable[[], None]], calls: int, samples: dict[str, list[float]]
) -> dict[str, float]:
    """Mean seconds per call of each way, taking turns call by call, the order reversed at
    every turn; every call's time is appended to ``samples``."""
    names = list(ways)
    totals = dict.fromkeys(names, 0.0)
    clock = time.perf_counter
    for turn in range(calls):
        for name in names if turn % 2 == 0 else reversed(names):
            start = clock()
            ways[name]()
            took = clock() - start
            totals[name] += took
            samples[name].append(took)
    return {name: total / calls for name, total in totals.items()}


def main(argv: list[str] | None = None) -> None:
    """Run the rounds, print the table and write ``benchmarks/results/pool_overhead.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=300, help="per way and round")
    args = parser.parse_args(argv)
    with (
        LocalPostgres() as server,
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "bench-pools") as sentinel,
    ):
        sentinel.ensure_shard_policy("tenants", "directory", partitions=["p1"])
        sentinel.update_shard_info_many("tenants", {KEY: "p1"})
        sentinel.ensure_service(SERVICE, scheme="postgresql", shard_policy="tenants")
        sentinel.register_service(SERVICE, "p1", server.host, server.port, scheme="postgresql")
        one = {"min_size": 1, "max_size": 1}
        login = {"user": "postgres", "password": server.password, "dbname": "postgres"}
        with (
            ConnectionPool(server.dsn(), **one) as direct,
            ConnectionPool(server.dsn(), check=ConnectionPool.check_connection, **one) as checked,
            ReplicaPools(sentinel, SERVICE, kwargs=login, **one) as pools,
        ):
            ways = {
                "direct": pooled_select(direct.connection),
                "direct+check": pooled_select(checked.connection),
                "sentinel": pooled_select(lambda: pools.connection(key=KEY)),
            }
            samples: dict[str, list[float]] = {name: [] for name in ways}
            one_round(ways, 50, samples)  # connections opened, service loaded
            samples = {name: [] for name in ways}
            rounds = [one_round(ways, args.calls, samples) for _ in range(args.rounds)]
    for r in rounds:
        r["ratio"] = r["sentinel"] / r["direct"]
        r["ratio_checked"] = r["sentinel"] / r["direct+check"]
    tails = {name: percentiles(values) for name, values in samples.items()}
    overhead = median_of(rounds, "ratio") - 1
    over_checked = median_of(rounds, "ratio_checked") - 1
    medians = {name: median_of(rounds, name) for name in ways}
    rows = [
        [
            name,
            f"{medians[name] * 1e6:.0f}",
            f"{tails[name]['p50'] * 1e6:.0f}",
            f"{tails[name]['p99'] * 1e6:.0f}",
            f"{medians[name] / medians['direct'] - 1:+.1%}" if name != "direct" else "",
        ]
        for name in ways
    ]

    def verdict(ratio: float) -> str:
        return f"{ratio:+.1%} ({'met' if ratio < TARGET else 'missed'})"

    report(
        "pool_overhead",
        f"SELECT 1 on a pooled connection, loopback: {args.rounds} interleaved rounds of "
        f"{args.calls} calls. ReplicaPools over the same pool settings (check included): "
        f"{verdict(over_checked)}; over psycopg_pool's defaults: {verdict(overhead)} "
        f"(target < {TARGET:.0%})",
        ["way", "µs per call (median of rounds)", "p50 µs", "p99 µs", "vs direct"],
        rows,
        {
            "rounds": rounds,
            "calls": args.calls,
            "tails": {
                name: {k: t[k] for k in ("p50", "p95", "p99", "max")} for name, t in tails.items()
            },
            "overhead_vs_direct": overhead,
            "overhead_vs_direct_with_check": over_checked,
            "target": TARGET,
            "met_vs_direct": overhead < TARGET,
            "met_vs_direct_with_check": over_checked < TARGET,
        },
    )


if __name__ == "__main__":
    main()
