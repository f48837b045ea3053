"""How fast a readiness check moves an instance, what it writes: ``python -m benchmarks.health``.

One publisher registers an instance whose readiness check asks a real HTTP server (the
standard library's, on loopback) for ``/ready``; a second client follows the service through
its cache. The endpoint flips between 200 and 503 ``--flips`` times; each row is the time from
a flip to the reader's cache holding the new status (a listener on the reader stamps it),
against the bound the check's settings give: ``interval x failures_before_down + timeout``
going down, ``interval x successes_before_up + timeout`` coming back. Then a seeded noisy
check (``--noise`` of its results fail at random) runs ``--results`` times: the status writes
it cost (the node's version) against the changes the same results would have made undamped.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from benchmarks.common import report
from sentinel import HealthCheck, Sentinel
from sentinel.events import InstancesChanged
from sentinel.health.damping import Damper
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper


class _Ready(ThreadingHTTPServer):
    daemon_threads = True
    code = 200


def _server() -> _Ready:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(server.code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    server = _Ready(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _flips(zk: LocalZooKeeper, args: argparse.Namespace) -> dict[str, list[float]]:
    check = HealthCheck.http("/ready", interval=args.interval, timeout=args.interval)
    server = _server()
    seen: dict[str, threading.Event] = {"up": threading.Event(), "down": threading.Event()}
    stamps: dict[str, float] = {}

    def heard(event: object) -> None:
        if isinstance(event, InstancesChanged):
            for _, new in event.updated:
                stamps.setdefault(new.status, time.monotonic())
                if new.status in seen:
                    seen[new.status].set()

    took: dict[str, list[float]] = {"down": [], "up": []}
    with (
        Sentinel(zk.connect_string, "bench-publisher", announce=False) as publisher,
        Sentinel(zk.connect_string, "bench-reader", announce=False) as reader,
    ):
        publisher.register("web", "p1", "127.0.0.1", server.server_port, label="a", health=check)
        reader.prefetch("web")
        reader.listen("web", heard)
        assert wait_until(lambda: [e.status for e in reader.cached_instances("web")] == ["up"])
        for flip in range(args.flips * 2):
            status, code = ("down", 503) if flip % 2 == 0 else ("up", 200)
            seen[status].clear()
            stamps.pop(status, None)
            server.code = code
            flipped = time.monotonic()
            assert seen[status].wait(30), f"never {status}"
            took[status].append(stamps[status] - flipped)
    server.shutdown()
    server.server_close()
    return took


def _noise(zk: LocalZooKeeper, args: argparse.Namespace) -> tuple[int, int, int]:
    rng = random.Random(args.seed)
    results: list[bool] = []

    def noisy() -> bool:
        results.append(rng.random() >= args.noise)
        return results[-1]

    with Sentinel(zk.connect_string, "bench-noisy", announce=False) as publisher:
        registration = publisher.register(
            "noisy", "p1", "127.0.0.1", 8080, label="a",
            health=HealthCheck.call(noisy, interval=args.interval, timeout=args.interval),
        )  # fmt: skip
        assert wait_until(lambda: len(results) >= args.results, args.results * args.interval * 3)
        writes = publisher._zk.exists(registration.path).version
    counted = results[: args.results]
    undamped = Damper(1, 1)
    return (
        counted.count(False),
        writes,
        sum(undamped.observe(result) is not None for result in counted),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flips", type=int, default=10, help="down-up cycles (default 10)")
    parser.add_argument("--interval", type=float, default=0.2, help="check interval (0.2 s)")
    parser.add_argument("--noise", type=float, default=0.2, help="failing share (default 0.2)")
    parser.add_argument("--results", type=int, default=300, help="noisy results (default 300)")
    parser.add_argument("--seed", type=int, default=41, help="the noisy check's seed (41)")
    args = parser.parse_args()
    with LocalZooKeeper() as zk:
        took = _flips(zk, args)
        failures, writes, undamped = _noise(zk, args)
    bounds = {"down": args.interval * 3 + args.interval, "up": args.interval * 2 + args.interval}
    rows = [
        (
            status,
            len(values),
            f"{1000 * statistics.median(values):.0f}",
            f"{1000 * max(values):.0f}",
            f"{1000 * bounds[status]:.0f}",
        )
        for status, values in took.items()
    ]
    report(
        "health",
        f"Flip to the reader's cache, check every {args.interval:g} s (3 down, 2 up), ms",
        ("to", "flips", "p50", "max", "bound"),
        rows,
        {"flips": took, "bounds": bounds},
    )
    report(
        "health-noise",
        f"Noisy check: {failures} of {args.results} results failed (seed {args.seed})",
        ("status writes, damped", "status changes undamped (the first included)"),
        [(writes, undamped)],
        {"failures": failures, "results": args.results, "writes": writes, "undamped": undamped},
    )


if __name__ == "__main__":
    main()
