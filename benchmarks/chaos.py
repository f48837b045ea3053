"""Chaos soak with the reliability invariants checked all along: ``python -m benchmarks.chaos``.

A 3-member ensemble; a writer that keeps registering and deregistering instances, publishing
metrics and moving shard keys; publishers in processes of their own; three readers looking up
without pause. Faults come one at a time: a member killed and restarted (quorum kept), a
publisher process killed or frozen past its session timeout, a reader cut off past its session
timeout, a reader's session expired, a reader's connection flapping. Checked all the time:

(a) a lookup never returns an instance deregistered (or whose process died) more than
    ``BOUND`` (propagation + session timeout + re-sync jitter) ago, and
(b) never finds nothing while an eligible instance has been live that long,

both for readers connected for longer than ``BOUND`` (a cut-off reader serves its last state,
marked stale; that is counted, not a violation). At every checkpoint (the writer pauses, every
fault is undone): (c) each reader's cache equals a fresh read, (d) a process publisher's
registration exists iff its process lives, (e) threads, memory and the ensemble's watch count
stay bounded (watches by what the readers follow). A lookup that raises anything but a
``SentinelError`` answer, or a lookup thread that ends before the run, is a violation too.

    python -m benchmarks.chaos --minutes 30
    python -m benchmarks.chaos --seconds 60 --seed 7
    python -m benchmarks.chaos --seconds 40 --broken-client   # the runner's own check

``--broken-client`` checks the checker: the readers' re-sync after a reconnection is disabled
at both layers that do it, in this process (:func:`break_resync`), so a reader misses every
change made while it was away. The run must then report violations: it exits 0 when it did,
and 1, saying so, when the checker found nothing in the broken client.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import report
from sentinel import Sentinel
from sentinel.cache import RegistryCache
from sentinel.cache.config import CacheConfig
from sentinel.errors import (
    InstanceNotRegistered,
    NoInstanceAvailable,
    PartitionNotFound,
    SentinelError,
    ZooKeeperUnavailable,
)
from sentinel.events import ConnectionChanged, InstancesChanged
from sentinel.testing.helpers import (
    PublisherProcess,
    TcpProxy,
    cached_view,
    expire_session,
    flap,
    registry_view,
    wait_until,
)
from sentinel.testing.zookeeper import LocalZooKeeper, four_letter_word
from sentinel.zk.watches import PersistentWatches

SESSION_TIMEOUT = 4.0  # readers and publisher processes
WRITER_SESSION_TIMEOUT = 20.0  # the writer's instances must not vanish with an election
PROPAGATION = 2.0  # generous: loopback p99 is ~15 ms, but this machine is shared and loaded
RESYNC_JITTER = 0.5
BOUND = PROPAGATION + SESSION_TIMEOUT + RESYNC_JITTER
# After a checkpoint's convergence failed: how much longer to watch the cache, to tell a bound
# too tight for the machine (it catches up) from a change the cache lost (it never does).
LATE_CONVERGENCE = 30.0
VIEW_PARTS = ("instances", "metrics", "shard keys")  # cached_view's and registry_view's
SERVICES = {"api": None, "db": "tenants"}
PARTITIONS = ("p0", "p1")
KEYS = tuple(f"k{i}" for i in range(30))
BUCKETS = 8
IN_PROCESS = 6  # labels per service the writer publishes; 0 and 1 stay, the others come and go
PROCESSES = 4  # publisher processes alive at a time
FAULTS = (
    "kill_member",
    "kill_publisher",
    "pause_publisher",
    "partition_reader",
    "expire_reader",
    "flap_reader",
)


@dataclass
class Life:
    """What the chaos runner knows of one instance (label).

    ``alive``: it may be registered (set before the write is issued); ``dead_since``: when it
    was certainly removed or its process stopped; ``live_since``: since when it certainly is
    (set after the write returned). ``process``: held by a publisher process.
    """

    service: str
    partition: str
    process: bool
    alive: bool = False
    dead_since: float = 0.0
    live_since: float | None = None


@dataclass
class Outcome:
    """Totals of one run."""

    seconds: float = 0.0
    lookups: int = 0
    checked: int = 0
    stale_served: int = 0
    writes: int = 0
    faults: Counter = field(default_factory=Counter)
    violations: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    # per reader: lookups made, and whether its lookup thread was alive when the run ended
    reader_lookups: Counter = field(default_factory=Counter)
    readers_alive: dict[str, bool] = field(default_factory=dict)
    # any exception a lookup raised that is not a SentinelError answer, by type
    lookup_errors: Counter = field(default_factory=Counter)

    def violate(self, invariant: str, detail: str) -> None:
        self.violations[invariant] += 1
        if len(self.examples) < 20:
            self.examples.append(f"({invariant}) {detail}")


class Reader:
    """A reader client and the time since which it has been connected without a break, with
    what it heard lately (for the timeline an (a) violation is reported with)."""

    def __init__(self, name: str, client: Sentinel, proxies: list[TcpProxy]) -> None:
        self.name = name
        self.client = client
        self.proxies = proxies
        self.connected_since: float | None = time.time()
        self.heard: deque[tuple[float, str]] = deque(maxlen=4000)
        client.listen(None, self._on_event)

    def _on_event(self, event: object) -> None:
        now = time.time()
        if isinstance(event, ConnectionChanged):
            self.connected_since = event.at if event.state == "connected" else None
            self.heard.append((event.at, f"{event.state} (heard {now - event.at:+.2f})"))
        elif isinstance(event, InstancesChanged):
            self.heard.extend((now, f"+{e.name}") for e in event.added)
            self.heard.extend((now, f"-{e.name}") for e in event.removed)


class Chaos:
    """One run: the world, the churn, the faults and the checks."""

    def __init__(self, zk: LocalZooKeeper, seed: int, outcome: Outcome) -> None:
        self.zk = zk
        self.random = random.Random(seed)
        self.outcome = outcome
        self.namespace = "/chaos"
        self.lock = threading.Lock()
        self.lives: dict[str, Life] = {}
        self.keys: dict[str, tuple[str | None, float]] = {}
        self.last_election = 0.0
        self.stop = threading.Event()
        self.quiet = threading.Event()  # set: the writer pauses (checkpoints)
        self.writer_idle = threading.Event()
        self.publishers: dict[str, PublisherProcess] = {}
        self.paused: set[str] = set()
        self.next_process = 0
        self.writer = Sentinel(
            zk.connect_string, "chaos-writer", self.namespace,
            session_timeout=WRITER_SESSION_TIMEOUT, announce=False,
        )  # fmt: skip
        self.registrations: dict[str, Any] = {}
        self.readers: list[Reader] = []
        self.fault_times: deque[tuple[float, str]] = deque(maxlen=500)
        self.explained: set[tuple[str, str]] = set()  # (reader, instance) with a timeline
        self.watched_late = False  # a (c) violation was watched LATE_CONVERGENCE longer

    # --- the world ------------------------------------------------------------------------------

    def build(self) -> None:
        writer = self.writer.start()
        writer.shard_maps.create("tenants", "directory", partitions=list(PARTITIONS), buckets=8)
        for service, policy in SERVICES.items():
            writer.ensure_service(service, shard_policy=policy)
            for i in range(IN_PROCESS):
                self.lives[f"{service}-{i}"] = Life(service, PARTITIONS[i % 2], process=False)
        for i in range(IN_PROCESS // 2):
            for service in SERVICES:
                self._register(f"{service}-{i}")
        for key in KEYS:
            self._assign(key, self.random.choice(PARTITIONS))
        for _ in range(PROCESSES):
            self._spawn()
        for name, proxied in (("direct", False), ("proxied", True), ("expiring", False)):
            proxies = [TcpProxy("127.0.0.1", m.client_port) for m in self.zk] if proxied else []
            hosts = ",".join(p.address for p in proxies) if proxied else self.zk.connect_string
            client = Sentinel(
                hosts, f"chaos-{name}", self.namespace,
                session_timeout=SESSION_TIMEOUT, cache=CacheConfig(resync_jitter=RESYNC_JITTER),
            ).start()  # fmt: skip
            for service in SERVICES:
                client.prefetch(service)
            self.readers.append(Reader(name, client, proxies))

    def close(self) -> None:
        for reader in self.readers:
            reader.client.close()
            for proxy in reader.proxies:
                proxy.close()
        for publisher in self.publishers.values():
            publisher.stop()
        self.writer.close()

    # --- writes, with the truth kept beside them ------------------------------------------------

    def _retry(self, write: Callable[[], Any]) -> Any:
        """A write, retried while the connection is interrupted (it is idempotent)."""
        while True:
            try:
                result = write()
            except ZooKeeperUnavailable:
                wait_until(lambda: self.writer.connection_state == "connected", timeout=30)
                continue
            self.outcome.writes += 1
            return result

    def _register(self, label: str) -> None:
        life = self.lives[label]
        with self.lock:
            life.alive = True
        self.registrations[label] = self._retry(
            lambda: self.writer.register(
                life.service, life.partition, "127.0.0.1", 8000, label=label
            )
        )
        with self.lock:
            life.live_since = time.time()

    def _deregister(self, label: str) -> None:
        life = self.lives[label]
        with self.lock:
            life.live_since = None
        registration = self.registrations[label]
        self._retry(lambda: self.writer.deregister(registration))
        del self.registrations[label]
        with self.lock:
            life.alive, life.dead_since = False, time.time()

    def _assign(self, key: str, partition: str | None) -> None:
        with self.lock:
            self.keys[key] = (self.keys.get(key, (None, 0.0))[0], float("inf"))  # in flux
        if partition is None:
            self._retry(lambda: self.writer.shard_maps.unassign("tenants", key))
        else:
            self._retry(lambda: self.writer.shard_maps.assign("tenants", key, partition))
        with self.lock:
            self.keys[key] = (partition, time.time())

    def _spawn(self) -> None:
        label = f"proc-{self.next_process}"
        self.next_process += 1
        service = self.random.choice(list(SERVICES))
        life = self.lives[label] = Life(service, self.random.choice(PARTITIONS), process=True)
        with self.lock:
            life.alive = True
        self.publishers[label] = PublisherProcess(
            self.zk.connect_string, self.namespace, service, life.partition, label, SESSION_TIMEOUT
        )
        with self.lock:
            life.live_since = time.time()

    def churn(self) -> None:
        """The writer's loop: one random change every few milliseconds, paused at checkpoints."""
        while not self.stop.is_set():
            if self.quiet.is_set():
                self.writer_idle.set()
                self.stop.wait(0.05)
                continue
            self.writer_idle.clear()
            try:
                self._change()
            except Exception as exc:  # a fault in the runner itself must fail the run, not hang it
                self.outcome.violate("runner", f"the writer failed: {exc!r}")
            self.stop.wait(self.random.uniform(0.005, 0.05))
        self.writer_idle.set()

    def _change(self) -> None:
        """One random change: (de)register, publish metrics, or move a shard key."""
        choice = self.random.random()
        label = f"{self.random.choice(list(SERVICES))}-{self.random.randrange(IN_PROCESS)}"
        if choice < 0.4 and not label.endswith(("-0", "-1")):
            if label in self.registrations:
                self._deregister(label)
            else:
                self._register(label)
        elif choice < 0.7:  # metrics of any label, live or not (the nodes are persistent)
            life = self.lives[label]
            metrics = {"load": self.random.random()}
            # A label not live at that moment is refused and nothing is written (issue 24).
            with contextlib.suppress(InstanceNotRegistered):
                self._retry(
                    lambda life=life, label=label, metrics=metrics: self.writer.update_metrics(
                        life.service, life.partition, label, metrics
                    )
                )
        else:
            partition = self.random.choice((*PARTITIONS, None))
            self._assign(self.random.choice(KEYS), partition)

    # --- lookups and invariants (a) and (b) -----------------------------------------------------

    def lookups(self, reader: Reader) -> None:
        """One reader's loop. A lookup that raises anything but a :class:`SentinelError`
        (an answer: nothing found, or a first load while cut off) is a violation recorded
        with its type, and so is an exception of the checks themselves: the thread never
        ends silently while the run goes on (``run`` also checks it is alive at the end)."""
        pick = random.Random(reader.name)
        while not self.stop.is_set():
            try:
                self._lookup(reader, pick)
            except Exception as exc:
                self.outcome.lookup_errors[type(exc).__name__] += 1
                self.outcome.violate("lookup", f"{reader.name}: {type(exc).__name__}: {exc!r}")
            self.outcome.lookups += 1
            self.outcome.reader_lookups[reader.name] += 1
            time.sleep(0.001)

    def _lookup(self, reader: Reader, pick: random.Random) -> None:
        since = reader.connected_since
        started = time.time()
        service = pick.choice(list(SERVICES))
        key = pick.choice(KEYS) if SERVICES[service] else None
        try:
            result: Any = reader.client.get_service(service, key)
        except (NoInstanceAvailable, PartitionNotFound) as exc:
            result = exc
        except SentinelError as exc:  # a first load while cut off: nothing to check
            result = exc
        if since is None or reader.connected_since != since:
            self.outcome.stale_served += not isinstance(result, Exception)
        elif started - since > BOUND:
            self.outcome.checked += 1
            self._check(reader, started, service, key, result)

    def _check(self, reader: Reader, at: float, service: str, key: Any, result: Any) -> None:
        with self.lock:
            if not isinstance(result, Exception):
                life = self.lives[result.label]
                dead_since = max(life.dead_since, self.last_election if life.process else 0)
                if not life.alive and at - dead_since > BOUND:
                    self.outcome.violate(
                        "a", f"{reader.name} got {result.name}, gone {at - dead_since:.1f}s"
                    )
                    if (reader.name, result.name) not in self.explained:
                        self.explained.add((reader.name, result.name))
                        self._explain(reader, result.name, dead_since, at)
                return
            partition, assigned_at = self.keys[key] if key is not None else (None, 0.0)
            if key is not None and (partition is None or at - assigned_at <= BOUND):
                return  # the key is unassigned, or moved too recently to judge
            live = [
                label
                for label, life in self.lives.items()
                if life.service == service
                and (partition is None or life.partition == partition)
                and life.live_since is not None
                and at - life.live_since > BOUND
            ]
            if live:
                self.outcome.violate(
                    "b", f"{reader.name}: {service} {key!r} -> {result!r} while {live} live"
                )

    def _explain(self, reader: Reader, name: str, gone: float, at: float) -> None:
        """The first (a) violation of an instance at a reader comes with a timeline: the faults,
        the reader's connection and that instance's changes it heard, in seconds after the
        instance's death."""
        seen = [
            (t, what)
            for t, what in [*self.fault_times, *reader.heard]
            if gone - 2 <= t <= at and (not what.startswith(("+", "-")) or what[1:] == name)
        ]
        steps = "; ".join(f"{t - gone:+.2f} {what}" for t, what in sorted(seen)[-40:])
        # The client's own state, which is not queued behind its worker as listeners' events
        # are: "connected" here with a stale instance is the client's fault, anything else the
        # checker's (it heard of the disconnection late).
        steps += f"; at {at - gone:+.2f} the client says {reader.client.connection_state!r}"
        if len(self.outcome.examples) < 20:
            self.outcome.examples.append(f"(timeline of {name} at {reader.name}) {steps}")

    # --- faults ---------------------------------------------------------------------------------

    def inject(self, fault: str) -> None:
        self.fault_times.append((time.time(), fault))
        try:
            self._inject(fault)
        finally:
            self.fault_times.append((time.time(), f"{fault} done"))

    def _inject(self, fault: str) -> None:
        self.outcome.faults[fault] += 1
        pick = self.random
        if fault == "kill_member":
            member = pick.choice(self.zk.members)
            member.kill()
            time.sleep(pick.uniform(1, 4))  # the fault's duration is an input
            member.restart()
            self.zk.leader()
            with self.lock:
                self.last_election = time.time()
        elif fault in ("kill_publisher", "pause_publisher"):
            label = pick.choice(sorted(set(self.publishers) - self.paused))
            life = self.lives[label]
            with self.lock:
                life.live_since = None
            if fault == "kill_publisher":
                self.publishers.pop(label).kill()
                with self.lock:
                    life.alive, life.dead_since = False, time.time()
                self._spawn()
                return
            self.publishers[label].pause()
            with self.lock:
                life.alive, life.dead_since = False, time.time()
            self.paused.add(label)
            time.sleep(SESSION_TIMEOUT + pick.uniform(1, 2))  # past the session timeout
            self._resume(label)
        elif fault == "partition_reader":
            proxies = self.readers[1].proxies
            for proxy in proxies:
                proxy.cut()
            time.sleep(pick.uniform(1, SESSION_TIMEOUT + 2))
            for proxy in proxies:
                proxy.restore()
        elif fault == "expire_reader":
            client = self.readers[2].client
            if client.connection_state == "connected":
                expire_session(client)
        elif fault == "flap_reader":
            flap(self.readers[1].proxies, pick.uniform(1, 3))  # ten flaps a second

    def _resume(self, label: str) -> None:
        life = self.lives[label]
        with self.lock:
            life.alive = True
        self.publishers[label].resume()
        self.paused.discard(label)
        with self.lock:
            life.live_since = time.time()

    # --- checkpoints: (c), (d), (e) -------------------------------------------------------------

    def checkpoint(self) -> None:
        self.quiet.set()
        if not self.writer_idle.wait(120):
            self.outcome.violate("runner", "the writer did not pause within 120 s")
        for label in list(self.paused):
            self._resume(label)
        started = time.monotonic()
        for reader in self.readers:
            for service in SERVICES:
                converged = wait_until(
                    lambda r=reader, s=service: (
                        cached_view(r.client, s) == registry_view(self.writer, s)
                    ),
                    timeout=15,  # quiet, it takes well under a second
                    ignore=(SentinelError, KeyError),
                )
                if converged is None:
                    self.outcome.violate(
                        "c",
                        f"{reader.name}'s cache of {service} != a fresh read: "
                        + self._difference(reader, service),
                    )
        converged_s = time.monotonic() - started

        def processes_registered() -> bool:
            registered = {
                i[1]
                for service in SERVICES
                for i in registry_view(self.writer, service)[0]
                if i[1].startswith("proc-")
            }
            return registered == {p for p, proc in self.publishers.items() if proc.alive}

        if wait_until(processes_registered, timeout=2 * SESSION_TIMEOUT + 10) is None:
            self.outcome.violate("d", "process registrations != live processes")
        self.outcome.checkpoints.append(
            {
                "at_s": round(time.time() - self.started, 1),
                "converged_s": round(converged_s, 3),
                "threads": threading.active_count(),
                "rss_mb": round(_rss_mb(), 1),
                "watches": self._watches(),
                "watch_bound": self._watch_bound(),
            }
        )
        self.quiet.clear()

    def _difference(self, reader: Reader, service: str) -> str:
        """Why a reader's cache of ``service`` is not a fresh read: which part differs
        (instances, metrics, shard keys) and how, the client's own state, and, for the run's
        first, whether the cache caught up later (a bound too tight for a loaded machine) or not
        (a change lost)."""
        client = reader.client
        try:
            cached, fresh = cached_view(client, service), registry_view(self.writer, service)
        except (SentinelError, KeyError) as exc:
            what = f"a view could not be read ({exc!r})"
        else:
            what = "; ".join(
                _part_difference(part, held, read)
                for part, held, read in zip(VIEW_PARTS, cached, fresh, strict=True)
                if held != read
            )
        stats = client.session.cache.stats
        state = (
            f"the client says {client.connection_state!r}, session {client.session_id!r}, "
            f"stale {client.staleness:.1f}s, {stats.resyncs} re-syncs, "
            f"{stats.decode_errors} decode errors"
        )
        if self.watched_late:  # once a run: every reader failing must not add up to a hang
            return f"{what} ({state})"
        self.watched_late = True
        later = wait_until(
            lambda: cached_view(client, service) == registry_view(self.writer, service),
            timeout=LATE_CONVERGENCE,
            ignore=(SentinelError, KeyError),
        )
        caught_up = (
            f"not caught up {LATE_CONVERGENCE:g}s later"
            if later is None
            else f"caught up {later:.1f}s later"
        )
        return f"{what} ({state}; {caught_up})"

    def _watches(self) -> int:
        total = 0
        for member in self.zk:
            host, port = member.connect_string.split(":")
            answer = four_letter_word(host, int(port), "wchs", timeout=5)
            total += int(answer.rsplit("Total watches:", 1)[1].strip())
        return total

    def _watch_bound(self) -> int:
        """Watches the readers can hold: per service its spec (data and children), its metrics
        section (children) and each node in both; the policy and its buckets."""
        per_reader = 1 + BUCKETS
        for service in SERVICES:
            instances, metrics, _ = registry_view(self.writer, service)
            per_reader += 3 + len(instances) + len(metrics)
        return per_reader * len(self.readers)

    # --- the run --------------------------------------------------------------------------------

    def run(self, seconds: float, checkpoint_every: float) -> None:
        self.started = time.time()
        threads = [threading.Thread(target=self.churn, daemon=True)] + [
            threading.Thread(target=self.lookups, args=(r,), daemon=True) for r in self.readers
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + seconds
        next_checkpoint = time.monotonic() + checkpoint_every
        order: list[str] = []
        while time.monotonic() < deadline:
            if not order:  # every kind once per cycle, in a random order
                order = self.random.sample(FAULTS, len(FAULTS))
            self.inject(order.pop())
            time.sleep(self.random.uniform(0.5, 2.0))
            if time.monotonic() >= next_checkpoint:
                self.checkpoint()
                next_checkpoint = time.monotonic() + checkpoint_every
        self.checkpoint()
        for reader, thread in zip(self.readers, threads[1:], strict=True):
            self.outcome.readers_alive[reader.name] = thread.is_alive()
            if not thread.is_alive():
                self.outcome.violate("lookup", f"{reader.name}'s lookup thread ended early")
        self.stop.set()
        for thread in threads:
            thread.join()
        self.outcome.seconds = time.time() - self.started
        self._check_growth()

    def _check_growth(self) -> None:
        """(e): after the first checkpoint (warm), nothing may keep growing."""
        points = self.outcome.checkpoints
        first, last = points[0], points[-1]
        # A relay that was just cut may still be tearing down its two pump threads.
        if last["threads"] > first["threads"] + 2 * len(self.readers[1].proxies):
            self.outcome.violate("e", f"threads {first['threads']} -> {last['threads']}")
        if last["rss_mb"] > first["rss_mb"] + 64:
            self.outcome.violate("e", f"RSS {first['rss_mb']} -> {last['rss_mb']} MB")
        for point in points:
            if point["watches"] > point["watch_bound"]:
                self.outcome.violate("e", f"{point['watches']} watches > {point['watch_bound']}")


def _part_difference(part: str, held: Any, read: Any) -> str:
    """One part of a view as the cache holds it against a fresh read: what only each has."""
    if isinstance(held, set):
        return f"{part}: cache only {sorted(held - read)}, fresh only {sorted(read - held)}"
    differing = sorted(k for k in held.keys() | read.keys() if held.get(k) != read.get(k))
    return f"{part}: " + ", ".join(
        f"{k!r} cache {held.get(k)!r} fresh {read.get(k)!r}" for k in differing
    )


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _first_last(points: list[dict[str, Any]], figure: str) -> str:
    return f"{points[0][figure]} -> {points[-1][figure]}"


def _watches(points: list[dict[str, Any]]) -> str:
    worst = max(points, key=lambda p: p["watches"] - p["watch_bound"])
    return f"{worst['watches']} ({worst['watch_bound']})"


def run(seconds: float, seed: int = 1, checkpoint_every: float = 60.0) -> Outcome:
    """One chaos run on a fresh 3-member ensemble; the outcome holds every figure."""
    outcome = Outcome()
    with LocalZooKeeper(size=3) as zk:
        chaos = Chaos(zk, seed, outcome)
        try:
            chaos.build()
            chaos.run(seconds, checkpoint_every)
        finally:
            chaos.close()
    return outcome


def _resync_disabled(cache: RegistryCache) -> None:
    """The broken client's re-sync: counted (so the runner waits for it), reads nothing."""
    cache.stats.resyncs += 1


def _no_resync_paths(
    watches: PersistentWatches, lists: list[list[str]]
) -> tuple[set[str], set[str]]:
    """The broken client's resumed session: no known path asks the server what changed."""
    return set(), set()


def break_resync() -> None:
    """Disable, in this process, both re-syncs after a reconnection: the cache's
    (``RegistryCache._resync``: a new session follows and reads nothing again) and the
    connection's (``PersistentWatches._resync_paths``: a resumed session's SetWatches2 carries
    none of the known nodes, so the server reports nothing that changed meanwhile). The cache's
    alone no longer breaks a resumed session in the persistent mode, whose re-sync the
    connection does since 31340ec: a broken client with only that disabled passed every check."""
    RegistryCache._resync = _resync_disabled  # type: ignore[method-assign]
    PersistentWatches._resync_paths = _no_resync_paths  # type: ignore[method-assign]


def exit_status(outcome: Outcome, broken_client: bool) -> tuple[int, str]:
    """The run's exit status and its last line. A run of the real client passes without
    violations; a run of the broken client passes only if the checker found some: none means
    the checker (or the breakage) no longer works, which must not read as a pass."""
    found = sum(outcome.violations.values())
    if not broken_client:
        return (1, f"FAILED: {found} invariant violations") if found else (0, "passed")
    if found:
        return 0, f"self-check passed: the checker found {found} violations in the broken client"
    return 1, (
        "SELF-CHECK FAILED: the checker found no violation in the broken client (its re-sync "
        "disabled): either the checks or the breakage (break_resync) no longer work"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="run length in minutes")
    length.add_argument("--seconds", type=float, help="run length in seconds (default 60)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--checkpoint-every", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument(
        "--broken-client",
        action="store_true",
        help="disable the readers' re-sync after a reconnection: the run passes only if it "
        "finds violations",
    )
    args = parser.parse_args(argv)
    if args.broken_client:
        break_resync()
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # every fault is a "connection dropped"
    seconds = args.minutes * 60 if args.minutes is not None else args.seconds or 60.0
    outcome = run(seconds, args.seed, args.checkpoint_every)
    points = outcome.checkpoints
    rows = [
        ("run length (s)", f"{outcome.seconds:.0f}"),
        ("lookups (checked against the bound)", f"{outcome.lookups} ({outcome.checked})"),
        ("lookups served stale while disconnected", outcome.stale_served),
        ("writes", outcome.writes),
        ("faults injected", sum(outcome.faults.values())),
        *((f"  {kind}", count) for kind, count in sorted(outcome.faults.items())),
        ("checkpoints", len(points)),
        ("slowest convergence to a fresh read (s)", max(p["converged_s"] for p in points)),
        ("threads (first -> last checkpoint)", _first_last(points, "threads")),
        ("RSS MB (first -> last checkpoint)", _first_last(points, "rss_mb")),
        ("watches at the closest checkpoint (bound)", _watches(points)),
        ("invariant violations", sum(outcome.violations.values())),
        *((f"  ({kind})", count) for kind, count in sorted(outcome.violations.items())),
    ]  # fmt: skip
    report(
        "chaos",
        f"Chaos soak, seed {args.seed}, bound {BOUND:g}s (propagation {PROPAGATION:g} + "
        f"session {SESSION_TIMEOUT:g} + jitter {RESYNC_JITTER:g})",
        ("figure", "value"),
        rows,
        {
            "seconds": outcome.seconds,
            "seed": args.seed,
            "bound_s": BOUND,
            "lookups": outcome.lookups,
            "checked": outcome.checked,
            "stale_served": outcome.stale_served,
            "writes": outcome.writes,
            "faults": dict(outcome.faults),
            "violations": dict(outcome.violations),
            "reader_lookups": dict(outcome.reader_lookups),
            "lookup_errors": dict(outcome.lookup_errors),
            "examples": outcome.examples,
            "checkpoints": points,
        },
    )
    for example in outcome.examples:
        print(example)
    status, verdict = exit_status(outcome, args.broken_client)
    print(verdict, file=sys.stderr if status else sys.stdout)
    raise SystemExit(status)


if __name__ == "__main__":
    main()
