"""The convergence fuzzer: random registry changes under connection faults, and after each
round the reader's cache compared with a fresh read of ZooKeeper.

A writer connected straight to ZooKeeper makes random changes of every kind to three services
(registrations, deregistrations, restarts that delete an instance and create it again under
its default ``<host>_<port>`` label, status/weight/property updates, metrics written and
removed, shard keys assigned, moved and removed). A reader, connected through a
:class:`~sentinel.testing.helpers.TcpProxy`, follows them in one watch mode. Each round deals
one fault from a shuffled deck, so every kind comes equally often:

* ``none``: the connection is left alone;
* ``cut``: every connection is dropped and refused for a moment (a reconnection within the
  session);
* ``pause``: every byte is held, nothing closed, for less than the session timeout;
* ``expiry``: every byte is held for longer than the session timeout: the session expires.

The round's changes are made during the fault and right after it (during the reconnection and
the re-sync, where the races are). Then, once the last change is made, the reader must be
connected with no re-sync pending and its cache equal to a fresh read within a bounded time:
every instance's record and the zxid that created its node (so a node created again is told
from the old one even when its content is the same), every metrics record, every shard key. A
round that does not converge is recorded with what differed, and the reader is replaced, so
that each round is judged on its own.

Everything random comes from one seeded :class:`random.Random`; the order of the choices is
reproducible from the seed, the timings of threads are not. Used by
``tests/faults/test_convergence.py`` (short) and ``python -m benchmarks.convergence`` (long).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import NoNodeError

from sentinel.cache.config import CacheConfig
from sentinel.client import Registration, Sentinel
from sentinel.registry.layout import METRICS, metrics_path, service_path
from sentinel.registry.reads import decode_children, read_metrics
from sentinel.registry.records import InstanceRecord
from sentinel.shards.maps import DirectoryMap
from sentinel.shards.store import iter_assignments
from sentinel.testing.helpers import TcpProxy, wait_until

log = logging.getLogger(__name__)

FAULTS = ("none", "cut", "pause", "expiry")
CHANGES = (
    "register",
    "deregister",
    "restart",
    "update",
    "metrics",
    "metrics_removed",
    "shard",
)
POLICY = "tenants"
# service -> (partitions, shard policy)
SERVICES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "api": (("p1",), None),
    "web": (("p0", "p1"), None),
    "db": (("p0", "p1"), POLICY),
}
KEYS = tuple(f"k{i}" for i in range(24))


@dataclass(frozen=True)
class FuzzSettings:
    """The size and pace of a run."""

    instances: int = 12  # live per service at the start; twice as many addresses in the pool
    changes: tuple[int, int] = (5, 30)  # per round, inclusive
    session_timeout: float = 4.0
    converge_timeout: float = 20.0  # after the last change of a round
    resync_jitter: float = 0.2


@dataclass
class RoundResult:
    """One round: its fault, its changes and whether (and how fast) the cache converged."""

    seed: int
    mode: str
    round: int
    fault: str
    changes: dict[str, int]
    converged: bool
    seconds: float | None  # from the last change to the cache equal to a fresh read
    session_kept: bool  # False: the reader's session ended during the round
    differences: list[str] = field(default_factory=list)

    @property
    def fault_as_intended(self) -> bool:
        """An expiry fault ended the session; any other kept it."""
        return self.session_kept != (self.fault == "expiry")


class ConvergenceFuzzer:
    """One seeded run against a ZooKeeper at ``hosts`` (``host:port``), in one watch mode.

    Use it as a context manager: entering builds the world in a namespace of its own and
    starts the writer, the proxy and the reader; leaving closes them.
    """

    def __init__(
        self,
        hosts: str,
        seed: int,
        persistent: bool,
        settings: FuzzSettings | None = None,
        namespace: str | None = None,
    ) -> None:
        self.seed = seed
        self.persistent = persistent
        self.mode = "persistent" if persistent else "one-shot"
        self.settings = settings or FuzzSettings()
        self.namespace = namespace or f"/fuzz-{uuid.uuid4().hex[:12]}"
        self._hosts = hosts
        self._random = random.Random(seed)
        self._deck: list[str] = []
        self._live: dict[tuple[str, str, int], Registration] = {}  # (service, host, port)
        self._addresses = [
            (service, partitions[i % len(partitions)], f"10.{n}.0.{i}", 8000 + i)
            for n, (service, (partitions, _)) in enumerate(SERVICES.items())
            for i in range(2 * self.settings.instances)
        ]
        host, port = hosts.rsplit(":", 1)
        self._proxy = TcpProxy(host, int(port))
        self._writer: Sentinel | None = None
        self._reader: Sentinel | None = None

    # --- life cycle ---------------------------------------------------------------------------

    def __enter__(self) -> ConvergenceFuzzer:
        self._writer = Sentinel(
            self._hosts, "fuzz-writer", self.namespace, announce=False, session_timeout=30.0
        ).start()
        self._build()
        self._reader = self._new_reader()
        return self

    def __exit__(self, *exc_info: object) -> None:
        for client in (self._reader, self._writer):
            if client is not None:
                client.close()
        self._proxy.close()

    @property
    def writer(self) -> Sentinel:
        assert self._writer is not None, "use the fuzzer as a context manager"
        return self._writer

    @property
    def reader(self) -> Sentinel:
        assert self._reader is not None, "use the fuzzer as a context manager"
        return self._reader

    def _build(self) -> None:
        self.writer.shard_maps.create(POLICY, "directory", partitions=["p0", "p1"], buckets=8)
        self.writer.shard_maps.assign_many(
            POLICY, {key: self._random.choice(("p0", "p1")) for key in KEYS[::2]}
        )
        for service, (_, policy) in SERVICES.items():
            self.writer.ensure_service(service, shard_policy=policy)
            self.writer.session.zk.ensure_path(f"{METRICS}/{service}")
        for address in self._random.sample(self._addresses, self.settings.instances * 3):
            self._register(address)

    def _new_reader(self) -> Sentinel:
        reader = Sentinel(
            self._proxy.address,
            f"fuzz-reader-{self.mode}",
            self.namespace,
            announce=False,
            session_timeout=self.settings.session_timeout,
            cache=CacheConfig(
                resync_jitter=self.settings.resync_jitter, persistent_watches=self.persistent
            ),
        ).start()
        for service in SERVICES:
            reader.prefetch(service)
        return reader

    # --- rounds -------------------------------------------------------------------------------

    def run(
        self, rounds: int, on_round: Callable[[RoundResult], None] | None = None
    ) -> list[RoundResult]:
        """Play ``rounds`` rounds; ``on_round`` hears of each as it ends."""
        results = []
        for number in range(1, rounds + 1):
            result = self.play_round(number)
            results.append(result)
            if on_round is not None:
                on_round(result)
        return results

    def play_round(self, number: int) -> RoundResult:
        """One fault, the round's changes during and after it, then the convergence check."""
        rng = self._random
        fault = self._deal()
        kinds = [rng.choice(CHANGES) for _ in range(rng.randint(*self.settings.changes))]
        during = rng.randint(0, len(kinds))
        duration = self._fault_duration(fault)
        if fault in ("cut", "pause"):
            # The server times a session from its last request, and a ping can be a third of
            # the session old: one request just before the fault leaves the whole session to
            # the fault and the reconnection after it (a cut's back-off included), which must
            # not end it on a loaded machine either.
            self.reader.session.zk.exists("/")
        session = self.reader.session_id
        made: Counter[str] = Counter()
        started = time.monotonic()
        self._begin(fault)
        try:
            for kind in kinds[:during]:
                made[self._change(kind)] += 1
            # The fault's length is the input being tested, not a wait for something.
            time.sleep(max(0.0, started + duration - time.monotonic()))
        finally:
            self._end(fault)
        for kind in kinds[during:]:
            made[self._change(kind)] += 1
        seconds = wait_until(
            lambda: self._settled() and not self.differences(),
            timeout=self.settings.converge_timeout,
            interval=0.05,
        )
        result = RoundResult(
            seed=self.seed,
            mode=self.mode,
            round=number,
            fault=fault,
            changes=dict(made),
            converged=seconds is not None,
            seconds=seconds,
            session_kept=self.reader.session_id == session,
        )
        if seconds is None:
            result.differences = self.differences()
            log.warning("round %d did not converge: %s", number, result.differences)
            self.reader.close()  # judge the next round on its own: a reader that saw it all
            self._reader = self._new_reader()
        return result

    def _deal(self) -> str:
        """The next fault of a shuffled deck of every kind."""
        if not self._deck:
            self._deck = list(FAULTS)
            self._random.shuffle(self._deck)
        return self._deck.pop()

    def _fault_duration(self, fault: str) -> float:
        session = self.settings.session_timeout
        low, high = {
            "none": (0.0, 0.0),
            "cut": (0.05, 0.5),
            "pause": (0.15 * session, 0.55 * session),
            "expiry": (1.5 * session, 1.8 * session),
        }[fault]
        return self._random.uniform(low, high)

    def _begin(self, fault: str) -> None:
        if fault == "cut":
            self._proxy.cut()
        elif fault in ("pause", "expiry"):
            self._proxy.pause()

    def _end(self, fault: str) -> None:
        if fault == "cut":
            self._proxy.restore()
        elif fault in ("pause", "expiry"):
            self._proxy.resume()

    # --- changes ------------------------------------------------------------------------------

    def _change(self, kind: str) -> str:
        """Make one change of ``kind`` (or a registration, when there is nothing to change);
        return the kind made."""
        rng = self._random
        live = sorted(self._live)
        if kind in ("deregister", "restart", "update") and not live:
            kind = "register"
        if kind == "register":
            free = [a for a in self._addresses if (a[0], a[2], a[3]) not in self._live]
            if not free:
                return self._change("deregister")
            self._register(rng.choice(free))
        elif kind == "deregister":
            self.writer.deregister(self._live.pop(rng.choice(live)))
        elif kind == "restart":  # the same default label, a new node (new content or not)
            key = rng.choice(live)
            instance = self._live[key].instance
            self.writer.deregister(self._live.pop(key))
            self._register((instance.service, instance.partition, instance.host, instance.port))
            if rng.random() < 0.5:
                self._update(key)
        elif kind == "update":
            self._update(rng.choice(live))
        elif kind in ("metrics", "metrics_removed"):
            # Metrics are published for live instances only (the publisher refuses others);
            # a deregistered instance's metrics stay behind, so orphans still occur.
            if not live:
                return self._change("register")
            instance = self._live[rng.choice(live)].instance
            service, partition, label = instance.service, instance.partition, instance.label
            if kind == "metrics":
                values = {"load": rng.randint(0, 100), "zone": rng.choice(("a", "b"))}
                self.writer.update_metrics(service, partition, label, values)
            else:
                try:
                    self.writer.session.zk.delete(metrics_path(service, partition, label))
                except NoNodeError:
                    kind = "metrics"
                    self.writer.update_metrics(service, partition, label, {"load": 0})
        elif kind == "shard":
            shard_key = rng.choice(KEYS)
            if rng.random() < 0.25:
                self.writer.shard_maps.unassign(POLICY, shard_key)
            else:
                self.writer.shard_maps.assign(POLICY, shard_key, rng.choice(("p0", "p1")))
        time.sleep(rng.uniform(0, 0.01))  # changes in bursts, as deployments make them
        return kind

    def _register(self, address: tuple[str, str, str, int]) -> None:
        service, partition, host, port = address
        self._live[service, host, port] = self.writer.register(
            service, partition, host, port, weight=self._random.randint(1, 3)
        )

    def _update(self, key: tuple[str, str, int]) -> None:
        rng = self._random
        changes: dict[str, Any] = rng.choice(
            (
                {"status": rng.choice(("up", "down", "draining", "starting"))},
                {"weight": rng.randint(1, 5)},
                {"properties": {"version": rng.randint(1, 9)}},
            )
        )
        self._live[key] = self.writer.update_registration(self._live[key], **changes)

    # --- the check ----------------------------------------------------------------------------

    def _settled(self) -> bool:
        """The reader is connected and owes no re-sync: what it holds now is what it keeps
        (checked before the contents, so an expiry is seen before the session is compared)."""
        reader = self.reader
        return reader.connection_state == "connected" and not reader.session.cache.worker.resync_due

    def differences(self) -> list[str]:
        """What the reader's cache holds that a fresh read does not, and the reverse, by
        service: an empty list when the cache is exact."""
        found = []
        for service in SERVICES:
            fresh, cached = self._fresh(service), self._cached(service)
            for part, fresh_part, cached_part in zip(
                ("instances", "metrics", "shard keys"), fresh, cached, strict=True
            ):
                for name in sorted(fresh_part.keys() | cached_part.keys()):
                    if fresh_part.get(name) != cached_part.get(name):
                        what = (
                            "missing"
                            if name not in cached_part
                            else "extra"
                            if name not in fresh_part
                            else "stale"
                        )
                        found.append(f"{service} {part} {name}: {what}")
        return found

    def _fresh(self, service: str) -> tuple[dict[str, Any], ...]:
        zk = self.writer.session.zk
        parent = service_path(service)

        def decode(name: str, path: str, data: bytes, stat: Any) -> tuple[InstanceRecord, int]:
            return InstanceRecord.from_bytes(service, name, path, data), stat.czxid

        instances, _ = decode_children(zk, parent, zk.get_children(parent), decode)
        metrics, _ = read_metrics(zk, service)
        policy = SERVICES[service][1]
        keys = dict(iter_assignments(zk, policy)) if policy else {}
        return instances, metrics, keys

    def _cached(self, service: str) -> tuple[dict[str, Any], ...]:
        snapshot = self.reader.session.cache.snapshots.get(service)
        if snapshot is None:
            return {}, {}, {}
        policy = SERVICES[service][1]
        shard_map = self.reader.session.cache.shard_maps.get(policy or "")
        return (
            {n: (e.record(), e.joined) for n, e in snapshot.endpoints.items()},
            dict(snapshot.metrics),
            dict(shard_map.keys) if policy and isinstance(shard_map, DirectoryMap) else {},
        )
