"""Nothing grows under churn: ``python -m benchmarks.soak`` (issue 53).

One real ZooKeeper (two with regions: the second is ``west``), a host agent serving xDS
(:mod:`benchmarks.soak_agent`, a process of its own) and, in this process, a writer, the
measured client (``reader``), the agent's processes and its xDS clients, under compressed
churn for ``--minutes``:

- instances registered, each with a fresh label and address, and the oldest of its service
  deregistered, so that a table kept per instance would grow with every one ever seen;
- their metrics written; lookups, and feedback reported for what was picked (failures and
  latencies, for instances that then go away);
- instances drained and back (``status``), and each service's health-checked instance
  flipping down and up as its check fails and passes again;
- services created and retired (:func:`sentinel.registry.retire.retire_service`), each with a
  listener added and removed;
- with regions, failover rules to ``west`` set and removed (warm, so the region follows them);
- the reader's credential for a service rotated (:meth:`CredentialWriter.rotate
  <sentinel.auth.writer.CredentialWriter.rotate>`: published, confirmed, the old revoked);
- processes joining the agent (a client with ``agent=`` its socket, following two services)
  and leaving it, and raw ADS streams opening on its xDS server (asking for two services'
  assignments, acknowledging each response as a gRPC client does) and closing.

The feedback runs on a clock ``--speed`` times faster than the wall's, so that a run of
minutes holds the hours of its ejections, windows and horizons; a region no rule needs is
closed after ``CLOSE_AFTER`` divided by the same factor.

Every ``--every`` seconds it samples this process and the agent's: RSS, threads, open
descriptors, the interpreter's heap (blocks allocated, objects the collector tracks, and
malloc's bytes in use and free), every internal table (each dict, set, list, tuple or deque
reachable through objects of ``sentinel`` and ``kazoo``: from the clients here, from the agent
server and the xDS server there; found by walking them, so that a table added later is
measured too); and each server's watches (4lw ``wchs``) and the agent session's (``wchc``).

A figure's slope is the least-squares fit after the warm-up (``--warmup``, a fraction of the
run), per hour, with a 95 % confidence interval from its standard error (the larger of the
plain one and Newey-West's, whose lags allow for samples that follow each other closely),
and the same over the later half of that window. It is *growing* when both intervals are
above zero and the fit rises over the window by more than 1 (a count) or 1 % (a size in kB);
it *levels off* when only the whole window's is; else it is within noise. ``--plots DIR``
draws each figure over time with its fit (``soak-processes.png``, ``soak-tables.png``). At
the warm-up's end and at the end each process counts its objects by type (and, with
``--tracemalloc``, its allocations by line): what grew most between the two is printed.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import itertools
import json
import logging
import math
import os
import random
import statistics
import sys
import tempfile
import textwrap
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, suppress
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from benchmarks.agent import ask, start_worker
from benchmarks.common import report
from benchmarks.zkcost import watches
from sentinel import Sentinel
from sentinel.auth import ClientKeyring
from sentinel.auth.config import AuthConfig
from sentinel.errors import RegistryConflict, RotationFailed
from sentinel.feedback import InstanceFeedback
from sentinel.health import HealthCheck
from sentinel.publisher import Registration
from sentinel.regions import Failover, Region, Regions, remotes
from sentinel.registry.retire import retire_service
from sentinel.testing.zookeeper import LocalZooKeeper, four_letter_word

NAMESPACE = "/soak"
READER = "soak-reader"
# Objects of these packages are walked into; anything else is a leaf.
_WALKED = ("sentinel", "kazoo")
_CONTAINERS = (dict, set, frozenset, list, tuple, collections.deque)
_MAX_DEPTH = 6
# The tables' names begin with their root's: the clients here, the servers in the agent.
_TABLES = (
    "reader.",
    "writer.",
    "west.",
    "telemetry.",
    "agent: agent.",
    "agent: xds.",
    "agent: telemetry.",
)
_Z95 = statistics.NormalDist().inv_cdf(0.975)
# The census's lines: the types (and allocation sites) that grew most.
_CENSUS_TOP = 12
# An allocation site is kept in a census from this size on (smaller ones are noise).
_TRACED_FROM = 1024


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _mallinfo() -> Callable[[], _Mallinfo2] | None:
    """glibc's ``mallinfo2`` (2.33 and later), None elsewhere."""
    try:
        function = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _Mallinfo2
    return function


