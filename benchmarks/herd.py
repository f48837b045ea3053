"""Reconnect storm: ``python -m benchmarks.herd``.

Many clients follow one sharded service through one TCP relay; the relay drops every
connection at once (as a server restart or a network blip would), and every client
reconnects with its session and re-syncs. ZooKeeper itself counts the reads
(``mntr``'s ``read_per_namespace`` counter for the clients' namespace), and a sampler turns it
into the worst 100 ms. The design's bound: at most one re-sync per reconnection (reconnections
within ``resync_jitter`` share one), and a re-sync reads each followed node once, so

    reads <= reconnections x (policy spec + buckets + per service: spec, 2 listings, each node)

and one drop costs each client one reconnection (more only if a loaded machine makes a client
miss its heartbeat meanwhile).

``--watch-mode`` (see ``benchmarks.zkcost.WATCH_MODES``): ``one-shot`` watches are dropped on
every disconnection, so each reconnection re-reads as above; ``persistent`` watches are kept
within the session and the server reports only what changed while the connection was down, so
an unchanged fleet reads nothing (bound 0). The default measures both, one after the other.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from benchmarks.common import report
from benchmarks.zkcost import WATCH_MODES
from sentinel import Sentinel
from sentinel.cache.config import CacheConfig
from sentinel.events import ConnectionChanged
from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper, four_letter_word

NAMESPACE = "/herd"
BUCKETS = 16
INSTANCES = 5


@dataclass(frozen=True)
class Storm:
    """What one storm cost: reads counted by ZooKeeper, against the design's bound."""

    mode: str
    clients: int
    jitter: float
    drops: int
    reads: int
    bound: int
    resyncs: int
    reconnections: int
    peak_reads_per_100ms: int
    seconds: float


def reads_counted(zk: LocalZooKeeper) -> int:
    """Read requests ZooKeeper has served under the namespace, over every member."""
    total = 0
    word = f"zk_cnt_{NAMESPACE.strip('/')}_read_per_namespace"
    for member in zk:
        host, port = member.connect_string.split(":")
        for line in four_letter_word(host, int(port), "mntr", timeout=5).splitlines():
            name, _, value = line.partition("\t")
            if name == word:
                total += int(value)
    return total


def reads_per_resync(mode: str = "one-shot") -> int:
    """What one client's re-sync reads when nothing changed. One-shot: the policy's spec and
    buckets, then the service's spec, its two listings (instances, metrics) and every node in
    them. Persistent: nothing (the watches were kept; the server reported no change)."""
    return (1 + BUCKETS) + (1 + 2 + 2 * INSTANCES) if mode == "one-shot" else 0


@contextmanager
def world(zk: LocalZooKeeper) -> Iterator[None]:
    """One sharded service: INSTANCES instances (held by a session of their own while the
    fleet storms) with metrics, and keys in every bucket."""
    with Sentinel(zk.connect_string, "herd-writer", NAMESPACE, announce=False) as writer:
        writer.shard_maps.create("tenants", "directory", buckets=BUCKETS)
        writer.ensure_service("db", shard_policy="tenants")
        writer.shard_maps.assign_many("tenants", {f"k{i}": f"p{i % 2}" for i in range(200)})
        for i in range(INSTANCES):
            writer.register("db", f"p{i % 2}", "127.0.0.1", 5432 + i, label=f"r{i}")
            writer.update_metrics("db", f"p{i % 2}", f"r{i}", {"load": i})
        yield


@contextmanager
def fleet(
    zk: LocalZooKeeper, clients: int, jitter: float, mode: str
) -> Iterator[tuple[TcpProxy, list]]:
    """``clients`` started clients, all through one relay, each following the service."""
    (member,) = zk.members
    proxy = TcpProxy("127.0.0.1", member.client_port)
    with ExitStack() as stack:
        stack.callback(proxy.close)
        sentinels = []
        for i in range(clients):
            client = Sentinel(
                proxy.address,
                f"herd-{i}",
                NAMESPACE,
                cache=CacheConfig(resync_jitter=jitter, persistent_watches=WATCH_MODES[mode]),
                session_timeout=30,
            )
            stack.enter_context(client)
            client.prefetch("db")
            sentinels.append(client)
        yield proxy, sentinels


