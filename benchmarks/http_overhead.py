"""What SentinelTransport adds to an HTTP call: ``python -m benchmarks.http_overhead``.

One keep-alive HTTP server on loopback (a process of its own), registered in a fresh
ZooKeeper. Each round sends the same number of GET requests (body read) through two httpx
clients that take turns request by request, in an order reversed at every turn: one on
httpx's own transport to ``http://127.0.0.1:<port>/``, one on
:class:`~sentinel.integrations.httpx.SentinelTransport` to ``http://bench.sentinel/`` (lookup,
URL rewrite, latency report). A round's figure is the mean time per request of each; the
overhead is the median over rounds of each round's ratio, minus one. Target: below 5 % of a
loopback round trip.

The loopback round trip varies by more than the routing costs on a shared machine, so the same
two clients also run over ``httpx.MockTransport`` (an answer made in-process, no socket): the
difference between those two (median of the rounds' differences) is the routing's own cost,
which the last row sets against the loopback round trip of the same round.
"""

from __future__ import annotations

import argparse
import time

import httpx

from benchmarks.common import median_of, report, server_process
from sentinel import Sentinel
from sentinel.integrations.httpx import SentinelTransport
from sentinel.testing.zookeeper import LocalZooKeeper

TARGET = 0.05
SERVE = """
import sys
from sentinel.testing.httpserver import LoopbackHTTPServer
with LoopbackHTTPServer("bench", keep_alive=True) as server:
    print(server.port, flush=True)
    sys.stdin.read()
"""


def one_round(pair: dict[str, tuple[httpx.Client, str]], requests: int) -> dict[str, float]:
    """Mean seconds per GET of each of two clients taking turns request by request (a burst of
    load from elsewhere hits both), in an order reversed at every turn: each follows the other
    and itself as often, and the one that follows runs on caches (and a server) just woken."""
    names = list(pair)
    totals = dict.fromkeys(names, 0.0)
    clock = time.perf_counter
    for turn in range(requests):
        for name in names if turn % 2 == 0 else reversed(names):
            http, url = pair[name]
            start = clock()
            http.get(url).read()
            totals[name] += clock() - start
    return {name: total / requests for name, total in totals.items()}


def main(argv: list[str] | None = None) -> None:
    """Run the rounds, print the table and write ``benchmarks/results/http_overhead.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--requests", type=int, default=300, help="per client and round")
    args = parser.parse_args(argv)
    canned = httpx.MockTransport(lambda request: httpx.Response(200, content=b"{}"))
    with (
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "bench-http") as sentinel,
        server_process(SERVE) as port,
        httpx.Client(transport=httpx.HTTPTransport()) as plain,
        httpx.Client(transport=SentinelTransport(sentinel)) as routed,
        httpx.Client(transport=canned) as plain_canned,
        httpx.Client(transport=SentinelTransport(sentinel, canned)) as routed_canned,
    ):
        sentinel.register("bench", "p1", "127.0.0.1", port)
        direct_url = f"http://127.0.0.1:{port}/"
        loopback = {"httpx": (plain, direct_url), "sentinel": (routed, "http://bench.sentinel/")}
        mock = {
            "httpx_mock": (plain_canned, direct_url),
            "sentinel_mock": (routed_canned, "http://bench.sentinel/"),
        }
        one_round(loopback, 50)  # connections opened, service loaded
        rounds = [
            {**one_round(loopback, args.requests), **one_round(mock, args.requests)}
            for _ in range(args.rounds)
        ]
    for r in rounds:
        r["ratio"] = r["sentinel"] / r["httpx"]
        r["routing"] = r["sentinel_mock"] - r["httpx_mock"]
        r["routing_share"] = r["routing"] / r["httpx"]
    direct, through = median_of(rounds, "httpx"), median_of(rounds, "sentinel")
    overhead = median_of(rounds, "ratio") - 1
    routing, share = median_of(rounds, "routing"), median_of(rounds, "routing_share")
    rows = [
        ["httpx's HTTPTransport, loopback", f"{direct * 1e6:.0f}", ""],
        ["SentinelTransport, loopback", f"{through * 1e6:.0f}", f"{overhead:+.1%}"],
        ["httpx.MockTransport", f"{median_of(rounds, 'httpx_mock') * 1e6:.1f}", ""],
        [
            "SentinelTransport over MockTransport",
            f"{median_of(rounds, 'sentinel_mock') * 1e6:.1f}",
            f"+{routing * 1e6:.1f} µs = {share:.1%} of the loopback round trip",
        ],
    ]
    report(
        "http_overhead",
        f"GET on loopback, keep-alive: medians of {args.rounds} interleaved rounds of "
        f"{args.requests} requests (target overhead < {TARGET:.0%}: "
        f"{'met' if overhead < TARGET and share < TARGET else 'missed'})",
        ["transport", "µs per request", "overhead"],
        rows,
        {
            "rounds": rounds,
            "requests": args.requests,
            "median_httpx_s": direct,
            "median_sentinel_s": through,
            "overhead": overhead,
            "routing_s": routing,
            "routing_share": share,
            "target": TARGET,
            "met": overhead < TARGET and share < TARGET,
        },
    )


if __name__ == "__main__":
    main()