_MALLINFO = _mallinfo()


def process_figures() -> dict[str, float]:
    """This process's RSS (kB), threads and open descriptors."""
    with open("/proc/self/status") as lines:
        status = dict(line.split(":", 1) for line in lines if ":" in line)
    return {
        "rss_kb": float(status["VmRSS"].split()[0]),
        "threads": float(status["Threads"]),
        "fds": float(len(os.listdir("/proc/self/fd"))),
    }


def heap_figures() -> dict[str, float]:
    """What the RSS is made of: the interpreter's blocks allocated (its small-object
    allocator's and the large ones it asked malloc for), the objects the garbage collector
    tracks, and malloc's bytes in use and free in its heaps (kB; fragmentation is free bytes
    the allocator cannot return to the system)."""
    figures = {
        "py blocks": float(sys.getallocatedblocks()),
        "gc objects": float(len(gc.get_objects())),
    }
    if _MALLINFO is not None:
        info = _MALLINFO()
        figures["malloc in use kb"] = (info.uordblks + info.hblkhd) / 1024
        figures["malloc free kb"] = info.fordblks / 1024
    return figures


def census() -> dict[str, dict[str, int]]:
    """Objects by type, and with tracemalloc on, bytes allocated by source line (from
    :data:`_TRACED_FROM`): what :func:`grown` compares. Garbage is collected first: what
    is counted is held, not waiting for the collector."""
    gc.collect()
    types = collections.Counter(
        f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects()
    )
    lines: dict[str, int] = {}
    if tracemalloc.is_tracing():
        for stat in tracemalloc.take_snapshot().statistics("lineno"):
            if stat.size >= _TRACED_FROM:
                frame = stat.traceback[0]
                lines[f"{frame.filename}:{frame.lineno}"] = stat.size
    return {"types": dict(types), "lines": lines}


def grown(before: Mapping[str, int], after: Mapping[str, int]) -> list[tuple[str, int, int]]:
    """The keys that grew most from ``before`` to ``after``: (key, before, after)."""
    rises = sorted(after, key=lambda key: after[key] - before.get(key, 0), reverse=True)
    return [
        (key, before.get(key, 0), after[key])
        for key in rises[:_CENSUS_TOP]
        if after[key] > before.get(key, 0)
    ]


def _fields(obj: object) -> Iterator[tuple[str, object]]:
    """An object's attributes (``__dict__`` and ``__slots__``), copied first: other threads
    change them while they are read."""
    with suppress(TypeError):  # an object without a __dict__
        yield from list(vars(obj).items())
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(obj, name):
                yield name, getattr(obj, name)


def _walked(value: object) -> bool:
    module = type(value).__module__ or ""
    return module.split(".", 1)[0] in _WALKED and not isinstance(value, type)


def tables(roots: Mapping[str, object]) -> dict[str, int]:
    """The length of every container reachable from each root through objects of the walked
    packages (and through containers of them), by attribute path under the root's name; an
    object reachable from two roots is counted under the first."""
    sizes: dict[str, int] = {}
    seen: set[int] = set()

    def visit(obj: object, path: str, depth: int) -> None:
        if id(obj) in seen or depth > _MAX_DEPTH:
            return
        seen.add(id(obj))
        for attr, value in _fields(obj):
            where = f"{path}.{attr}"
            if isinstance(value, _CONTAINERS):
                if isinstance(value, tuple) and hasattr(value, "_fields"):
                    continue  # a named tuple is a record, not a table
                sizes[where] = len(value)
                inner(value, where, depth)
            elif _walked(value):
                visit(value, where, depth + 1)

    def inner(container: object, where: str, depth: int) -> None:
        # The objects a table holds (the regions, the listeners' owners): walked once each,
        # under the table's path; a snapshot being replaced may change its size meanwhile.
        try:
            items = list(container.values() if isinstance(container, dict) else container)
        except RuntimeError:
            return
        for value in items[:64]:
            if _walked(value) and not isinstance(value, tuple):
                visit(value, f"{where}[]", depth + 1)

    for name, root in roots.items():
        visit(root, name, 0)
    return sizes


def label_sets() -> dict[str, int]:
    """The label sets (series) each of ``sentinel.telemetry``'s labelled metrics holds: a
    table keyed by values (services, reasons) that the walk does not reach."""
    from sentinel import telemetry

    return {
        f"telemetry.{name}": len(metric._metrics)
        for name, metric in vars(telemetry).items()
        if isinstance(metric, MetricWrapperBase) and metric._labelnames
    }


