"""What ReplicaPools adds to a pooled query: ``python -m benchmarks.pool_overhead``.

One PostgreSQL server on loopback (:class:`~sentinel.testing.postgres.LocalPostgres`),
registered in a fresh ZooKeeper under a service sharded by a directory policy. Each round
runs ``SELECT 1`` the same number of times through four ways of getting a pooled connection,
in two pairs that each take turns call by call, in an order reversed at every turn:

* ``direct``: ``psycopg_pool.ConnectionPool.connection()`` with psycopg_pool's defaults;
* ``direct+check``: the same with ``check=ConnectionPool.check_connection``, which
  :class:`~sentinel.integrations.postgres.ReplicaPools` sets by default (an empty query before
  a connection is handed out, so that one left on a dead server is never given to the caller);
* ``sentinel``: ``ReplicaPools(..., check=None).connection(key=...)``: ``get_service`` for
  the key, the pool of the chosen instance, and the retry bookkeeping, over ``direct``;
* ``sentinel+check``: ``ReplicaPools.connection(key=...)`` as shipped (with the check), over
  ``direct+check``.

Each pool holds one open connection to the same server. A round's figure is each way's median
time per call (the shared machine's bursts land in the means); an overhead is the median over
rounds of each round's ratio, minus one. The p99 comes from every call of every round. Target:
below 5 % of a loopback round trip, for each pair with the same pool settings; the shipped
default against psycopg_pool's default is shown too (the check's extra round trip).

The round trip varies by more than the routing costs, so the same rounds also take
connections without a query (``checkout``: ``direct`` and ``sentinel`` without a statement):
a third pair, whose difference is ReplicaPools' own cost, which its row sets against the
``direct`` round trip of the same round. A fourth pair runs the query on ReplicaPools' own
pool of the instance, taken without resolution (``sentinel's pool``), against ``direct``
again (``direct again``): whether the pools differ, or only what is around them.
"""

from __future__ import annotations

import argparse
import statistics
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


def checkout(
    connection: Callable[[], AbstractContextManager[psycopg.Connection[Any]]],
) -> Callable[[], None]:
    """Take a pooled connection from ``connection()`` and give it back, no statement."""

    def call() -> None:
        with connection():
            pass

    return call