def storm(
    zk: LocalZooKeeper, clients: int, jitter: float, drops: int = 1, mode: str = "one-shot"
) -> Storm:
    """Drop every connection ``drops`` times (0.1 s apart) and count the re-syncs' reads."""
    with fleet(zk, clients, jitter, mode) as (proxy, sentinels):
        reconnections: list[float] = []  # list.append is atomic: no lock needed
        for client in sentinels:
            client.listen(None, lambda e: _count_reconnection(e, reconnections))
        # A client of a loaded machine may have reconnected while the fleet started: count
        # from a quiet moment (no read for a second), so both figures cover the same storm.
        assert wait_until(_quiet(zk), timeout=60, interval=0), "the fleet never went quiet"
        reconnections.clear()
        resyncs_before = sum(c.cache_stats.resyncs for c in sentinels)
        samples: list[tuple[float, int]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                samples.append((time.monotonic(), reads_counted(zk)))
                time.sleep(0.02)

        before = reads_counted(zk)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        for drop in range(drops):
            proxy.cut()
            proxy.restore()
            if drop < drops - 1:
                time.sleep(0.1)  # the storm's shape is an input
        expected = resyncs_before + clients

        def settled() -> bool:
            return (
                all(c.connection_state == "connected" for c in sentinels)
                and sum(c.cache_stats.resyncs for c in sentinels) >= expected
            )

        assert wait_until(settled, timeout=120, interval=0.05), "the fleet never re-synced"
        assert wait_until(_quiet(zk), timeout=60, interval=0), "reads never stopped"
        elapsed = time.monotonic() - started - 1.0  # the quiet second is not the storm's
        done.set()
        sampler.join()
        reads = reads_counted(zk) - before
        resyncs = sum(c.cache_stats.resyncs for c in sentinels) - resyncs_before
    return Storm(
        mode=mode,
        clients=clients,
        jitter=jitter,
        drops=drops,
        reads=reads,
        bound=len(reconnections) * reads_per_resync(mode),
        resyncs=resyncs,
        reconnections=len(reconnections),
        peak_reads_per_100ms=_peak(samples, 0.1),
        seconds=elapsed,
    )


def _count_reconnection(event: object, reconnections: list[float]) -> None:
    if isinstance(event, ConnectionChanged) and event.state == "connected":
        reconnections.append(event.at)


def _quiet(zk: LocalZooKeeper) -> Callable[[], bool]:
    """A condition: no read was counted during the last second."""

    def quiet() -> bool:
        before = reads_counted(zk)
        time.sleep(1.0)  # the quiet second is the condition itself, not a synchronisation
        return reads_counted(zk) == before

    return quiet


def _peak(samples: list[tuple[float, int]], window: float) -> int:
    """The most reads counted within any ``window`` seconds (from 20 ms samples)."""
    peak, start = 0, 0
    for end in range(len(samples)):
        while samples[end][0] - samples[start][0] > window:
            start += 1
        peak = max(peak, samples[end][1] - samples[start][1])
    return peak


def _row(s: Storm) -> tuple[object, ...]:
    return (
        s.mode,
        s.jitter,
        s.drops,
        s.reconnections,
        s.resyncs,
        s.reads,
        s.bound,
        s.peak_reads_per_100ms,
        f"{s.seconds:.2f}",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument(
        "--watch-mode",
        default="one-shot,persistent",
        help=f"comma-separated, measured one after the other ({', '.join(WATCH_MODES)})",
    )
    args = parser.parse_args(argv)
    modes = args.watch_mode.split(",")
    if unknown := [m for m in modes if m not in WATCH_MODES]:
        parser.error(
            f"unknown watch mode {', '.join(unknown)} (available: {', '.join(WATCH_MODES)})"
        )
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # 200 clients x "connection dropped"
    results = []
    with LocalZooKeeper() as zk, world(zk):
        for mode in modes:
            for jitter, drops in ((0.0, 1), (0.5, 1), (0.5, 5)):
                results.append(storm(zk, args.clients, jitter, drops, mode))
    report(
        "herd",
        f"Reconnect storm: {args.clients} clients, one relay dropped; reads counted by "
        f"ZooKeeper (bound: reconnections x reads per re-sync of an unchanged client: "
        + ", ".join(f"{m} {reads_per_resync(m)}" for m in modes)
        + ")",
        (
            "mode",
            "jitter s",
            "drops",
            "reconnections",
            "re-syncs",
            "reads",
            "bound",
            "peak reads/100 ms",
            "settled s",
        ),
        [_row(s) for s in results],
        {
            "storms": [s.__dict__ for s in results],
            "reads_per_resync": {m: reads_per_resync(m) for m in modes},
        },
    )


if __name__ == "__main__":
    main()