def session_watches(host: str, port: int, session_id: int) -> int:
    """The watches ``session_id`` holds on the server (4lw ``wchc``: each session, then its
    watched paths indented)."""
    answer = four_letter_word(host, port, "wchc", timeout=5)
    count, mine = 0, False
    for line in answer.splitlines():
        if line.startswith("0x"):
            mine = int(line, 16) == session_id
        elif mine and line.strip():
            count += 1
    return count


def fit(times: list[float], values: list[float]) -> tuple[float, float, float]:
    """The least-squares line through ``values`` over ``times``: its slope (per second), the
    slope's standard error, and the value the line has at the mean time. The error is the
    larger of the plain one (residuals taken as independent) and Newey-West's (Bartlett
    weights over ``n ** (1/3)`` lags): samples a few seconds apart are correlated, and the
    plain error would then claim too much, while Newey-West's alone falls short on a few
    hundred samples."""
    n = len(times)
    mean_t, mean_v = statistics.fmean(times), statistics.fmean(values)
    xs = [t - mean_t for t in times]
    sxx = sum(x * x for x in xs)
    if sxx == 0 or n < 3:
        return 0.0, 0.0, mean_v
    k = sum(x * (v - mean_v) for x, v in zip(xs, values, strict=True)) / sxx
    residuals = [v - mean_v - k * x for x, v in zip(xs, values, strict=True)]
    plain = math.sqrt(sum(r * r for r in residuals) / (n - 2) / sxx)
    scores = [x * r for x, r in zip(xs, residuals, strict=True)]
    lags = int(n ** (1 / 3))
    spread = sum(s * s for s in scores)
    for lag in range(1, lags + 1):
        weight = 1 - lag / (lags + 1)
        spread += 2 * weight * sum(scores[i] * scores[i - lag] for i in range(lag, n))
    return k, max(plain, math.sqrt(max(spread, 0.0)) / sxx), mean_v


def judge(times: list[float], values: list[float], warmup: float, relative: bool) -> dict:
    """The slope per hour after the warm-up (the first ``warmup`` of the run) with its 95 %
    confidence interval, the same over the later half of that window, and the verdict:
    *growing* when both intervals are above zero and the fit rises over the window by more
    than 1 (a count) or 1 % of its level (a size); *levels off* when the whole window's
    interval is above zero but the later half's is not (a warm-up longer than ``warmup``, or
    a table that fills to its bound); else *within noise*."""
    first = next(i for i, t in enumerate(times) if t >= warmup * times[-1])
    t, v = times[first:], values[first:]
    k, error, level = fit(t, v)
    later = len(t) // 2
    k_later, error_later, _ = fit(t[later:], v[later:])
    rise = k * (t[-1] - t[0]) if len(t) > 1 else 0.0
    floor = 0.01 * abs(level) if relative else 1.0
    rising = k - _Z95 * error > 0 and rise > floor
    still = k_later - _Z95 * error_later > 0
    return {
        "first": values[0],
        "last": values[-1],
        "max": max(values),
        "per_hour": k * 3600,
        "ci_per_hour": (3600 * (k - _Z95 * error), 3600 * (k + _Z95 * error)),
        "later_per_hour": k_later * 3600,
        "later_ci_per_hour": (
            3600 * (k_later - _Z95 * error_later),
            3600 * (k_later + _Z95 * error_later),
        ),
        "fit_from": t[0],
        "level": level - k * statistics.fmean(t),  # the line's value at t = 0
        "rise": rise,
        "verdict": "growing" if rising and still else "levels off" if rising else "within noise",
        "grows": rising and still,
    }


def _retire(client: Sentinel, service: str) -> None:
    """Retire ``service``, again when a follower came or went meanwhile (as the error says)."""
    for attempt in range(10):
        try:
            retire_service(client.session.zk, service, force=True)
            return
        except RegistryConflict:
            if attempt == 9:
                raise


