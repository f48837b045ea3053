"""``get_service`` with policies and balancers: ``python -m benchmarks.policies``.

Warm cache, one thread, timed call by call as in ``benchmarks.lookup``. MinLag over 3 and over
50 replicas (each publishing ``replication_lag``), with an age limit as by default (its answer
kept per snapshot until a replica's metrics grow too old) and without one (``pure``), then each
balancer over 20 instances (``PowerOfTwoChoices`` by a metric, and by the latencies reported to
the client's feedback). The metrics are published once, before timing, so the age limit is
an hour rather than the default 30 s: the run must not outlast it.
"""

from __future__ import annotations

import argparse

from sentinel.balancers import (
    PowerOfTwoChoices,
    Random,
    RoundRobin,
    SmoothWeightedRoundRobin,
    Sticky,
    WeightedRandom,
)
from sentinel.policies import MinLag

from benchmarks.common import median_of, report, writer_and_reader
from benchmarks.lookup import measure


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100_000)
    args = parser.parse_args(argv)

    with writer_and_reader() as (_, writer, reader):
        for service, count in (("db3", 3), ("db50", 50), ("api20", 20)):
            for i in range(count):
                writer.register(service, "p0", f"10.0.0.{i}", 5432, label=f"r{i}", weight=1 + i % 3)
                writer.update_metrics(
                    service, "p0", f"r{i}", {"replication_lag": (i * 7) % 11, "queue": i % 5}
                )
        cases = {
            "MinLag(cutoff=10, max_age=3600), 3 replicas": ("db3", MinLag(10, max_age=3600), None),
            "MinLag(cutoff=10, max_age=3600), 50 replicas": (
                "db50",
                MinLag(10, max_age=3600),
                None,
            ),
            "MinLag(cutoff=10, max_age=None), 3 replicas": ("db3", MinLag(10, max_age=None), None),
            "MinLag(cutoff=10, max_age=None), 50 replicas": (
                "db50",
                MinLag(10, max_age=None),
                None,
            ),
        }
        for balancer in (
            RoundRobin(),
            Random(),
            WeightedRandom(),
            WeightedRandom("queue"),
            SmoothWeightedRoundRobin(),
            Sticky("tenant-42"),
            PowerOfTwoChoices("queue"),
        ):
            cases[f"{balancer!r}, 20 instances"] = ("api20", None, balancer)
        for service, _, _ in cases.values():
            reader.get_service(service)
        # Latencies reported for every instance: the balancer reads two decayed estimates a call.
        for i, instance in enumerate(reader.eligible_instances("api20")):
            reader.report(instance, latency=0.001 * (1 + i % 5))
        by_latency = PowerOfTwoChoices(feedback=reader.feedback)
        cases["PowerOfTwoChoices(feedback=...), 20 instances"] = ("api20", None, by_latency)
        for service in ("db3", "db50", "api20"):  # metrics attached before timing
            assert all(e.metrics for e in reader.eligible_instances(service))
        rounds = {case: [] for case in cases}
        for _ in range(args.rounds):
            for case, (service, policy, balancer) in cases.items():
                call_args = [(service, None, policy, balancer)] * args.calls
                rounds[case].append(measure(reader, case, call_args, args.calls))

    rows = [
        (
            case,
            f"{median_of(r, 'p50_us'):.2f}",
            f"{median_of(r, 'p95_us'):.2f}",
            f"{median_of(r, 'p99_us'):.2f}",
            f"{median_of(r, 'calls_per_s') / 1e6:.2f} M",
        )
        for case, r in rounds.items()
    ]
    report(
        "policies",
        f"get_service with a policy or balancer, warm cache: medians of {args.rounds} rounds "
        f"of {args.calls:,} calls (one thread)",
        ("case", "p50 µs", "p95 µs", "p99 µs", "calls/s"),
        rows,
        {"rounds": rounds, "targets": {"min_lag_3_p99_us": 5.0}},
    )


if __name__ == "__main__":
    main()
