"""Nothing grows under churn: ``python -m benchmarks.soak`` (issue 53).

One real ZooKeeper (two with regions: the second is ``west``) and, in this process, a writer
and the measured client (``reader``), under compressed churn for ``--minutes``:

- instances registered, each with a fresh label and address, and the oldest of its service
  deregistered, so that a table kept per instance would grow with every one ever seen;
- their metrics written; lookups, and feedback reported for what was picked (failures and
  latencies, for instances that then go away);
- services created and retired (:func:`sentinel.registry.retire.retire_service`), each with a
  listener added and removed;
- with regions, failover rules to ``west`` set and removed (warm, so the region follows them).

The feedback runs on a clock ``--speed`` times faster than the wall's, so that a run of
minutes holds the hours of its ejections, windows and horizons; a region no rule needs is
closed after ``CLOSE_AFTER`` divided by the same factor.

Every ``--every`` seconds it samples the process (RSS from ``/proc/self/status``, threads,
open descriptors), each server's watches (4lw ``wchs``) and every internal table of the
measured client: each dict, set, list, tuple or deque reachable from the client through
objects of ``sentinel`` and ``kazoo`` (found by walking them, so that a table added later is
measured too). A figure's slope is the least-squares fit over the second half of the run (the
first half warms up), in units per hour; it *grows* when the fit rises over that half by more
than three times the scatter around it and more than 1 (a count) or 5 % (bytes).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress

from benchmarks.common import report
from benchmarks.zkcost import watches
from sentinel import Sentinel
from sentinel.errors import RegistryConflict
from sentinel.feedback import InstanceFeedback
from sentinel.publisher import Registration
from sentinel.regions import Failover, Region, Regions, remotes
from sentinel.registry.retire import retire_service
from sentinel.testing.zookeeper import LocalZooKeeper

NAMESPACE = "/soak"
# Objects of these packages are walked into; anything else is a leaf.
_WALKED = ("sentinel", "kazoo")
_CONTAINERS = (dict, set, frozenset, list, tuple, collections.deque)
_MAX_DEPTH = 6


def process_figures() -> dict[str, float]:
    """This process's RSS (kB), threads and open descriptors."""
    with open("/proc/self/status") as lines:
        status = dict(line.split(":", 1) for line in lines if ":" in line)
    return {
        "rss_kb": float(status["VmRSS"].split()[0]),
        "threads": float(status["Threads"]),
        "fds": float(len(os.listdir("/proc/self/fd"))),
    }


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


def tables(root: object, name: str) -> dict[str, int]:
    """The length of every container reachable from ``root`` through objects of the walked
    packages (and through containers of them), by attribute path."""
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

    visit(root, name, 0)
    return sizes


def slope(times: list[float], values: list[float]) -> tuple[float, float]:
    """The least-squares slope of ``values`` over ``times`` (per second) and the scatter
    (standard deviation) around the fit."""
    mean_t, mean_v = statistics.fmean(times), statistics.fmean(values)
    var_t = sum((t - mean_t) ** 2 for t in times)
    if var_t == 0:
        return 0.0, 0.0
    k = sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values, strict=True)) / var_t
    residuals = [v - (mean_v + k * (t - mean_t)) for t, v in zip(times, values, strict=True)]
    return k, statistics.pstdev(residuals)


