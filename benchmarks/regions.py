"""Failover across regions, measured: ``python -m benchmarks.regions``.

Two ZooKeepers on this machine: the client's region (east) and another (west), reached through
the project's relay with ``--delay`` seconds each way (a WAN's latency, scaled down). Three
tables:

* **failover and return**: the last local instance of a partition deregistered, until the
  first lookup answered by west (*failover*: the delete's propagation, and for a cold service
  the session to west and the service's load there); then a local instance registered again,
  until the first lookup answered at home (*return*: the hold-down ``return_after`` plus
  propagation and the hold's timer). Cold and warm services alternate run by run, each run
  on a new client (a cold service is cold once per client); p50 and p99 over ``--runs`` runs.
* **lookup with failover configured against without**: the warm ``get_service`` of
  ``benchmarks.lookup`` (``measure``), answered locally, by a client of one region on a
  service without a rule, and by a client with regions on the same service and on a service
  whose spec has a failover rule; interleaved round by round.
* **before and after** (with ``--before PATH``, a checkout of the code before this change,
  with its own ``.venv``): the same warm lookups of a client without failover, each side in
  a process of its own run from its checkout, alternated run by run (``--before-runs``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from benchmarks.common import median_of, percentiles, report
from benchmarks.lookup import measure
from sentinel import Sentinel
from sentinel.errors import NoInstanceAvailable
from sentinel.regions import Failover, Region, Regions
from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper

NAMESPACE = "/bench-regions"
EAST, WEST = "10.0.1.1", "10.0.2.1"


def _first(client: Sentinel, service: str, host: str, timeout: float = 30.0) -> float:
    """Poll ``get_service`` until it answers ``host``; the monotonic time it first did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if client.get_service(service).host == host:
                return time.monotonic()
        except NoInstanceAvailable:
            pass
        time.sleep(0.0005)
    raise TimeoutError(f"{service} never answered {host} within {timeout:g}s")


def failover_runs(
    regions: Regions, east: Sentinel, runs: int, return_after: float
) -> dict[str, dict[str, list[float]]]:
    """Failover and return times (seconds) of cold and warm services, alternated."""
    times: dict[str, dict[str, list[float]]] = {
        mode: {"failover": [], "return": []} for mode in ("cold", "warm")
    }
    for run in range(runs):
        for mode in ("cold", "warm") if run % 2 == 0 else ("warm", "cold"):
            service = f"orders-{mode}"
            local = east.register(service, "p0", EAST, 8080, label="home")
            with Sentinel(
                namespace=NAMESPACE,
                client_id=f"bench-{mode}-{run}",
                regions=regions,
                prometheus_registry=None,
            ) as client:
                assert client.get_service(service).host == EAST
                if mode == "warm":  # followed in west before it is needed
                    west = client.regions_router.remotes.by_name["west"]
                    assert wait_until(
                        lambda remote=west, name=service: (
                            remote.client is not None and remote.client.cached_instances(name)
                        ),
                        timeout=30,
                    )
                gone = time.monotonic()
                east.deregister(local)
                times[mode]["failover"].append(_first(client, service, WEST) - gone)
                back = time.monotonic()
                local = east.register(service, "p0", EAST, 8080, label="home")
                times[mode]["return"].append(_first(client, service, EAST) - back)
            east.deregister(local)
    return times


def hot_path(
    connect_string: str, regions: Regions, rounds: int, calls: int
) -> dict[str, list[dict[str, float]]]:
    """Warm local lookups: without regions, with regions (no rule), with a rule."""
    with (
        Sentinel(connect_string, "bench-plain", NAMESPACE, regions=False, announce=False) as plain,
        Sentinel(namespace=NAMESPACE, client_id="bench-ruled", regions=regions) as ruled,
    ):
        cases = {
            "one region, service without a rule": (plain, [("api",)] * calls),
            "with regions, service without a rule": (ruled, [("api",)] * calls),
            "with regions, service with a failover rule": (ruled, [("ruled",)] * calls),
        }
        for client, args in cases.values():
            client.get_service(*args[0])
        results: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
        for _ in range(rounds):
            for case, (client, args) in cases.items():
                results[case].append(measure(client, case, args, calls))
    return results


# Run in a checkout's own interpreter: only what both sides of the change have.
_SIDE = textwrap.dedent(
    """
    import json, sys
    from benchmarks.lookup import measure
    from sentinel import Sentinel
    from sentinel.testing.zookeeper import LocalZooKeeper
    calls = int(sys.argv[1])
    with LocalZooKeeper() as zk, Sentinel(zk.connect_string, "w") as w, \\
            Sentinel(zk.connect_string, "r", announce=False) as r:
        for i in range(20):
            w.register("api", "p0", f"10.1.0.{i}", 80, label=f"a{i}")
        r.get_service("api")
        rounds = [measure(r, "api", [("api",)] * calls, calls) for _ in range(3)]
    print(json.dumps({k: sorted(x[k] for x in rounds)[1] for k in ("p50_us", "p99_us")}))
    """
)