def one_round(
    ways: dict[str, Callable[[], None]], calls: int, samples: dict[str, list[float]]
) -> dict[str, float]:
    """Median seconds per call of each way, taking turns call by call, the order reversed at
    every turn; every call's time is appended to ``samples``."""
    names = list(ways)
    times: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter
    for turn in range(calls):
        for name in names if turn % 2 == 0 else reversed(names):
            start = clock()
            ways[name]()
            times[name].append(clock() - start)
    for name, taken in times.items():
        samples[name] += taken
    return {name: statistics.median(taken) for name, taken in times.items()}


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
        sentinel.shard_maps.ensure("tenants", "directory", partitions=["p1"])
        sentinel.shard_maps.assign_many("tenants", {KEY: "p1"})
        sentinel.ensure_service(SERVICE, scheme="postgresql", shard_policy="tenants")
        sentinel.register(SERVICE, "p1", server.host, server.port, scheme="postgresql")
        one: dict[str, Any] = {"min_size": 1, "max_size": 1}
        login = {"user": "postgres", "password": server.password, "dbname": "postgres"}
        with (
            ConnectionPool(server.dsn(), **one) as direct,
            ConnectionPool(server.dsn(), check=ConnectionPool.check_connection, **one) as checked,
            ReplicaPools(sentinel, SERVICE, kwargs=login, check=None, **one) as unchecked,
            ReplicaPools(sentinel, SERVICE, kwargs=login, **one) as pools,
        ):
            own_pool = unchecked.pool(sentinel.get_service(SERVICE, KEY))
            # Pairs, each taking turns within itself: in a longer rotation the ways at its
            # ends would follow themselves (on a backend just woken) and the others not.
            pairs = [
                {
                    "direct": pooled_select(direct.connection),
                    "sentinel": pooled_select(lambda: unchecked.connection(key=KEY)),
                },
                {
                    "direct+check": pooled_select(checked.connection),
                    "sentinel+check": pooled_select(lambda: pools.connection(key=KEY)),
                },
                {
                    "direct checkout": checkout(direct.connection),
                    "sentinel checkout": checkout(lambda: unchecked.connection(key=KEY)),
                },
                {
                    "direct again": pooled_select(direct.connection),
                    "sentinel's pool": pooled_select(own_pool.connection),
                },
            ]
            samples: dict[str, list[float]] = {name: [] for pair in pairs for name in pair}
            for pair in pairs:
                one_round(pair, 50, samples)  # connections opened, service loaded
            samples = {name: [] for name in samples}
            rounds = [
                {k: v for pair in pairs for k, v in one_round(pair, args.calls, samples).items()}
                for _ in range(args.rounds)
            ]
    for r in rounds:
        r["ratio"] = r["sentinel"] / r["direct"]
        r["ratio_checked"] = r["sentinel+check"] / r["direct+check"]
        r["ratio_defaults"] = r["sentinel+check"] / r["direct"]
        r["ratio_check"] = r["direct+check"] / r["direct"]
        r["routing"] = r["sentinel checkout"] - r["direct checkout"]
        r["routing_share"] = r["routing"] / r["direct"]
        r["ratio_pool"] = r["sentinel's pool"] / r["direct again"]
    tails = {name: percentiles(values) for name, values in samples.items()}
    overhead = median_of(rounds, "ratio") - 1
    over_checked = median_of(rounds, "ratio_checked") - 1
    over_defaults = median_of(rounds, "ratio_defaults") - 1
    routing, share = median_of(rounds, "routing"), median_of(rounds, "routing_share")
    # Each way's overhead over the way it adds to (the median of the rounds' ratios).
    over = {
        "direct+check": ("ratio_check", "direct"),
        "sentinel": ("ratio", "direct"),
        "sentinel+check": ("ratio_checked", "direct+check"),
        "sentinel's pool": ("ratio_pool", "direct again"),
    }

    def row(name: str, digits: int = 0) -> list[str]:
        against = over.get(name)
        return [
            name,
            f"{median_of(rounds, name) * 1e6:.{digits}f}",
            f"{tails[name]['p99'] * 1e6:.0f}",
            f"{median_of(rounds, against[0]) - 1:+.1%} over {against[1]}" if against else "",
        ]

    rows = [row(name) for name in ("direct", "direct+check", "sentinel", "sentinel+check")]
    rows += [row(name, 1) for name in ("direct checkout", "sentinel checkout")]
    rows[-1][3] = f"+{routing * 1e6:.1f} µs = {share:.1%} of the direct round trip"
    rows += [row(name) for name in ("direct again", "sentinel's pool")]

    def verdict(ratio: float) -> str:
        return f"{ratio:+.1%} ({'met' if ratio < TARGET else 'missed'})"

    report(
        "pool_overhead",
        f"SELECT 1 on a pooled connection, loopback: {args.rounds} interleaved rounds of "
        f"{args.calls} calls (target < {TARGET:.0%}). ReplicaPools over the same pool: "
        f"{verdict(overhead)} without the check, {verdict(over_checked)} with it, own cost "
        f"{verdict(share)}; as shipped (checked) over psycopg_pool's defaults: "
        f"{over_defaults:+.1%}",
        ["way", "µs per call (median)", "p99 µs", "overhead"],
        rows,
        {
            "rounds": rounds,
            "calls": args.calls,
            "tails": {
                name: {k: t[k] for k in ("p50", "p95", "p99", "max")} for name, t in tails.items()
            },
            "overhead": overhead,
            "overhead_checked": over_checked,
            "overhead_shipped_vs_defaults": over_defaults,
            "target": TARGET,
            "routing_s": routing,
            "routing_share": share,
            "pool_vs_direct": median_of(rounds, "ratio_pool") - 1,
            "met": max(overhead, over_checked, share) < TARGET,
        },
    )


if __name__ == "__main__":
    main()
