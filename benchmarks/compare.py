"""Sentinel side by side with Apache Curator and the paper: ``python -m benchmarks.compare``.

One ZooKeeper; for each round and each scenario, ours and Curator's run one after the other so
that both see the same machine. Curator runs as ``benchmarks/peers/CuratorBench.java``,
compiled here with ``javac`` against Debian's jars (nothing is downloaded). Scenarios:

* warm lookup: 20 instances, round robin, timed call by call (one thread), both sides
  subtracting the same timer cost: the median of an empty clock pair (``timer_overhead`` in
  ``benchmarks.lookup``, ``timerOverhead`` in ``CuratorBench.java``), never an empty call;
* propagation: 100 registrations then 100 deregistrations, 20 ms apart, until a cache of
  another session shows them (ours: a writer process, the reader's ``listen()`` callback;
  Curator: a writer client in its JVM, a ``ServiceCacheListener`` latch), 300 a side and run
  with the default 3 rounds, and the raw socket's floor for the same span
  (``benchmarks.floor``'s registration: a create, then the children event, the list and the
  new node read on a raw socket, also 20 ms apart) measured in the same rounds; each side's
  percentile is also given as a multiple of the floor's;
* client round trip: ``exists("/")`` through each client library (kazoo; Curator's ZooKeeper
  client), which bounds how fast any change can travel through a writer and a reader;
* cold start: a new client until its cache holds the 1,000 instances of a service, and the
  process's resident memory then (interpreter or JVM start-up excluded from the time).

The propagation parity band (``docs/decisions/propagation-parity-band.md``) is printed after
the table: registration's and deregistration's p50 within ``BAND_P50`` (x1.25) of Curator's
time and their p99 no slower (``BAND_P99``), each as Sentinel's time over Curator's, its
median over runs and spread, and whether that median is in band. ``--before DIR`` alternates
another tree of the library (``git worktree add DIR <commit>``) with this one, round by round:
both run their propagation in a fresh interpreter of their own tree (reader and writer), in
an order that alternates, beside the same Curator round, and the band is given for each.

Without Java or the jars, the Curator column is skipped with a note saying what to install
(``apt-get install default-jdk-headless libcurator-discovery-java libcurator-recipes-java``).
``--runs N`` repeats the whole run N times, each on a fresh ZooKeeper: every figure is reported
as the median over runs and its spread (min-max), the factor taken run by run, and every run's
samples go into ``benchmarks/results/compare.json``. The plot (``compare.png``: the CDFs of
every run pooled, and each run's factor per figure) needs matplotlib
(``pip install -e '.[benchmarks]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from benchmarks.common import RESULTS, compile_peer, percentiles, report
from benchmarks.floor import raw_registration
from benchmarks.lookup import measure
from benchmarks.propagation import one_round, prepare
from sentinel import Sentinel
from sentinel.tables import format_table
from sentinel.testing.zookeeper import LocalZooKeeper

PEER = Path(__file__).resolve().parent / "peers" / "CuratorBench.java"
JARS = (
    "curator-client",
    "curator-framework",
    "curator-recipes",
    "curator-x-discovery",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "jackson-annotations",
    "jackson-core",
    "jackson-databind",
    "slf4j-api",
    "slf4j-nop",
)
INSTALL = "apt-get install default-jdk-headless libcurator-discovery-java libcurator-recipes-java"
PAPER = {"lookup_p95_us": 17.0, "propagation_p99_ms": 500.0}
# Seconds of quiet before each change, on both sides and for the floor: after 20 ms idle a
# round trip on this machine costs about 1 ms more than back to back (the server's threads
# and the CPU wake up), so a floor measured back to back would not be the same work.
PACE = 0.02
# The propagation parity band (docs/decisions/propagation-parity-band.md): Sentinel's time
# over Curator's, at most this at p50 and at p99.
BAND_P50 = 1.25
BAND_P99 = 1.0
BAND = (
    ("register -> other cache, p50 (ms)", BAND_P50),
    ("register -> other cache, p99 (ms)", BAND_P99),
    ("deregister -> other cache, p50 (ms)", BAND_P50),
    ("deregister -> other cache, p99 (ms)", BAND_P99),
)

OUR_RTT = textwrap.dedent("""
    import json, sys, time
    from kazoo.client import KazooClient
    from sentinel.zk.transport import PollHandler
    client = KazooClient(sys.argv[1], handler=PollHandler())  # the transport Sentinel uses
    client.start()
    for _ in range(500):
        client.exists("/")
    samples = []
    for _ in range(int(sys.argv[2])):
        started = time.perf_counter()
        client.exists("/")
        samples.append((time.perf_counter() - started) * 1000)
    client.stop()
    samples.sort()
    rank = lambda q: samples[min(len(samples) - 1, round(q * len(samples)) - 1)]
    print(json.dumps({"p50_ms": rank(0.5), "p99_ms": rank(0.99)}))
