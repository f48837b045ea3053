"""xDS at size: ``python -m benchmarks.xds_size``.

One ZooKeeper, one ``sentinel agent --xds`` (a process of its own) and, for each size in
``--instances`` (one service of that many instances, each a locality of the service's one
assignment) and each count in ``--streams``, that many raw ADS streams (State of the World,
grpcio's asyncio client in this process, at most 8 streams per connection as the agent
allows) asking for the service's assignment and acknowledging each response as a gRPC
client does. Then ``--changes`` changes, one at a time, each made once every stream has
received the one before, to the first instance (``--change``: ``weight``, the default, its
weight between 0.5 and 1, the others' 1; ``status``, drained and back; ``heaviest``, its
weight between 2 and 3, which re-weights every locality, scaled to the heaviest). Per change:

* the bytes sent to all streams (the gRPC messages' bytes, as the clients read them; HTTP/2
  framing aside), and per stream;
* the agent's CPU (user + system, ``/proc/<pid>/stat``, in clock ticks of 10 ms: the total
  over the changes, divided);
* propagation: from just before the write to the first and to the last stream receiving the
  new assignment (the host's monotonic clock).

``--before PATH``: a tree whose ``sentinel`` package the agent runs as ``before`` (for
instance ``git archive <commit> | tar -x -C PATH``), this tree's as ``after``, in one run on
the same ZooKeeper; their order alternates from run to run (``--runs``). The default matrix
is small (a few minutes); ``--full`` measures 10, 1,000 and 10,000 instances to 1, 10 and
100 streams.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import itertools
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from benchmarks.agent import NAMESPACE, cpu_seconds, serving, start_agent
from benchmarks.common import percentiles, report
from sentinel import Sentinel
from sentinel.agent.xds_resources import ENDPOINTS
from sentinel.testing.zookeeper import LocalZooKeeper

ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
STREAMS_PER_CONNECTION = 8  # the agent's grpc.max_concurrent_streams
# Seconds the streams may take to receive the first assignment (the agent loads 10,000
# instances first), and then each change.
FIRST_TIMEOUT = 120.0
CHANGE_TIMEOUT = 60.0
# What a change of the first instance (of weight 1, like the others) writes, by --change and
# the number of the service's changes so far (each differs from the one before: each is sent).
CHANGES = {
    # a lighter instance: its locality's weight alone changes
    "weight": lambda n: {"weight": 0.5 if n % 2 == 0 else 1},
    # drained and back: its locality's health alone changes
    "status": lambda n: {"status": "draining" if n % 2 == 0 else "up"},
    # the heaviest instance: every locality's weight (scaled to the heaviest's) changes
    "heaviest": lambda n: {"weight": 2 + n % 2},
}
_THIS_TREE = str(Path(__file__).resolve().parent.parent)


class Streams:
    """``count`` ADS streams asking for the assignment of ``service``, each acknowledging
    every response (its version and nonce) as a gRPC client does; what each received."""

    def __init__(self, address: str, service: str, count: int) -> None:
        self.received = [0] * count  # responses per stream
        self.bytes = 0  # over every stream
        self.arrivals: list[list[float]] = [[] for _ in range(count)]
        self._service = service
        self._channels = [
            grpc.aio.insecure_channel(address, [("grpc.use_local_subchannel_pool", 1)])
            for _ in range(0, count, STREAMS_PER_CONNECTION)
        ]
        self._tasks: list[asyncio.Task[None]] = []
        self._target = 1
        self._reached = asyncio.Event()
        self._count = count
        self.failure: BaseException | None = None  # a stream's, ending the measurement

    def start(self) -> None:
        for index in range(self._count):
            channel = self._channels[index // STREAMS_PER_CONNECTION]
            self._tasks.append(asyncio.ensure_future(self._stream(channel, index)))

    async def _stream(self, channel: grpc.aio.Channel, index: int) -> None:
        try:
            await self._follow(channel, index)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.failure = exc
            self._reached.set()

    async def _follow(self, channel: grpc.aio.Channel, index: int) -> None:
        call = channel.stream_stream(
            ADS_METHOD, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString
        )()
        ask = discovery_pb2.DiscoveryRequest(type_url=ENDPOINTS, resource_names=[self._service])
        await call.write(ask)
        while (data := await call.read()) is not grpc.aio.EOF:
            arrived = time.monotonic()
            response = discovery_pb2.DiscoveryResponse.FromString(data)
            self.bytes += len(data)
            self.arrivals[index].append(arrived)
            self.received[index] += 1
            if min(self.received) >= self._target:
                self._reached.set()
            ask.version_info, ask.response_nonce = response.version_info, response.nonce
            await call.write(ask)

    async def until(self, responses: int, timeout: float) -> None:
        """Return once every stream has received ``responses`` responses."""
        self._target = responses
        self._reached.clear()
        if min(self.received) < responses:
            try:
                await asyncio.wait_for(self._reached.wait(), timeout)
            except TimeoutError:
                counts = collections.Counter(self.received)
                raise RuntimeError(
                    f"streams by responses received, {responses} awaited: {dict(counts)}"
                ) from None
        if self.failure is not None:
            raise RuntimeError("an ADS stream failed") from self.failure

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self._channels:
            await channel.close()


async def measure(
    address: str,
    agent_pid: int,
    writer: Sentinel,
    service: str,
    registration,
    made: Iterator[int],
    count: int,
    changes: int,
    kind: str,
) -> tuple[dict, object]:
    """``changes`` changes of one service to ``count`` streams: the row's figures, and the
    changed instance's registration."""
    loop = asyncio.get_running_loop()
    streams = Streams(address, service, count)
    streams.start()
    try:
        await streams.until(1, FIRST_TIMEOUT)
        bytes_before, cpu_before = streams.bytes, cpu_seconds(agent_pid)
        first, last = [], []
        for change in range(changes):
            update = functools.partial(
                writer.update_registration, registration, **CHANGES[kind](next(made))
            )
            started = time.monotonic()
            registration = await loop.run_in_executor(None, update)
            await streams.until(2 + change, CHANGE_TIMEOUT)
            arrivals = [times[1 + change] - started for times in streams.arrivals]
            first.append(min(arrivals))
            last.append(max(arrivals))
        cpu = cpu_seconds(agent_pid) - cpu_before
        sent = streams.bytes - bytes_before
        extra = sum(streams.received) - len(streams.received) * (1 + changes)
    finally:
        await streams.close()
    return {
        "bytes_per_change": sent / changes,
        "bytes_per_stream": sent / changes / count,
        "agent_cpu_per_change": cpu / changes,
        "first_stream": percentiles(first),
        "last_stream": percentiles(last),
        "extra_responses": extra,  # responses beyond one per change per stream
    }, registration