def before_after(before: Path, runs: int, calls: int) -> dict[str, list[dict[str, float]]]:
    """The warm lookup of a client without failover, in each checkout, alternated."""
    import json

    after = Path(__file__).resolve().parents[1]
    sides = {"before": before, "after": after}
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for run in range(runs):
        for side in sides if run % 2 == 0 else reversed(list(sides)):
            root = sides[side]
            python = root / ".venv" / "bin" / "python"
            out = subprocess.run(
                [str(python if python.exists() else sys.executable), "-c", _SIDE, str(calls)],
                cwd=root,
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "PYTHONPATH": str(root)},
                timeout=600,
            )
            results[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="failover runs per mode")
    parser.add_argument("--delay", type=float, default=0.005, help="relay delay each way, s")
    parser.add_argument("--return-after", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=5, help="hot-path rounds")
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--before", type=Path, help="a checkout of the code before the change")
    parser.add_argument("--before-runs", type=int, default=6)
    args = parser.parse_args(argv)

    rule = Failover(regions=("west",), return_after=args.return_after)
    with LocalZooKeeper() as east_zk, LocalZooKeeper() as west_zk:
        link = TcpProxy("127.0.0.1", int(west_zk.connect_string.split(":")[1]), delay=args.delay)
        regions = Regions(
            "east",
            [
                Region("east", east_zk.connect_string, namespace=NAMESPACE),
                Region("west", link.address, namespace=NAMESPACE),
            ],
        )
        with (
            Sentinel(east_zk.connect_string, "east-pub", NAMESPACE, regions=False) as east,
            Sentinel(west_zk.connect_string, "west-pub", NAMESPACE, regions=False) as west,
        ):
            for mode, warm in (("cold", False), ("warm", True)):
                for publisher in (east, west):
                    publisher.ensure_service(
                        f"orders-{mode}", failover=dataclasses.replace(rule, warm=warm)
                    )
                west.register(f"orders-{mode}", "p0", WEST, 8080, label="away")
            east.ensure_service("ruled", failover=rule)
            for i in range(20):
                east.register("api", "p0", f"10.1.0.{i}", 80, label=f"a{i}")
                east.register("ruled", "p0", f"10.1.1.{i}", 80, label=f"r{i}")
            times = failover_runs(regions, east, args.runs, args.return_after)
            lookups = hot_path(east_zk.connect_string, regions, args.rounds, args.calls)
        link.close()

    rows = []
    for mode, figures in times.items():
        for what, samples in figures.items():
            p = percentiles([s * 1000 for s in samples])
            rows.append((mode, what, f"{p['p50']:.1f}", f"{p['p99']:.1f}", f"{p['max']:.1f}"))
    report(
        "regions_failover",
        f"failover (last local instance gone -> first answer from west) and return (local "
        f"instance back -> first answer at home, return_after={args.return_after:g}s), ms; "
        f"{args.runs} runs per mode, relay delay {args.delay * 1000:g} ms each way",
        ("service", "time", "p50 ms", "p99 ms", "max ms"),
        rows,
        {"times": times, "delay": args.delay, "return_after": args.return_after},
    )
    report(
        "regions_lookup",
        f"warm get_service answered locally: medians of {args.rounds} interleaved rounds of "
        f"{args.calls:,} calls",
        ("case", "p50 µs", "p99 µs", "calls/s"),
        [
            (
                case,
                f"{median_of(r, 'p50_us'):.3f}",
                f"{median_of(r, 'p99_us'):.3f}",
                f"{median_of(r, 'calls_per_s') / 1e6:.2f} M",
            )
            for case, r in lookups.items()
        ],
        {"rounds": lookups},
    )
    if args.before is not None:
        sides = before_after(args.before, args.before_runs, args.calls)
        report(
            "regions_before_after",
            f"warm get_service of a client without failover, before and after the change: "
            f"medians of {args.before_runs} alternated runs (each the median of 3 rounds)",
            ("side", "p50 µs", "p99 µs"),
            [
                (side, f"{median_of(r, 'p50_us'):.3f}", f"{median_of(r, 'p99_us'):.3f}")
                for side, r in sides.items()
            ],
            {"runs": sides, "before": str(args.before)},
        )


if __name__ == "__main__":
    main()