class XdsStream:
    """A raw ADS stream to the agent's xDS server on a connection of its own, asking once for
    ``names``' assignments and acknowledging every response (its version and nonce), as a
    gRPC client does, on a thread of its own until closed."""

    def __init__(self, address: str, names: list[str]) -> None:
        import grpc
        from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

        from sentinel.agent.xds_resources import ENDPOINTS

        self.responses = 0
        self._asks: collections.deque = collections.deque(
            [discovery_pb2.DiscoveryRequest(type_url=ENDPOINTS, resource_names=names)]
        )
        self._ask = threading.Condition()
        self._done = False
        self._channel = grpc.insecure_channel(address, [("grpc.use_local_subchannel_pool", 1)])
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self._channel)
        self._call = stub.StreamAggregatedResources(self._requests())
        self._reader = threading.Thread(target=self._read, args=(names,), daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator:
        while True:
            with self._ask:
                self._ask.wait_for(lambda: self._asks or self._done)
                if self._done:
                    return
                ask = self._asks.popleft()
            yield ask

    def _read(self, names: list[str]) -> None:
        from envoy.service.discovery.v3 import discovery_pb2

        from sentinel.agent.xds_resources import ENDPOINTS

        with suppress(Exception):  # cancelled by close(), or ended by the agent
            for response in self._call:
                self.responses += 1
                ack = discovery_pb2.DiscoveryRequest(
                    type_url=ENDPOINTS,
                    resource_names=names,
                    version_info=response.version_info,
                    response_nonce=response.nonce,
                )
                with self._ask:
                    self._asks.append(ack)
                    self._ask.notify()

    def close(self) -> None:
        with self._ask:
            self._done = True
            self._ask.notify()
        self._call.cancel()
        self._reader.join()
        self._channel.close()


class _Passwords:
    """The rotations' credential backend: a new password per version, revoked by nobody
    (what a database does with them is not the soak's)."""

    def create(self, service: str, client: str, version: int) -> Mapping[str, str]:
        return {"user": client, "password": f"{service}-{client}-{version}"}

    def revoke(self, service: str, client: str, version: int) -> None:
        pass


class Churn:
    """The writer's side: services with instances that come and go, drained and health
    flipping, rules set and removed; the agent's processes and xDS streams coming and going."""

    def __init__(
        self,
        writer: Sentinel,
        reader: Sentinel,
        west: Sentinel | None,
        args: argparse.Namespace,
        agent_socket: str,
        xds_address: str,
    ) -> None:
        self.writer, self.reader, self.west = writer, reader, west
        self.instances = args.instances
        self.random = random.Random(args.seed)
        self.serial = itertools.count()
        self.names = itertools.count()
        self.live: dict[str, collections.deque] = {}
        self.elsewhere: dict[str, Registration] = {}  # each service's instance in west
        self.checked: dict[str, Registration] = {}  # each service's health-checked instance
        self.healthy: dict[str, bool] = {}  # what each one's check says now
        self.drained: tuple[str, Registration] | None = None
        self.listeners: dict[str, Callable[[], None]] = {}
        self.agent_socket, self.xds_address = agent_socket, xds_address
        self.processes: collections.deque[Sentinel] = collections.deque()
        self.streams: collections.deque[XdsStream] = collections.deque()
        self.heard = 0
        self.counts: collections.Counter[str] = collections.Counter()
        for _ in range(args.services):
            self.create()

    def _hear(self, event: object) -> None:
        self.heard += 1

    def create(self) -> None:
        service = f"svc{next(self.names)}"
        self.writer.ensure_service(service)
        if self.west is not None:
            self.west.ensure_service(service)
            self.elsewhere[service] = self.west.register(
                service, "p0", "10.200.0.1", 80, label="west"
            )
        self.live[service] = collections.deque()
        self.healthy[service] = True
        # The check passes or fails as flip_health says; down after one failure, up after one
        # pass: each flip is a status written.
        check = HealthCheck.call(
            lambda: self.healthy.get(service, True),
            interval=0.5,
            timeout=0.4,
            failures_before_down=1,
            successes_before_up=1,
        )
        self.checked[service] = self.writer.register(
            service, "p0", "10.201.0.1", 80, label="checked", health=check
        )
        self.listeners[service] = self.reader.listen(service, self._hear)
        self.counts["services created"] += 1

    def retire(self) -> None:
        service = self.random.choice(sorted(self.live))
        if self.drained is not None and self.drained[0] == service:
            self.drained = None
        for registration in self.live.pop(service):
            self.writer.deregister(registration)
        self.writer.deregister(self.checked.pop(service))
        self.healthy.pop(service)
        self.listeners.pop(service)()
        _retire(self.writer, service)
        if self.west is not None:
            self.west.deregister(self.elsewhere.pop(service))
            _retire(self.west, service)
        self.counts["services retired"] += 1
        self.create()

    def step(self) -> None:
        """One instance registered, the oldest of its service gone, metrics, lookups and
        feedback."""
        service = self.random.choice(sorted(self.live))
        n = next(self.serial)
        registration = self.writer.register(
            service,
            "p0",
            f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}",
            8000 + n % 1000,
            label=f"i{n}",
        )
        live = self.live[service]
        live.append(registration)
        self.counts["instances registered"] += 1
        if len(live) > self.instances:
            gone = live.popleft()
            if self.drained is not None and self.drained[1] is gone:
                self.drained = None
            self.writer.deregister(gone)
            self.counts["instances deregistered"] += 1
        self.writer.update_metrics(registration, {"load": n % 100})
        for _ in range(3):
            try:
                endpoint = self.reader.get_service(service)
            except Exception:  # a service the cache has not loaded yet: nothing to report
                self.counts["lookups failed"] += 1
                continue
            failed = self.random.random() < 0.2
            self.reader.report(endpoint, ok=not failed, latency=self.random.uniform(0.001, 0.05))
            self.counts["feedback reports"] += 1

    def drain(self) -> None:
        """The instance drained last is back up, and the newest of a service drained."""
        if self.drained is not None:
            service, registration = self.drained
            live = self.live[service]
            live[live.index(registration)] = self.writer.update_registration(
                registration, status="up"
            )
            self.counts["drains ended"] += 1
            self.drained = None
        service = self.random.choice(sorted(self.live))
        live = self.live[service]
        if live:
            live[-1] = self.writer.update_registration(live[-1], status="draining")
            self.drained = (service, live[-1])
            self.counts["drains"] += 1

    def flip_health(self) -> None:
        service = self.random.choice(sorted(self.live))
        self.healthy[service] = not self.healthy[service]
        self.counts["health flips"] += 1

    def rotate(self) -> None:
        """The reader's credential for a service rotated (Procedure 2: published, confirmed
        by the reader, the old one revoked)."""
        service = self.random.choice(sorted(self.live))
        try:
            self.writer.credentials.rotate(service, [READER], _Passwords(), timeout=10)
        except RotationFailed:  # the reader did not confirm in time (a loaded machine)
            self.counts["rotations failed"] += 1
        else:
            self.counts["rotations"] += 1

    def toggle_rule(self) -> None:
        service = self.random.choice(sorted(self.live))
        spec = self.reader.session.cache.snapshots.get(service)
        ruled = spec is not None and spec.spec.failover is not None
        rule = None if ruled else Failover(regions=("west",), warm=True)
        self.writer.set_failover(service, rule)
        self.counts["rules removed" if ruled else "rules set"] += 1

    def _two_services(self) -> list[str]:
        return self.random.sample(sorted(self.live), 2)

    def join_agent(self, keep: int) -> None:
        """A process joins the agent and follows two services; past ``keep``, the oldest
        leaves."""
        process = Sentinel(
            self.writer.hosts,
            f"proc{next(self.names)}",
            NAMESPACE,
            agent=self.agent_socket,
            regions=False,
            prometheus_registry=None,
        ).start()
        for service in self._two_services():
            with suppress(Exception):  # retired meanwhile: it follows what it can
                process.get_service(service)
        self.processes.append(process)
        self.counts["agent processes joined"] += 1
        if len(self.processes) > keep:
            self.processes.popleft().close()
            self.counts["agent processes left"] += 1

    def open_stream(self, keep: int) -> None:
        """An ADS stream opens on the agent's xDS server for two services; past ``keep``, the
        oldest closes."""
        self.streams.append(XdsStream(self.xds_address, self._two_services()))
        self.counts["xDS streams opened"] += 1
        if len(self.streams) > keep:
            stream = self.streams.popleft()
            self.counts["xDS responses"] += stream.responses
            stream.close()
            self.counts["xDS streams closed"] += 1

    def close(self) -> None:
        while self.streams:
            stream = self.streams.popleft()
            self.counts["xDS responses"] += stream.responses
            stream.close()
        while self.processes:
            self.processes.popleft().close()