""")

OUR_COLD_START = textwrap.dedent("""
    import json, sys, time
    from sentinel import Sentinel
    started = time.perf_counter()
    with Sentinel(sys.argv[1], "cold", announce=False) as client:
        client.prefetch("big")
        assert len(client.eligible_instances("big")) == int(sys.argv[2])
        elapsed = time.perf_counter() - started
        rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))
    print(json.dumps({"total_s": elapsed, "rss_mb": rss / 1024}))
""")


# One propagation round of the tree it runs in (its reader here, its writer a subprocess of
# the same tree): what --before runs for each tree.
TREE_PROPAGATION = textwrap.dedent("""
    import json, sys
    from benchmarks.propagation import one_round
    rows = one_round(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])).rows
    print(json.dumps({"register": rows["register"], "deregister": rows["deregister"]}))
""")


def propagation_in(tree: Path, hosts: str, changes: int, pace: float) -> dict[str, list]:
    """One propagation round of the library in ``tree``, in fresh interpreters of it."""
    run = subprocess.run(
        [sys.executable, "-c", TREE_PROPAGATION, hosts, str(changes), str(pace)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


def curator_classpath(build: Path) -> tuple[list[str] | None, str]:
    """The java command prefix for the Curator peer, or None and why it cannot run."""
    return compile_peer(build, PEER, JARS, "CuratorBench", INSTALL)


def curator(java: list[str], hosts: str, *scenario: str) -> dict:
    run = subprocess.run(
        [*java, hosts, *scenario], capture_output=True, text=True, timeout=300, check=False
    )
    if run.returncode != 0:
        raise RuntimeError(f"Curator {scenario[0]} failed: {run.stderr.strip()[-500:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def run_ours(script: str, *arguments: str) -> dict:
    """Run one of our scenarios in a fresh interpreter (as the JVM is fresh for Curator's)."""
    run = subprocess.run(
        [sys.executable, "-c", script, *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(run.stdout)


def whole_run(java: list[str] | None, args: argparse.Namespace) -> tuple[dict, dict]:
    """One whole run on a fresh ZooKeeper: ``args.rounds`` alternating rounds of every scenario.

    Returns our samples and Curator's (empty lists when Curator cannot run)."""
    mine: dict[str, list] = {"lookup": [], "register": [], "deregister": [], "rtt": [], "cold": []}
    theirs: dict[str, list] = {k: [] for k in mine}
    # The raw socket's registration floor, measured in the same rounds; both sides divide by it.
    mine["floor"] = theirs["floor"] = []
    before: dict[str, list] = {"register": [], "deregister": []}  # --before's tree
    with (
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "compare-writer") as writer,
        Sentinel(zk.connect_string, "compare-reader", announce=False) as reader,
    ):
        for i in range(20):
            writer.register("api", "p", f"10.1.0.{i}", 80, label=f"a{i}")
        for i in range(args.instances):
            writer.register("big", "p", f"10.{i // 250}.{i % 250}.1", 80, label=f"b{i}")
        reader.prefetch("api")
        for round_number in range(args.rounds):
            print(f"  round {round_number + 1}/{args.rounds} ...", file=sys.stderr, flush=True)
            mine["lookup"].append(measure(reader, "ours", [("api",)] * args.calls, args.calls))
            prepare(writer, args.changes)
            if args.before is None:
                delays = one_round(zk.connect_string, args.changes, PACE).rows
            else:  # both trees alike, in an order that alternates round by round
                trees = {"this": Path.cwd(), "before": args.before}
                order = ["this", "before"][:: 1 if round_number % 2 == 0 else -1]
                moved = {}
                for tree in order:
                    prepare(writer, args.changes)
                    moved[tree] = propagation_in(trees[tree], zk.connect_string, args.changes, PACE)
                delays = moved["this"]
                for op in before:
                    before[op] += moved["before"][op]
            mine["register"] += delays["register"]
            mine["deregister"] += delays["deregister"]
            port = zk.members[0].client_port
            mine["floor"] += raw_registration("127.0.0.1", port, args.changes, PACE)
            mine["rtt"].append(run_ours(OUR_RTT, zk.connect_string, "2000"))
            mine["cold"].append(run_ours(OUR_COLD_START, zk.connect_string, str(args.instances)))
            if java is None:
                continue
            theirs["lookup"].append(curator(java, zk.connect_string, "lookup", str(args.calls)))
            pace_ms = str(round(PACE * 1000))
            moved = curator(java, zk.connect_string, "propagation", str(args.changes), pace_ms)
            theirs["register"] += moved["register_ms"]
            theirs["deregister"] += moved["deregister_ms"]
            theirs["rtt"].append(curator(java, zk.connect_string, "rtt", "2000"))
            cold = curator(java, zk.connect_string, "coldstart", str(args.instances), "1")
            theirs["cold"].append({"total_s": cold["total_s"][0], "rss_mb": cold["rss_mb"]})
    if args.before is not None:
        mine["before"] = before
    return mine, theirs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=int, default=1, help="whole runs, each on a fresh ZooKeeper (default 1)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per run")
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument(
        "--changes",
        type=int,
        default=100,
        help="registrations (and as many deregistrations) per side and round (default 100)",
    )
    parser.add_argument("--instances", type=int, default=1_000)
    parser.add_argument(
        "--before",
        type=Path,
        metavar="DIR",
        help="another tree of the library (git worktree add DIR <commit>): its propagation "
        "alternated round by round with this tree's, both in fresh interpreters",
    )
    args = parser.parse_args(argv)
    if args.before is not None:
        args.before = args.before.resolve()

    runs = []
    with tempfile.TemporaryDirectory() as build:
        java, why_not = curator_classpath(Path(build))
        if java is None:
            print(f"Curator column skipped: {why_not}", file=sys.stderr)
        for run_number in range(args.runs):
            print(f"run {run_number + 1}/{args.runs}", file=sys.stderr, flush=True)
            mine, theirs = whole_run(java, args)
            run = {"ours": mine, "curator": theirs, "figures": figures_of(mine, theirs, args)}
            if args.before is not None:
                run["before_figures"] = figures_of({**mine, **mine["before"]}, theirs, args)
            runs.append(run)

    rows, summary = aggregate([run["figures"] for run in runs])
    spread = " (min-max)" if args.runs > 1 else ""
    report(
        "compare",
        f"Sentinel vs Apache Curator 5.4 on one ZooKeeper: {args.runs} whole run(s) of "
        f"{args.rounds} alternating rounds; each figure is the median over runs{spread} of a "
        "run's figure (the median of its rounds; propagation percentiles over its every change)",
        ("figure", "Sentinel", "Curator", "Sentinel better by", "paper"),
        rows,
        {"figures": summary, "runs": runs, "curator_skipped": why_not},
    )
    band_rows = band([run["figures"] for run in runs], "this tree" if args.before else "")
    if args.before is not None:
        band_rows += band([run["before_figures"] for run in runs], f"before ({args.before})")
    if band_rows and runs[0]["curator"]["register"]:
        print(
            f"\nPropagation parity band: Sentinel's time / Curator's, p50 at most x{BAND_P50:g}, "
            f"p99 at most x{BAND_P99:g} (the median over runs, min-max)"
        )
        print(
            format_table(
                band_rows, headers=("tree", "figure", "Sentinel / Curator", "band", "verdict")
            )
        )
    plot(runs)


def band(runs: list[dict[str, dict]], tree: str) -> list[tuple[str, ...]]:
    """The band's rows: per figure, Sentinel's time over Curator's run by run (the inverse
    of the table's factor), its median and spread over runs, and whether the median is in
    band."""
    rows = []
    for name, limit in BAND:
        times = [
            run[name]["sentinel"] / run[name]["curator"]
            for run in runs
            if run[name]["sentinel"] and run[name]["curator"]
        ]
        figure = spread(times)
        if figure is None:
            continue
        verdict = "in band" if figure["median"] <= limit else "out of band"
        rows.append((tree, name, _fmt_spread(figure, prefix="x"), f"<= x{limit:g}", verdict))
    return rows


def _median(section: str, field: str):
    """Reads the median over rounds of one figure of a side's results."""
    return lambda side: (
        statistics.median(r[field] for r in side[section]) if side[section] else None
    )


def _delay(op: str, q: str):
    """Reads a percentile over every change of one kind."""

    def read(side: dict) -> float | None:
        values = [v for v in side[op] if v is not None]
        return percentiles(values)[q] if values else None

    return read


def _over_floor(op: str, q: str):
    """Reads a side's percentile of one kind of change over the raw socket's floor (the same
    percentile of a registration reaching a follower, measured in the same rounds)."""

    def read(side: dict) -> float | None:
        delay, floor = _delay(op, q)(side), _delay("floor", q)(side)
        return None if delay is None or not floor else delay / floor

    return read


def figures_of(ours: dict, theirs: dict, args: argparse.Namespace) -> dict[str, dict]:
    """One run's figures: per row, Sentinel's, Curator's, the factor and the paper's."""
    propagation = f"< {PAPER['propagation_p99_ms']:g}"
    specs = [  # (row, reader, paper, whether more is better)
        ("lookup p50 (µs)", _median("lookup", "p50_us"), None, False),
        (
            "lookup p95 (µs)",
            _median("lookup", "p95_us"),
            f"< 20 (p95 {PAPER['lookup_p95_us']:g})",
            False,
        ),
        ("lookup p99 (µs)", _median("lookup", "p99_us"), None, False),
        ("lookups per second, one thread", _median("lookup", "calls_per_s"), None, True),
        ("register -> other cache, p50 (ms)", _delay("register", "p50"), None, False),
        ("register -> other cache, p99 (ms)", _delay("register", "p99"), propagation, False),
        ("register p50 over the raw-socket floor (x)", _over_floor("register", "p50"), None, False),
        ("register p99 over the raw-socket floor (x)", _over_floor("register", "p99"), None, False),
        ("deregister -> other cache, p50 (ms)", _delay("deregister", "p50"), None, False),
        ("deregister -> other cache, p99 (ms)", _delay("deregister", "p99"), propagation, False),
        ("floor: raw registration -> follower, p50 (ms)", _delay("floor", "p50"), None, False),
        ("client library round trip (exists), p50 (ms)", _median("rtt", "p50_ms"), None, False),
        ("client library round trip (exists), p99 (ms)", _median("rtt", "p99_ms"), None, False),
        (f"cold start, {args.instances:,} instances (s)", _median("cold", "total_s"), None, False),
        ("process RSS after cold start (MB)", _median("cold", "rss_mb"), None, False),
    ]
    figures = {}
    for name, read, paper, higher_is_better in specs:
        mine, peer = read(ours), read(theirs)
        # A factor above 1 favours Sentinel: less time or memory, or more calls per second.
        ratio = None
        if mine and peer:
            ratio = mine / peer if higher_is_better else peer / mine
        figures[name] = {"sentinel": mine, "curator": peer, "ratio": ratio, "paper": paper}
    return figures


def spread(values: list[float | None]) -> dict[str, float] | None:
    """Median, min and max of a figure over runs (runs without it left out), or None."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {"median": statistics.median(present), "min": min(present), "max": max(present)}


def aggregate(runs: list[dict[str, dict]]) -> tuple[list, dict]:
    """Table rows and a summary of several runs' figures: per row and side, the median and the
    spread (min-max) over runs; the factor's too, taken run by run (both sides in one run)."""
    rows, summary = [], {}
    for name in runs[0]:
        per_run = [run[name] for run in runs]
        entry = {
            side: spread([figures[side] for figures in per_run])
            for side in ("sentinel", "curator", "ratio")
        }
        entry["paper"] = per_run[0]["paper"]
        summary[name] = entry
        rows.append(
            (
                name,
                _fmt_spread(entry["sentinel"]),
                _fmt_spread(entry["curator"]),
                _fmt_spread(entry["ratio"], prefix="x"),
                entry["paper"] or "-",
            )
        )
    return rows, summary


def _fmt_spread(figure: dict[str, float] | None, prefix: str = "") -> str:
    if figure is None:
        return "-"
    if figure["min"] == figure["max"]:
        return f"{prefix}{_fmt(figure['median'])}"
    return (
        f"{prefix}{_fmt(figure['median'])} "
        f"({prefix}{_fmt(figure['min'])}-{prefix}{_fmt(figure['max'])})"
    )


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.2f} M" if value >= 1e5 else f"{value:.2f}"