def judge(times: list[float], values: list[float], relative: bool) -> dict[str, float | bool]:
    """The slope (per hour) over the second half, and whether it is growth."""
    half = len(times) // 2
    t, v = times[half:], values[half:]
    k, scatter = slope(t, v)
    rise = k * (t[-1] - t[0]) if len(t) > 1 else 0.0
    floor = 0.05 * statistics.fmean(v) if relative else 1.0
    return {
        "first": values[0],
        "last": values[-1],
        "max": max(values),
        "per_hour": k * 3600,
        "rise": rise,
        "grows": rise > max(3 * scatter, floor),
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


class Churn:
    """The writer's side: services with instances that come and go, rules set and removed."""

    def __init__(
        self,
        writer: Sentinel,
        reader: Sentinel,
        west: Sentinel | None,
        services: int,
        instances: int,
        seed: int,
    ) -> None:
        self.writer, self.reader, self.west = writer, reader, west
        self.instances = instances
        self.random = random.Random(seed)
        self.serial = itertools.count()
        self.names = itertools.count()
        self.live: dict[str, collections.deque] = {}
        self.elsewhere: dict[str, Registration] = {}  # each service's instance in west
        self.listeners: dict[str, Callable[[], None]] = {}
        self.heard = 0
        self.counts = collections.Counter()
        for _ in range(services):
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
        self.listeners[service] = self.reader.listen(service, self._hear)
        self.counts["services created"] += 1

    def retire(self) -> None:
        service = self.random.choice(sorted(self.live))
        for registration in self.live.pop(service):
            self.writer.deregister(registration)
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
            self.writer.deregister(live.popleft())
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

    def toggle_rule(self) -> None:
        service = self.random.choice(sorted(self.live))
        spec = self.reader.session.cache.snapshots.get(service)
        ruled = spec is not None and spec.spec.failover is not None
        rule = None if ruled else Failover(regions=("west",), warm=True)
        self.writer.set_failover(service, rule)
        self.counts["rules removed" if ruled else "rules set"] += 1


def run(args: argparse.Namespace) -> dict:
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
                "soak-reader",
                NAMESPACE,
                regions=regions,
                feedback=feedback,
                prometheus_registry=None,
            )
        )
        churn = Churn(writer, reader, west, args.services, args.instances, args.seed)
        samples: list[dict] = []
        began = time.monotonic()
        deadline = began + args.minutes * 60
        next_sample = began
        for step in itertools.count():
            now = time.monotonic()
            if now >= next_sample:
                sample = {"t": now - began, **process_figures()}
                for name, zk in servers.items():
                    host, port = zk.connect_string.split(":")
                    sample[f"server watches ({name})"] = float(watches(host, int(port)))
                if reader.regions_router is not None:
                    by_name = reader.regions_router.remotes.by_name.values()
                    sample["regions open"] = float(sum(r.client is not None for r in by_name))
                sample.update({k: float(v) for k, v in tables(reader, "reader").items()})
                samples.append(sample)
                next_sample += args.every
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
        churn.counts["listener events"] = churn.heard
        return {"samples": samples, "counts": dict(churn.counts)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.5, help="length of the run")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--rate", type=float, default=20.0, help="instances registered per s")
    parser.add_argument("--services", type=int, default=4, help="services live at once")
    parser.add_argument("--instances", type=int, default=10, help="instances per service")
    parser.add_argument("--retire-every", type=int, default=100, help="steps per retirement")
    parser.add_argument("--rule-every", type=int, default=60, help="steps per rule change")
    parser.add_argument("--speed", type=float, default=600.0, help="feedback clock speed-up")
    parser.add_argument("--no-regions", dest="regions", action="store_false")
    parser.add_argument("--seed", type=int, default=53)
    parser.add_argument("--all", action="store_true", help="list tables that never changed")
    args = parser.parse_args(argv)

    result = run(args)
    samples = result["samples"]
    times = [s["t"] for s in samples]
    verdicts = {}
    for name in samples[-1]:
        if name == "t":
            continue
        values = [s.get(name, 0.0) for s in samples]
        verdicts[name] = judge(times, values, relative=name == "rss_kb")
    shown = [
        name
        for name, v in verdicts.items()
        if args.all
        or v["grows"]
        or v["max"] != v["first"]
        or (name in samples[0] and not name.startswith("reader."))
    ]
    shown.sort(key=lambda n: (not verdicts[n]["grows"], n.startswith("reader."), n))
    rows = [
        (
            name,
            f"{verdicts[name]['first']:g}",
            f"{verdicts[name]['max']:g}",
            f"{verdicts[name]['last']:g}",
            f"{verdicts[name]['per_hour']:+.4g}",
            "GROWS" if verdicts[name]["grows"] else "flat",
        )
        for name in shown
    ]
    flat_tables = sum(1 for n in verdicts if n.startswith("reader.") and n not in shown)
    counts = ", ".join(f"{v:,} {k}" for k, v in sorted(result["counts"].items()))
    report(
        "soak",
        f"soak: {args.minutes:g} min of churn ({counts}); feedback clock x{args.speed:g}; "
        f"{len(samples)} samples every {args.every:g} s; slope over the second half; "
        f"{flat_tables} more tables of the reader never changed",
        ("figure", "first", "max", "last", "slope / h", "verdict"),
        rows,
        {
            "args": vars(args),
            "counts": result["counts"],
            "verdicts": verdicts,
            "growing": sorted(n for n, v in verdicts.items() if v["grows"]),
            "samples": samples,
            "load_average": os.getloadavg(),
        },
    )
    if any(math.isnan(v["per_hour"]) for v in verdicts.values()):
        raise SystemExit("a figure could not be fitted")


if __name__ == "__main__":
    main()