async def measure_all(
    hosts: str, writer: Sentinel, directory: str, services: dict, trees: dict, args
) -> list[dict]:
    """Every run, code, size and stream count: a row each (in one event loop: grpc.aio
    binds to the first it runs in)."""
    rows = []
    for run in range(args.runs):
        order = sorted(trees) if run % 2 == 0 else sorted(trees, reverse=True)
        for code in order:
            with ExitStack() as stack:
                address = f"unix:{directory}/xds-{run}-{code}.sock"
                agent = start_agent(
                    stack,
                    hosts,
                    f"{directory}/agent-{run}-{code}.sock",
                    "--xds",
                    address,
                    # python -m puts its directory first on the path, before PYTHONPATH
                    env={**os.environ, "PYTHONPATH": trees[code]},
                    cwd=trees[code],
                )
                serving(agent)
                for size, count in itertools.product(args.instances, args.streams):
                    service, registration, made = services[size]
                    figures, registration = await measure(
                        address,
                        agent.pid,
                        writer,
                        service,
                        registration,
                        made,
                        count,
                        args.changes,
                        args.change,
                    )
                    services[size] = (service, registration, made)
                    row = {"run": run + 1, "instances": size, "streams": count, "code": code}
                    row.update(figures)
                    rows.append(row)
                    brief = {k: v for k, v in row.items() if not isinstance(v, dict)}
                    print(json.dumps(brief), file=sys.stderr, flush=True)
    return rows


