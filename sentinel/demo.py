"""``sentinel demo``: the publisher's life cycle against a real ZooKeeper, checked step by step.

What it shows today (the resolution, policy, auth and Spark parts join as they land):
a partitioned service registered by one client and watched by another; a forced session
expiry after which the publisher's instances come back by themselves; a graceful drain; and
the instant removal of every instance when the publisher closes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from kazoo.client import KazooClient

from sentinel.client import Sentinel
from sentinel.errors import ConnectionInterrupted
from sentinel.launcher import LocalZooKeeper
from sentinel.output import format_table
from sentinel.records import InstanceRecord
from sentinel.testing import expire_session, wait_until

SERVICE = "orders-db"
REPLICAS = {"p1": ("replica-a", "replica-b"), "p2": ("replica-a", "replica-b")}
RECOVERY_TIMEOUT = 15.0


def _instances_table(instances: tuple[InstanceRecord, ...]) -> str:
    return format_table(
        [
            (i.partition, i.label, f"{i.scheme}://{i.host}:{i.port}", i.zone, i.status, i.weight)
            for i in instances
        ],
        headers=("PARTITION", "LABEL", "ENDPOINT", "ZONE", "STATUS", "WEIGHT"),
    )


def _remove_namespace(hosts: str, namespace: str) -> None:
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=10)
    try:
        zk.delete(namespace, recursive=True)
    finally:
        zk.stop()
        zk.close()


def run_demo(
    hosts: str | None = None,
    namespace: str = "/sentinel-demo",
    emit: Callable[[str], None] = print,
) -> bool:
    """Run the demonstration; return True if every check passed."""
    checks: list[tuple[str, bool]] = []

    def check(what: str, ok: bool) -> None:
        checks.append((what, ok))
        emit(f"  {'ok  ' if ok else 'FAIL'} {what}")

    own_server = hosts is None
    with contextlib.ExitStack() as stack:
        if hosts is None:
            emit("[1/6] starting a throw-away ZooKeeper ...")
            started = time.monotonic()
            zk = stack.enter_context(LocalZooKeeper())
            hosts = zk.connect_string
            emit(f"  serving on {hosts} after {time.monotonic() - started:.2f}s")
        else:
            emit(f"[1/6] using ZooKeeper at {hosts}")
        publisher = stack.enter_context(
            Sentinel(hosts, "demo-publisher", namespace, session_timeout=4.0, drain_wait=0.5)
        )
        stack.callback(_remove_namespace, hosts, namespace)
        observer = stack.enter_context(Sentinel(hosts, "demo-observer", namespace))

        emit(f"[2/6] registering {SERVICE}: 2 partitions x 2 replicas")
        publisher.ensure_service(SERVICE, scheme="postgresql", shard_policy="tenants")
        registrations = [
            publisher.register_service(
                SERVICE,
                partition,
                "127.0.0.1",
                15432 + 10 * p + r,
                scheme="postgresql",
                label=label,
                zone=f"zone-{r + 1}",
                properties={"role": "replica"},
            )
            for p, (partition, labels) in enumerate(REPLICAS.items())
            for r, label in enumerate(labels)
        ]
        listing = observer.read_service(SERVICE)
        emit(_instances_table(listing.instances))
        check("the observer reads all 4 instances", len(listing.instances) == 4)

        emit("[3/6] expiring the publisher's ZooKeeper session (as a long GC pause would)")
        old_session = expire_session(publisher)
        recovered = wait_until(
            lambda: (
                publisher.session_id not in (None, old_session)
                and len(observer.read_service(SERVICE).instances) == 4
            ),
            RECOVERY_TIMEOUT,
            ignore=(ConnectionInterrupted,),
        )
        check(
            f"all 4 instances are back under a new session in "
            f"{'-' if recovered is None else f'{recovered * 1000:.0f} ms'}",
            recovered is not None,
        )

        drained = registrations[0]
        emit(f"[4/6] draining {drained.partition}:{drained.label} ...")
        publisher.drain(drained)
        labels = {(i.partition, i.label) for i in observer.read_service(SERVICE).instances}
        check(
            "the drained replica is gone and the other 3 remain",
            (drained.partition, drained.label) not in labels and len(labels) == 3,
        )

        emit("[5/6] closing the publisher: its ephemeral nodes go with its session")
        publisher.close()
        check("no instance is left", observer.read_service(SERVICE).instances == ())

    emit("[6/6] cleaned up: namespace removed" + (", ZooKeeper stopped" if own_server else ""))
    passed = sum(ok for _, ok in checks)
    emit(f"{passed} of {len(checks)} checks passed")
    return passed == len(checks)
