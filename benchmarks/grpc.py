"""gRPC through Sentinel: ``python -m benchmarks.grpc [--via integration]``.

Two grpcio servers (``sentinel.testing.grpcserver``, each a process of its own, so that their
threads do not share the benchmark's interpreter lock) on loopback, registered in a fresh
ZooKeeper. Two measures, each written to ``benchmarks/results/grpc_<via>.json``:

- **Per-call overhead.** The same unary call (``WHO``: empty request, the server's name back)
  through a plain ``grpcio`` channel to one server and through the routed channel of ``--via``
  to the same server (its only registered instance), taking turns call by call in an order
  reversed at every turn, each call timed alone with the same clock around it. Per side: the
  median and percentiles of every call, and the median over rounds of each round's mean; the
  overhead is the median over rounds of the rounds' ratios, minus one.
- **Registration to first call.** A second server is registered under a new label while a
  caller keeps calling the service through the routed channel; the figure is the time from
  just before ``register`` to the first answer from the new server (the registration's write,
  the change reaching the caller's cache, a new channel to it, the call), and, beside it, the
  time to the reading client's cache telling its listeners (the propagation part). Then it
  is deregistered, and the next trial waits until no call reaches it.

``--via`` names how the routed channel resolves: ``integration`` is
:class:`sentinel.integrations.grpc.SentinelChannel` in this process; ``xds`` is a plain
``grpcio`` channel to ``xds:///bench``, resolved by gRPC's own xDS client from the agent's
xDS server (:class:`sentinel.agent.xds.XdsServer`, serving the reading client's cache as the
host agent serves its own, on a Unix socket in this process: the reader's cache is the
agent's). Another way is one more entry in :data:`VIAS`: a function that opens the routed
channel, given the reading client and the service.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import grpc

from benchmarks.common import median_of, percentiles, report, server_process
from sentinel import Sentinel
from sentinel.events import InstancesChanged
from sentinel.integrations.grpc import SentinelChannel
from sentinel.testing.grpcserver import WHO
from sentinel.testing.zookeeper import LocalZooKeeper

SERVICE = "bench"
SERVE = """
import sys
from sentinel.testing.grpcserver import LoopbackGRPCServer
with LoopbackGRPCServer(sys.argv[1]) as server:
    print(server.port, flush=True)
    sys.stdin.read()
"""


@contextmanager
def via_integration(reader: Sentinel, service: str) -> Iterator[grpc.Channel]:
    """The routed channel of ``--via integration``: a SentinelChannel of ``reader``."""
    with SentinelChannel(reader, service) as channel:
        yield channel


@contextmanager
def via_xds(reader: Sentinel, service: str) -> Iterator[grpc.Channel]:
    """The routed channel of ``--via xds``: ``xds:///service`` through an xDS server on
    ``reader``'s cache (the agent's), the bootstrap in ``GRPC_XDS_BOOTSTRAP_CONFIG``."""
    from sentinel.agent.xds import XdsServer
    from sentinel.agent.xds_bootstrap import bootstrap_json

    with (
        tempfile.TemporaryDirectory(prefix="bench-xds-") as directory,
        XdsServer(reader, f"unix:{directory}/xds.sock") as server,
    ):
        os.environ["GRPC_XDS_BOOTSTRAP_CONFIG"] = bootstrap_json(server.address, "bench")
        with grpc.insecure_channel(f"xds:///{service}") as channel:
            yield channel


#: How the routed channel resolves, by ``--via`` name.
VIAS: dict[str, Callable[[Sentinel, str], AbstractContextManager[grpc.Channel]]] = {
    "integration": via_integration,
    "xds": via_xds,
}


def one_round(calls: dict[str, Callable[[bytes], bytes]], count: int) -> dict[str, list[float]]:
    """``count`` calls of each side, taking turns call by call in an order reversed at every
    turn (each follows the other and itself as often); every call's seconds, by side."""
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter
    for turn in range(count):
        for name in names if turn % 2 == 0 else reversed(names):
            call = calls[name]
            start = clock()
            call(b"")
            samples[name].append(clock() - start)
    return samples


def overhead(
    plain: Callable[[bytes], bytes], routed: Callable[[bytes], bytes], rounds: int, count: int
) -> dict[str, Any]:
    """The per-call measure: per-round means and ratios, percentiles of every call."""
    calls = {"plain": plain, "routed": routed}
    one_round(calls, 100)  # connections made, service loaded, code paths warm
    per_round = []
    every: dict[str, list[float]] = {"plain": [], "routed": []}
    for _ in range(rounds):
        samples = one_round(calls, count)
        means = {name: sum(s) / len(s) for name, s in samples.items()}
        per_round.append({**means, "ratio": means["routed"] / means["plain"]})
        for name, s in samples.items():
            every[name].extend(s)
    return {
        "rounds": per_round,
        "median_plain_s": median_of(per_round, "plain"),
        "median_routed_s": median_of(per_round, "routed"),
        "overhead": median_of(per_round, "ratio") - 1,
        "plain": percentiles(every["plain"]),
        "routed": percentiles(every["routed"]),
    }