def _start_agent(stack: ExitStack, hosts: str, directory: str, tracing: bool):
    """The agent's process (:mod:`benchmarks.soak_agent`), serving; and its session's id."""
    agent = start_worker(
        stack,
        "benchmarks.soak_agent",
        hosts,
        NAMESPACE,
        f"{directory}/agent.sock",
        f"unix:{directory}/xds.sock",
        *(["--tracemalloc"] if tracing else []),
    )
    return agent, json.loads(agent.stdout.readline())["session"]


def run(args: argparse.Namespace) -> dict:
    if args.tracemalloc:
        tracemalloc.start()
    with ExitStack() as stack:
        east_zk = stack.enter_context(LocalZooKeeper())
        servers = {"east": east_zk}
        regions: Regions | bool = False
        west = None
        if args.regions:
            west_zk = stack.enter_context(LocalZooKeeper())
            servers["west"] = west_zk
            regions = Regions(
                "east",
                [
                    Region("east", east_zk.connect_string, namespace=NAMESPACE),
                    Region("west", west_zk.connect_string, namespace=NAMESPACE),
                ],
            )
            west = stack.enter_context(
                Sentinel(
                    west_zk.connect_string,
                    "soak-west",
                    NAMESPACE,
                    regions=False,
                    prometheus_registry=None,
                )
            )
        writer = stack.enter_context(
            Sentinel(
                east_zk.connect_string,
                "soak-writer",
                NAMESPACE,
                regions=regions,
                prometheus_registry=None,
            )
        )
        writer.ensure_namespace()
        directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-"))
        agent, agent_session = _start_agent(
            stack, east_zk.connect_string, directory, args.tracemalloc
        )
        # The regions' horizons compressed as the feedback's clock is (the prober no more
        # often than twice a second).
        if hasattr(remotes, "CLOSE_AFTER"):  # not in the code before issue 53 (a before run)
            remotes.CLOSE_AFTER /= args.speed
        remotes.RTT_INTERVAL = max(remotes.RTT_INTERVAL / args.speed, 0.5)
        start = time.monotonic()
        feedback = InstanceFeedback(clock=lambda: start + (time.monotonic() - start) * args.speed)
        reader = stack.enter_context(
            Sentinel(
                east_zk.connect_string,
                READER,
                NAMESPACE,
                regions=regions,
                feedback=feedback,
                auth=AuthConfig(keys=ClientKeyring.generate()),
                prometheus_registry=None,
            )
        )
        churn = Churn(
            writer, reader, west, args, f"{directory}/agent.sock", f"unix:{directory}/xds.sock"
        )
        stack.callback(churn.close)
        # The samples go to a file as they are taken: kept in this process, they would be a
        # table growing with the run in the process measured (a few MB per hour).
        recorded = stack.enter_context(open(f"{directory}/samples.jsonl", "w+"))
        censuses: dict[str, list[dict]] = {"soak": [], "agent": []}
        began = time.monotonic()
        deadline = began + args.minutes * 60
        next_sample, next_census = began, began + args.warmup * args.minutes * 60
        east_host, east_port = east_zk.connect_string.split(":")
        for step in itertools.count():
            now = time.monotonic()
            if now >= next_sample:
                sample = {"t": now - began}
                sample.update({f"soak: {k}": v for k, v in process_figures().items()})
                sample.update({f"soak: {k}": v for k, v in heap_figures().items()})
                (answer,) = ask([agent], {"op": "sample"})
                sample.update({f"agent: {k}": float(v) for k, v in answer.items()})
                for name, zk in servers.items():
                    host, port = zk.connect_string.split(":")
                    sample[f"server watches ({name})"] = float(watches(host, int(port)))
                sample["server watches (agent's session)"] = float(
                    session_watches(east_host, int(east_port), agent_session)
                )
                if reader.regions_router is not None:
                    by_name = reader.regions_router.remotes.by_name.values()
                    sample["regions open"] = float(sum(r.client is not None for r in by_name))
                walked = {"reader": reader, "writer": writer, "west": west}
                sample.update({k: float(v) for k, v in tables(walked).items()})
                sample.update({k: float(v) for k, v in label_sets().items()})
                recorded.write(json.dumps(sample) + "\n")
                next_sample += args.every
            if now >= next_census or now >= deadline:
                censuses["soak"].append(census())
                censuses["agent"].append(ask([agent], {"op": "census"})[0])
                next_census = math.inf
            if now >= deadline:
                break
            pause = began + step / args.rate - now
            if pause > 0:
                time.sleep(pause)
            churn.step()
            if step % args.retire_every == args.retire_every - 1:
                churn.retire()
            if args.regions and step % args.rule_every == args.rule_every // 2:
                churn.toggle_rule()
            if step % args.rotate_every == 5:
                churn.rotate()
            if step % args.drain_every == 1:
                churn.drain()
            if step % args.flip_every == 2:
                churn.flip_health()
            if step % args.process_every == 3:
                churn.join_agent(args.processes)
            if step % args.stream_every == 4:
                churn.open_stream(args.streams)
        churn.close()
        churn.counts["listener events"] = churn.heard
        recorded.seek(0)
        samples = [json.loads(line) for line in recorded]
        return {"samples": samples, "counts": dict(churn.counts), "censuses": censuses}


