"""The convergence fuzzer, long: ``python -m benchmarks.convergence --seeds 5 --rounds 30``.

Seeds ``--first-seed`` .. ``--first-seed + --seeds - 1``, each in every watch mode asked for,
each a fresh namespace on one standalone ZooKeeper: ``--rounds`` rounds of random changes of
every kind on three services under one fault each (none, connection cut, paused shorter than
the session, paused past it), the reader's cache compared with a fresh read after each round
(:mod:`sentinel.testing.convergence`). Prints a table by mode and fault, and writes every round
to ``benchmarks/results/convergence.json``. Exits 1 if a round did not converge.

    python -m benchmarks.convergence --seeds 5 --rounds 30
    python -m benchmarks.convergence --first-seed 2 --seeds 1 --rounds 4 --mode one-shot
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import asdict

from benchmarks.common import percentiles, report
from sentinel.testing.convergence import FAULTS, ConvergenceFuzzer, FuzzSettings, RoundResult
from sentinel.testing.zookeeper import LocalZooKeeper

MODES = ("one-shot", "persistent")
HEADERS = (
    "mode",
    "fault",
    "rounds",
    "changes",
    "converged",
    "failed",
    "fault as intended",
    "converge p50 s",
    "p99 s",
    "max s",
)


def _row(mode: str, fault: str, results: list[RoundResult]) -> tuple[object, ...]:
    times = [r.seconds for r in results if r.seconds is not None]
    figures = percentiles(times) if times else None
    return (
        mode,
        fault,
        len(results),
        sum(sum(r.changes.values()) for r in results),
        sum(r.converged for r in results),
        sum(not r.converged for r in results),
        sum(r.fault_as_intended for r in results),
        *(("-",) * 3 if figures is None else (f"{figures[q]:.2f}" for q in ("p50", "p99", "max"))),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="how many seeds (default 5)")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30, help="rounds per seed and mode")
    parser.add_argument(
        "--mode", choices=(*MODES, "both"), default="both", help="watch mode (default both)"
    )
    parser.add_argument("--instances", type=int, default=50, help="live per service at start")
    parser.add_argument("--session-timeout", type=float, default=4.0, help="the reader's")
    parser.add_argument("--converge-timeout", type=float, default=20.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # every fault drops a connection
    settings = FuzzSettings(
        instances=args.instances,
        session_timeout=args.session_timeout,
        converge_timeout=args.converge_timeout,
    )
    modes = MODES if args.mode == "both" else (args.mode,)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(f"seeds {list(seeds)}, modes {list(modes)}, {args.rounds} rounds each, {settings}")
    results: list[RoundResult] = []
    started = time.monotonic()

    def tell(result: RoundResult) -> None:
        results.append(result)
        took = "-" if result.seconds is None else f"{result.seconds:.2f}s"
        state = "converged" if result.converged else f"FAILED {result.differences}"
        print(
            f"seed {result.seed} {result.mode} round {result.round}: {result.fault}, "
            f"{sum(result.changes.values())} changes, {state} {took}",
            flush=True,
        )

    with LocalZooKeeper() as zk:
        for seed in seeds:
            for mode in modes:
                persistent = mode == "persistent"
                with ConvergenceFuzzer(zk.connect_string, seed, persistent, settings) as fuzzer:
                    fuzzer.run(args.rounds, tell)
    elapsed = time.monotonic() - started
    rows = []
    for mode in modes:
        in_mode = [r for r in results if r.mode == mode]
        rows += [_row(mode, fault, [r for r in in_mode if r.fault == fault]) for fault in FAULTS]
        rows.append(_row(mode, "all", in_mode))
    report(
        "convergence",
        f"Convergence fuzzer: seeds {seeds.start}..{seeds.stop - 1}, {args.rounds} rounds each, "
        f"{args.instances} instances per service at start, session {args.session_timeout:g}s, "
        f"{elapsed:.0f}s",
        HEADERS,
        rows,
        {
            "seeds": list(seeds),
            "rounds_per_seed": args.rounds,
            "settings": asdict(settings),
            "seconds": elapsed,
            "rounds": [asdict(r) for r in results],
        },
    )
    raise SystemExit(0 if all(r.converged for r in results) else 1)


if __name__ == "__main__":
    main()