def pooled(runs: list[dict], side: str) -> dict[str, list]:
    """One side's samples of every run together (for the CDFs)."""
    merged: dict[str, list] = {}
    for run in runs:
        for section, samples in run[side].items():
            merged.setdefault(section, []).extend(samples)
    return merged


def plot(runs: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print(
            "plot skipped: matplotlib is not installed (pip install -e '.[benchmarks]')",
            file=sys.stderr,
        )
        return
    figure, (left, middle, right) = plt.subplots(
        1, 3, figsize=(18, 5), gridspec_kw={"width_ratios": [1, 1, 1.3]}
    )
    percent = list(range(101))
    sides = (
        (pooled(runs, "ours"), "Sentinel", "tab:blue"),
        (pooled(runs, "curator"), "Curator", "tab:red"),
    )
    for side, name, colour in sides:
        if side["lookup"]:
            quantiles = [
                statistics.median(r["quantiles_us"][q] for r in side["lookup"]) for q in percent
            ]
            left.plot(quantiles, percent, label=name, color=colour)
        for op, style in (("register", "-"), ("deregister", "--")):
            values = sorted(v for v in side[op] if v is not None)
            if values:
                middle.plot(
                    values,
                    [100 * (i + 1) / len(values) for i in range(len(values))],
                    style,
                    label=f"{name} {op}",
                    color=colour,
                )
    names = list(runs[0]["figures"])
    for row, name in enumerate(names):
        ratios = [run["figures"][name]["ratio"] for run in runs]
        present = [r for r in ratios if r is not None]
        right.scatter(present, [row] * len(present), color="tab:blue", alpha=0.6, s=18)
        if present:
            right.scatter([statistics.median(present)], [row], color="black", marker="|", s=200)
    right.axvline(1.0, color="grey", linestyle=":")
    right.set_yticks(range(len(names)), names, fontsize=8)
    right.invert_yaxis()
    left.set(
        xscale="log",
        xlabel="get_service / getInstance latency (µs)",
        ylabel="percentile",
        title=f"Warm lookup, 20 instances, round robin ({len(runs)} runs pooled)",
    )
    middle.set(
        xscale="log",
        xlabel="write issued -> applied in another cache (ms)",
        ylabel="percentile",
        title=f"Change propagation ({len(runs)} runs pooled)",
    )
    right.set(
        xscale="log",
        xlabel="Sentinel better by (x; > 1 favours Sentinel); | is the median",
        title="Each run's factor",
    )
    for axis in (left, middle):
        axis.legend()
    for axis in (left, middle, right):
        axis.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    path = RESULTS / "compare.png"
    figure.savefig(path, dpi=110)
    print(f"(plot written to {path.relative_to(RESULTS.parent.parent)})")


if __name__ == "__main__":
    main()