def plot(
    samples: list[dict],
    verdicts: dict,
    names: list[str],
    path: Path,
    title: str,
    alike: Mapping[str, int] | None = None,
) -> None:
    """Each of ``names`` over time, a panel each: the samples, the warm-up shaded, the fit
    after it, its slope per hour with its interval and verdict; ``alike``: how many other
    figures have the same samples as a name (drawn once)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 3
    rows = max(1, math.ceil(len(names) / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(5.4 * columns, 2.9 * rows), squeeze=False)
    minutes = [s["t"] / 60 for s in samples]
    for axis, name in itertools.zip_longest(axes.flat, names):
        if name is None:
            axis.set_visible(False)
            continue
        verdict = verdicts[name]
        values = [s.get(name, 0.0) for s in samples]
        axis.plot(minutes, values, ".", markersize=2, color="tab:blue")
        start = verdict["fit_from"]
        axis.axvspan(0, start / 60, color="0.9", lw=0)
        ends = [start, samples[-1]["t"]]
        line = [verdict["level"] + verdict["per_hour"] / 3600 * t for t in ends]
        color = {"growing": "tab:red", "levels off": "tab:orange"}.get(
            verdict["verdict"], "tab:green"
        )
        axis.plot([t / 60 for t in ends], line, color=color, lw=1.5)
        low, high = verdict["ci_per_hour"]
        others = (alike or {}).get(name, 0)
        label = textwrap.fill(name + (f" (+{others} alike)" if others else ""), 60)
        axis.set_title(
            f"{label}\n{verdict['per_hour']:+.3g}/h [{low:+.3g}, {high:+.3g}]: "
            f"{verdict['verdict']}",
            fontsize=8,
            color=color,
        )
        axis.tick_params(labelsize=7)
        axis.grid(True, alpha=0.3)
    for axis in axes[-1]:
        axis.set_xlabel("minutes", fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.4 / (2.9 * rows)))  # the title above the panels
    figure.savefig(path, dpi=80)
    plt.close(figure)
    print(f"(plot written to {path})")


def _row(name: str, verdict: dict) -> tuple[str, ...]:
    low, high = verdict["ci_per_hour"]
    return (
        name,
        f"{verdict['first']:g}",
        f"{verdict['max']:g}",
        f"{verdict['last']:g}",
        f"{verdict['per_hour']:+.4g}",
        f"[{low:+.3g}, {high:+.3g}]",
        f"{verdict['later_per_hour']:+.4g}",
        verdict["verdict"].upper() if verdict["grows"] else verdict["verdict"],
    )


def _grown_most(censuses: dict[str, list[dict]]) -> dict[str, dict[str, list]]:
    """What grew most in each process between the warm-up's end and the run's end."""
    return {
        process: {kind: grown(before[kind], after[kind]) for kind in ("types", "lines")}
        for process, (before, after) in censuses.items()
    }


def _print_grown(found: dict[str, dict[str, list]]) -> None:
    for process, kinds in found.items():
        for kind, rows in kinds.items():
            if rows:
                print(f"{process}: {kind} that grew most after the warm-up:")
                for key, was, now in rows:
                    print(f"  {now - was:+,} ({was:,} -> {now:,})  {key}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.5, help="length of the run")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=1 / 3, help="fraction not fitted")
    parser.add_argument("--rate", type=float, default=20.0, help="instances registered per s")
    parser.add_argument("--services", type=int, default=4, help="services live at once")
    parser.add_argument("--instances", type=int, default=10, help="instances per service")
    parser.add_argument("--retire-every", type=int, default=100, help="steps per retirement")
    parser.add_argument("--rule-every", type=int, default=60, help="steps per rule change")
    parser.add_argument("--rotate-every", type=int, default=200, help="steps per rotation")
    parser.add_argument("--drain-every", type=int, default=10, help="steps per drain")
    parser.add_argument("--flip-every", type=int, default=20, help="steps per health flip")
    parser.add_argument("--processes", type=int, default=3, help="agent processes at once")
    parser.add_argument("--process-every", type=int, default=40, help="steps per join")
    parser.add_argument("--streams", type=int, default=3, help="xDS streams open at once")
    parser.add_argument("--stream-every", type=int, default=25, help="steps per new stream")
    parser.add_argument("--speed", type=float, default=600.0, help="feedback clock speed-up")
    parser.add_argument("--no-regions", dest="regions", action="store_false")
    parser.add_argument("--seed", type=int, default=53)
    parser.add_argument("--all", action="store_true", help="list tables that never changed")
    parser.add_argument("--plots", type=Path, help="directory for soak-*.png (matplotlib)")
    parser.add_argument("--tracemalloc", action="store_true", help="census by source line")
    parser.add_argument("--analyse", type=Path, help="judge and draw a run's results file")
    parser.add_argument("--results", help="the results file's name (default soak)")
    args = parser.parse_args(argv)
    # The checks fail on purpose (flip_health): each failure is logged as a warning.
    logging.getLogger("sentinel.health.readiness").setLevel(logging.ERROR)

    if args.analyse is None:
        result = run(args)
        found = _grown_most(result["censuses"])
        load = os.getloadavg()
    else:  # an earlier run's samples, judged and drawn again
        result = json.loads(args.analyse.read_text())
        for name in ("minutes", "every", "speed", "tracemalloc"):
            setattr(args, name, result["args"][name])
        found, load = result["grown_most"], result["load_average"]
    _print_grown(found)
    samples = result["samples"]
    times = [s["t"] for s in samples]
    verdicts = {}
    for name in samples[-1]:
        if name == "t":
            continue
        values = [s.get(name, 0.0) for s in samples]
        verdicts[name] = judge(times, values, args.warmup, relative=name.endswith(" kb"))
    is_table = lambda name: name.startswith(_TABLES)  # noqa: E731
    shown = [
        name
        for name, v in verdicts.items()
        if args.all
        or v["verdict"] != "within noise"
        or v["max"] != v["first"]
        or not is_table(name)
    ]
    order = {"growing": 0, "levels off": 1, "within noise": 2}
    shown.sort(key=lambda n: (order[verdicts[n]["verdict"]], is_table(n), n))
    flat_tables = sum(1 for n in verdicts if is_table(n) and n not in shown)
    counts = ", ".join(f"{v:,} {k}" for k, v in sorted(result["counts"].items()))
    report(
        args.results or ("soak-tracemalloc" if args.tracemalloc else "soak"),
        f"soak: {args.minutes:g} min of churn ({counts}); feedback clock x{args.speed:g}; "
        f"{len(samples)} samples every {args.every:g} s; fitted after the first "
        f"{args.warmup:.0%}; 95 % intervals; {flat_tables} more tables never changed",
        ("figure", "first", "max", "last", "slope / h", "95 % CI / h", "later / h", "verdict"),
        [_row(name, verdicts[name]) for name in shown],
        {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "counts": result["counts"],
            "verdicts": verdicts,
            "growing": sorted(n for n, v in verdicts.items() if v["grows"]),
            "grown_most": found,
            "samples": samples,
            "load_average": load,
        },
    )
    if args.plots is not None:
        args.plots.mkdir(parents=True, exist_ok=True)
        title = f"python -m benchmarks.soak --minutes {args.minutes:g}: "
        processes = [n for n in shown if not is_table(n)]
        plot(samples, verdicts, processes, args.plots / "soak-processes.png", title + "processes")
        # Tables that change together (a dict and its index) are drawn once.
        together: dict[tuple[float, ...], list[str]] = {}
        for name in shown:
            if is_table(name):
                together.setdefault(tuple(s.get(name, 0.0) for s in samples), []).append(name)
        alike = {names[0]: len(names) - 1 for names in together.values()}
        path = args.plots / "soak-tables.png"
        plot(samples, verdicts, list(alike), path, title + "tables", alike)
    if any(math.isnan(v["per_hour"]) for v in verdicts.values()):
        raise SystemExit("a figure could not be fitted")


if __name__ == "__main__":
    main()
