"""``sentinel demo``: publishers, a shard map and a resolving client on a real ZooKeeper.

What it shows today (auth and Spark join as they land): a partitioned service registered by
one client; tenants mapped to partitions by a directory shard policy; a second client
resolving tenants to replicas from its watch-driven cache; a collector's replication-lag
metrics steering the paper's least-lag rule; a tenant move and a session expiry reaching the
cache; a graceful drain; and every instance leaving with its publisher's session. Every step
is checked; the run fails if any check does.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from kazoo.client import KazooClient

from policies import MinLag
from sentinel.client import Sentinel
from sentinel.errors import NoInstanceAvailable
from sentinel.events import ChangeEvent, InstancesChanged, MetricsChanged, ShardKeysChanged
from sentinel.launcher import LocalZooKeeper
from sentinel.output import format_table
from sentinel.testing import expire_session, wait_until

SERVICE = "orders-db"
POLICY = "tenants"
REPLICAS = {"p1": ("replica-a", "replica-b"), "p2": ("replica-a", "replica-b")}
TENANTS = {"acme": "p1", "globex": "p1", "initech": "p1", "umbrella": "p2", "hooli": "p2"}
WAIT = 15.0
MIN_LAG = MinLag(cutoff=5)


class _EventWaiter:
    """Remembers when each change reached the resolving client's cache, and what ``probe``
    (a look at the cache) said right then."""

    def __init__(self, probe: Callable[[], int]) -> None:
        self._probe = probe
        self._events: list[tuple[float, ChangeEvent, int]] = []
        self._changed = threading.Condition()

    def __call__(self, event: ChangeEvent) -> None:
        seen = (time.monotonic(), event, self._probe())
        with self._changed:
            self._events.append(seen)
            self._changed.notify_all()

    def wait(self, since: float, predicate: Callable[[ChangeEvent, int], bool]) -> float | None:
        """Milliseconds from ``since`` to the first matching event, None if none came."""

        def arrived() -> float | None:
            return next((t for t, e, p in self._events if t >= since and predicate(e, p)), None)

        with self._changed:
            at = self._changed.wait_for(arrived, WAIT)
        return None if at is None else (at - since) * 1000


def _remove_namespace(hosts: str, namespace: str) -> None:
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=10)
    try:
        zk.delete(namespace, recursive=True)
    finally:
        zk.stop()
        zk.close()


def _ms(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} ms"


def run_demo(
    emit: Callable[[str], None], hosts: str | None = None, namespace: str = "/sentinel-demo"
) -> bool:
    """Run the demonstration, reporting each line through ``emit``; True if every check passed."""
    checks: list[bool] = []

    def check(what: str, ok: bool) -> None:
        checks.append(ok)
        emit(f"  {'ok  ' if ok else 'FAIL'} {what}")

    own_server = hosts is None
    with contextlib.ExitStack() as stack:
        if hosts is None:
            emit("[1/8] starting a throw-away ZooKeeper ...")
            started = time.monotonic()
            hosts = stack.enter_context(LocalZooKeeper()).connect_string
            emit(f"  serving on {hosts} after {time.monotonic() - started:.2f}s")
        else:
            emit(f"[1/8] using ZooKeeper at {hosts}")
        publisher = stack.enter_context(
            Sentinel(hosts, "demo-publisher", namespace, session_timeout=4.0, drain_wait=0.5)
        )
        stack.callback(_remove_namespace, hosts, namespace)
        resolver = stack.enter_context(Sentinel(hosts, "demo-app", namespace))
        collector = stack.enter_context(Sentinel(hosts, "demo-collector", namespace))

        emit(
            f"[2/8] shard map {POLICY!r}: {len(TENANTS)} tenants over 2 partitions; "
            f"{SERVICE}: 2 replicas per partition"
        )
        publisher.create_shard_policy(POLICY, "directory", partitions=list(REPLICAS))
        publisher.update_shard_info_many(POLICY, TENANTS)
        publisher.ensure_service(SERVICE, scheme="postgresql", shard_policy=POLICY)
        registrations = {
            (partition, label): publisher.register_service(
                SERVICE,
                partition,
                "127.0.0.1",
                15432 + 10 * p + r,
                scheme="postgresql",
                label=label,
                zone=f"zone-{r + 1}",
            )
            for p, (partition, labels) in enumerate(REPLICAS.items())
            for r, label in enumerate(labels)
        }

        emit("[3/8] resolving every tenant from the application's cache")
        started = time.perf_counter()
        resolved = {tenant: resolver.get_service(SERVICE, tenant) for tenant in TENANTS}
        emit(f"  first lookup loaded the cache in {(time.perf_counter() - started) * 1000:.1f} ms")
        emit(
            format_table(
                [(t, e.partition, e.label, e.uri) for t, e in resolved.items()],
                headers=("TENANT", "PARTITION", "REPLICA", "URI"),
            )
        )
        check(
            "every tenant resolves to a replica of its partition",
            all(resolved[t].partition == p for t, p in TENANTS.items()),
        )
        calls = 100_000
        started = time.perf_counter()
        for _ in range(calls):
            resolver.get_service(SERVICE, "acme")
        per_call = (time.perf_counter() - started) / calls * 1e6
        emit(f"  warm lookups: {per_call:.2f} µs per call over {calls:,} calls")
        labels = {resolver.get_service(SERVICE, "acme").label for _ in range(4)}
        check("round robin spreads acme over both p1 replicas", labels == set(REPLICAS["p1"]))

        def live_instances() -> int:
            total = 0
            for tenant in ("globex", "umbrella"):  # one tenant of each partition
                with contextlib.suppress(NoInstanceAvailable):
                    total += len(resolver.get_services(SERVICE, tenant))
            return total

        waiter = _EventWaiter(live_instances)
        resolver.listen(SERVICE, waiter)

        emit(f"[4/8] a collector publishes replication lag; the app asks for {MIN_LAG!r}")
        lags = {"replica-a": 4.0, "replica-b": 1.0}
        for label, lag in lags.items():
            collector.update_metrics(SERVICE, "p1", label, {"replication_lag": lag})
        for expected, change in (
            ("replica-b", None),
            ("replica-a", ("replica-b", 9.0)),
            (None, ("replica-a", 7.0)),
        ):
            if change is not None:
                label, lag = change
                lags[label] = lag
                since = time.monotonic()
                collector.update_metrics(SERVICE, "p1", label, {"replication_lag": lag})
                waiter.wait(
                    since,
                    lambda e, _, label=label, lag=lag: (
                        isinstance(e, MetricsChanged)
                        and any(
                            n.label == label and n.metrics.get("replication_lag") == lag
                            for _, n in e.updated
                        )
                    ),
                )
            else:
                wait_until(
                    lambda: all(e.metrics for e in resolver.get_services(SERVICE, "globex")), WAIT
                )
            try:
                chosen = resolver.get_service(SERVICE, "globex", policy=MIN_LAG).label
            except NoInstanceAvailable:
                chosen = None
            lag_text = ", ".join(f"{k} {v:g} s" for k, v in lags.items())
            check(
                f"lags {lag_text}: globex reads from {chosen or 'no replica'}", chosen == expected
            )
        for label in lags:
            collector.update_metrics(SERVICE, "p1", label, {"replication_lag": 0.0})
        emit("[5/8] moving tenant acme from p1 to p2")
        since = time.monotonic()
        publisher.update_shard_info(POLICY, "acme", "p2")
        moved = waiter.wait(
            since,
            lambda e, _: isinstance(e, ShardKeysChanged) and e.changes.get("acme") == ("p1", "p2"),
        )
        check(
            f"the move reached the application's cache in {_ms(moved)}",
            moved is not None and resolver.get_service(SERVICE, "acme").partition == "p2",
        )

        emit("[6/8] expiring the publisher's ZooKeeper session (as a long GC pause would)")
        since = time.monotonic()
        old_session = expire_session(publisher)
        gone = waiter.wait(since, lambda e, live: isinstance(e, InstancesChanged) and live == 0)
        back = waiter.wait(since, lambda e, live: isinstance(e, InstancesChanged) and live == 4)
        check(
            f"all 4 instances vanished ({_ms(gone)}) and came back under a new session "
            f"({_ms(back)})",
            back is not None
            and live_instances() == 4
            and publisher.session_id not in (None, old_session),
        )

        drained = registrations["p2", "replica-a"]
        emit(f"[7/8] draining p2:{drained.label} before it stops serving")
        since = time.monotonic()
        publisher.drain(drained)
        left = waiter.wait(since, lambda e, live: isinstance(e, InstancesChanged) and live == 3)
        picks = {resolver.get_service(SERVICE, "hooli").label for _ in range(10)}
        check(
            f"the drained replica left the cache in {_ms(left)} and is never picked",
            left is not None and picks == {"replica-b"},
        )

        emit("[8/8] closing the publisher: its ephemeral nodes go with its session")
        since = time.monotonic()
        publisher.close()
        emptied = waiter.wait(since, lambda e, live: isinstance(e, InstancesChanged) and live == 0)
        try:
            resolver.get_service(SERVICE, "hooli")
            nothing_left = False
        except NoInstanceAvailable as exc:
            nothing_left = True
            emit(f"  get_service now raises NoInstanceAvailable: {exc}")
        check(f"every instance left the cache in {_ms(emptied)}", nothing_left)

    emit("cleaned up: namespace removed" + (", ZooKeeper stopped" if own_server else ""))
    emit(f"{sum(checks)} of {len(checks)} checks passed")
    return all(checks)