def populate(writer: Sentinel, service: str, instances: int):
    """``instances`` instances of ``service`` (each an IP address, as xDS needs); the first's
    registration, whose weight the changes alternate."""
    writer.ensure_service(service)

    def one(index: int):
        return writer.register(
            service, "default", f"10.{index // 250}.{index % 250}.1", 5432, label=f"r{index}"
        )

    with ThreadPoolExecutor(16) as pool:  # kazoo pipelines the requests of several threads
        first, *_ = pool.map(one, range(instances))
    return first


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--changes", type=int, default=5, help="changes per row")
    parser.add_argument(
        "--change", choices=sorted(CHANGES), default="weight", help="what each change writes"
    )
    parser.add_argument("--runs", type=int, default=1, help="repeats of the whole measurement")
    parser.add_argument(
        "--full",
        action="store_true",
        help="10, 1,000 and 10,000 instances to 1, 10 and 100 streams",
    )
    parser.add_argument("--before", help="a tree whose sentinel the agent runs as `before`")
    args = parser.parse_args(argv)
    if args.full:
        args.instances, args.streams = [10, 1000, 10_000], [1, 10, 100]
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    trees = {"after": _THIS_TREE, **({"before": args.before} if args.before else {})}
    with (
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "xds-size-writer", NAMESPACE, announce=False) as writer,
        tempfile.TemporaryDirectory(prefix="xds-size-") as directory,
    ):
        services = {}
        for size in args.instances:
            started = time.monotonic()
            registration = populate(writer, f"n{size}", size)
            services[size] = (f"n{size}", registration, itertools.count())
            print(f"{size} instances in {time.monotonic() - started:.1f} s", file=sys.stderr)
        rows = asyncio.run(measure_all(zk.connect_string, writer, directory, services, trees, args))
    report(
        "xds_size",
        f"xDS State of the World: {args.changes} changes per row ({args.change})",
        (
            "run",
            "instances",
            "streams",
            "code",
            "bytes/change (all streams)",
            "bytes/stream",
            "agent CPU/change",
            "to first stream p50 ms",
            "to last stream p50 / max ms",
        ),
        [
            (
                r["run"],
                f"{r['instances']:,}",
                r["streams"],
                r["code"],
                f"{r['bytes_per_change']:,.0f}",
                f"{r['bytes_per_stream']:,.0f}",
                f"{r['agent_cpu_per_change'] * 1000:.0f} ms",
                f"{r['first_stream']['p50'] * 1000:.1f}",
                f"{r['last_stream']['p50'] * 1000:.1f} / {r['last_stream']['max'] * 1000:.1f}",
            )
            for r in rows
        ],
        {"args": vars(args), "rows": rows},
    )
    if args.before:
        print("\nmedians over runs, after against before")
        for size, count in itertools.product(args.instances, args.streams):
            cells = {}
            for code in trees:
                same = [
                    r
                    for r in rows
                    if (r["instances"], r["streams"], r["code"]) == (size, count, code)
                ]
                cells[code] = (
                    statistics.median(r["agent_cpu_per_change"] for r in same),
                    statistics.median(r["last_stream"]["p50"] for r in same),
                )
            (cpu_b, last_b), (cpu_a, last_a) = cells["before"], cells["after"]
            print(
                f"{size:>6,} instances, {count:>3} streams: agent CPU/change "
                f"{cpu_b * 1000:.0f} -> {cpu_a * 1000:.0f} ms, to the last stream "
                f"{last_b * 1000:.1f} -> {last_a * 1000:.1f} ms"
            )


if __name__ == "__main__":
    main()