def registration_to_first_call(
    publisher: Sentinel,
    reader: Sentinel,
    call: Callable[[bytes], bytes],
    port: int,
    trials: int,
    limit: float,
) -> tuple[list[float], list[float]]:
    """Seconds from just before registering the server ``new`` (at ``port``) to its first
    answer, calls made back to back meanwhile, and to the moment ``reader``'s cache told its
    listeners (the part of it that is propagation); each trial ends with its deregistration."""
    seen: dict[str, float] = {}
    heard = threading.Condition()

    def note(event: object) -> None:
        if isinstance(event, InstancesChanged):
            now = time.perf_counter()
            with heard:
                for endpoint in event.added:
                    seen.setdefault(endpoint.label, now)
                heard.notify_all()

    unlisten = reader.listen(SERVICE, note)
    answered, propagated = [], []
    try:
        for trial in range(trials):
            label = f"new-{trial}"
            start = time.perf_counter()
            registration = publisher.register(SERVICE, "p1", "127.0.0.1", port, label=label)
            while call(b"") != b"new":
                if time.perf_counter() - start > limit:
                    raise TimeoutError(f"trial {trial}: no call reached the new instance")
            answered.append(time.perf_counter() - start)
            # The cache's listeners run one after another on its worker: the agent's xDS
            # server's (--via xds) may have sent the change, and the call reached the new
            # instance, before this one ran.
            with heard:
                if not heard.wait_for(lambda: label in seen, limit):  # noqa: B023
                    raise TimeoutError(f"trial {trial}: the reader's cache never told of it")
            propagated.append(seen[label] - start)
            publisher.deregister(registration)
            settled = time.perf_counter()
            while any(call(b"") == b"new" for _ in range(4)):  # gone from the caller's view
                if time.perf_counter() - settled > limit:
                    raise TimeoutError(f"trial {trial}: calls still reach the deregistered one")
    finally:
        unlisten()
    return answered, propagated


def main(argv: list[str] | None = None) -> None:
    """Run both measures, print the tables and write ``benchmarks/results/grpc_<via>.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--via", choices=sorted(VIAS), default="integration")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=300, help="per side and round")
    parser.add_argument("--trials", type=int, default=30, help="registrations timed")
    args = parser.parse_args(argv)
    with (
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "bench-grpc-publisher") as publisher,
        Sentinel(zk.connect_string, "bench-grpc") as reader,
        server_process(SERVE, "old") as old_port,
        server_process(SERVE, "new") as new_port,
        grpc.insecure_channel(f"127.0.0.1:{old_port}") as plain_channel,
    ):
        publisher.register(SERVICE, "p1", "127.0.0.1", old_port, label="old")
        reader.prefetch(SERVICE)
        with VIAS[args.via](reader, SERVICE) as routed_channel:
            routed = routed_channel.unary_unary(WHO)
            per_call = overhead(plain_channel.unary_unary(WHO), routed, args.rounds, args.calls)
            first_call, in_cache = registration_to_first_call(
                publisher, reader, routed, new_port, args.trials, limit=30.0
            )
    first, cached = percentiles(first_call), percentiles(in_cache)
    plain, routed_ = per_call["plain"], per_call["routed"]
    rows = [
        [
            "plain grpcio channel",
            f"{per_call['median_plain_s'] * 1e6:.0f}",
            f"{plain['p50'] * 1e6:.0f}",
            f"{plain['p99'] * 1e6:.0f}",
            "",
        ],
        [
            f"routed ({args.via})",
            f"{per_call['median_routed_s'] * 1e6:.0f}",
            f"{routed_['p50'] * 1e6:.0f}",
            f"{routed_['p99'] * 1e6:.0f}",
            f"{per_call['overhead']:+.1%}",
        ],
    ]
    report(
        f"grpc_{args.via}",
        f"unary call on loopback: {args.rounds} interleaved rounds of {args.calls} calls per side; "
        f"registration to first call: {args.trials} trials "
        f"(p50 {first['p50'] * 1e3:.1f} ms, p99 {first['p99'] * 1e3:.1f} ms, "
        f"max {first['max'] * 1e3:.1f} ms; of which in the reader's cache: p50 "
        f"{cached['p50'] * 1e3:.1f} ms, p99 {cached['p99'] * 1e3:.1f} ms)",
        ["channel", "µs per call (median of round means)", "p50 µs", "p99 µs", "overhead"],
        rows,
        {
            "via": args.via,
            "calls": args.calls,
            "per_call": per_call,
            "registration_to_first_call_s": first,
            "registration_to_first_call_samples_s": first_call,
            "registration_to_reader_cache_s": cached,
            "registration_to_reader_cache_samples_s": in_cache,
        },
    )


if __name__ == "__main__":
    main()
