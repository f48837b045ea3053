"""Deregistration five ways, side by side in one run: ``python -m benchmarks.deregister``.

One writer client deletes instance nodes in turn five ways, alternated round by round so that
the machine's load falls on the five alike, and a second client in the same process records
when each deletion reaches its cache (the listener call, made right after the snapshot swap):

- ``guarded``: ``deregister``, the library's way, on a service whose spec marks departures
  (``ServiceSpec.mark_departures``, as the benchmark's service does). When the node's watch (set
  by the registration's background read, waited for before each of the three ``deregister``
  ways) has reported nothing since, one delete conditional on the version that read found, sent
  in one transaction with the node's departure mark (created and deleted, so caches tell a
  deregistration from a session's expiry); an old process never deletes the node a successor
  took over.
- ``unmarked``: ``guarded`` without the departure mark, a plain conditional delete: what
  ``deregister`` sends for a service whose spec does not mark departures (the default), and
  what the mark costs.
- ``read-first``: ``deregister`` when it does not know the node (what it was read as is
  forgotten first, as after a lost connection): it reads the node, then deletes it
  conditionally on the version read if this session owns it. Two requests: the library's way
  before issue 40.
- ``blind``: one unconditional delete, Curator's way. One request; it would delete a
  successor's node (here there is none).
- ``acl``: one transaction, ``setData`` + ``delete``, on a node whose ACL grants WRITE to this
  process's own digest identity only. One request, and ZooKeeper refuses it on anyone else's
  node; but a follower is told of a data change, not a deletion, and reads the node.

Each row gives the requests the writer sent per deletion (counted on its thread), the time of
the call and the time until the reader's cache applied the removal.
"""

from __future__ import annotations

import argparse
import secrets
import threading
import time
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.security import make_acl, make_digest_acl

from benchmarks.common import percentiles, report
from sentinel import Sentinel
from sentinel.events import InstancesChanged
from sentinel.registry.layout import instance_path
from sentinel.registry.records import InstanceRecord
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from sentinel.zk.ephemeral import first_failure

SERVICE = "db"
PARTITION = "p0"
VARIANTS = ("guarded", "unmarked", "read-first", "blind", "acl")
SAFE = {
    "guarded": "yes",
    "unmarked": "yes",
    "read-first": "yes",
    "blind": "no",
    "acl": "yes, by ACL",
}


class _Arrivals:
    """The reader's side: when each label appeared in and left its cache."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.added: dict[str, float] = {}
        self.removed: dict[str, float] = {}

    def on_change(self, event: object) -> None:
        now = time.time()
        if not isinstance(event, InstancesChanged):
            return
        with self._changed:
            for endpoint in event.added:
                self.added.setdefault(endpoint.label, now)
            for endpoint in event.removed:
                self.removed.setdefault(endpoint.label, now)
            self._changed.notify_all()

    def wait(self, seen: dict[str, float], label: str) -> float:
        with self._changed:
            if not self._changed.wait_for(lambda: label in seen, timeout=10):
                raise RuntimeError(f"{label} never reached the reader's cache")
            return seen[label]


class _Writer:
    """Creates an instance node and deletes it the way its variant says."""

    def __init__(self, client: Sentinel) -> None:
        self._client = client
        self._zk: KazooClient = client.session.zk  # the same connection for every variant
        user, password = "sentinel-bench-owner", secrets.token_urlsafe(16)
        self._zk.add_auth("digest", f"{user}:{password}")
        self._owner_acl = [
            make_acl("world", "anyone", read=True, create=True, delete=True, admin=True),
            make_digest_acl(user, password, write=True),
        ]
        self.sent: list[str] = []
        self._counting = False
        call = self._zk._call
        me = threading.get_ident()

        def counted(request, async_object):
            if self._counting and threading.get_ident() == me:
                self.sent.append(type(request).__name__)
            return call(request, async_object)

        self._zk._call = counted

    def create(self, variant: str, label: str) -> Callable[[], None]:
        """Make the node; return the deletion to time."""
        if variant in ("guarded", "unmarked", "read-first"):
            registration = self._client.register(SERVICE, PARTITION, "10.0.0.1", 7000, label=label)
            # Both start once the background read has set the node's watch (the steady state;
            # a deregistration sooner reads first), so each pays its own way's requests only.
            owned = lambda: self._client.session.nodes.owns(registration.path) is True  # noqa: E731
            if wait_until(owned, timeout=10, interval=0.001) is None:
                raise RuntimeError(f"{registration.path} was never read back by its watch")
            if variant == "guarded":
                return lambda: self._client.deregister(registration)
            if variant == "unmarked":

                def unmarked() -> None:
                    self._client.session.nodes.remove(registration.path)  # no departure mark
                    self._client.session.publisher._registrations.pop(registration.path, None)

                return unmarked

            def read_first() -> None:
                self._client.session.nodes._seen.pop(registration.path, None)
                self._client.deregister(registration)

            return read_first
        path = instance_path(SERVICE, PARTITION, label)
        data = InstanceRecord(SERVICE, PARTITION, label, "10.0.0.1", 7000).to_bytes(path)
        if variant == "blind":
            self._zk.create(path, data, ephemeral=True)
            return lambda: self._zk.delete(path)
        self._zk.create(path, data, ephemeral=True, acl=self._owner_acl)

        def guarded_by_acl() -> None:
            transaction = self._zk.transaction()
            transaction.set_data(path, b"")
            transaction.delete(path)
            failure = first_failure(transaction.commit())
            if failure is not None:
                raise failure

        return guarded_by_acl

    def timed(self, delete: Callable[[], None]) -> tuple[float, float, int]:
        """(start, end, requests) of one deletion."""
        self.sent.clear()
        self._counting = True
        started = time.time()
        delete()
        done = time.time()
        self._counting = False
        return started, done, len(self.sent)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="deletions of each kind")
    parser.add_argument("--interval", type=float, default=0.02)
    args = parser.parse_args(argv)

    arrivals = _Arrivals()
    calls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    propagation: dict[str, list[float]] = {v: [] for v in VARIANTS}
    requests: dict[str, set[int]] = {v: set() for v in VARIANTS}
    with (
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "bench-writer") as writer_client,
        Sentinel(zk.connect_string, "bench-reader") as reader,
    ):
        writer_client.ensure_service(SERVICE, mark_departures=True)
        writer_client.register(SERVICE, PARTITION, "10.0.0.1", 6999, label="base")
        reader.get_service(SERVICE)
        reader.listen(SERVICE, arrivals.on_change)
        writer = _Writer(writer_client)
        for i in range(args.rounds):
            for variant in VARIANTS[i % len(VARIANTS) :] + VARIANTS[: i % len(VARIANTS)]:
                label = f"{variant}-{i}"
                delete = writer.create(variant, label)
                arrivals.wait(arrivals.added, label)
                started, done, sent = writer.timed(delete)
                arrived = arrivals.wait(arrivals.removed, label)
                calls[variant].append((done - started) * 1000)
                propagation[variant].append((arrived - started) * 1000)
                requests[variant].add(sent)
                time.sleep(args.interval)  # the writer's pace, as in benchmarks.propagation

    rows, figures = [], {}
    for variant in VARIANTS:
        call, spread = percentiles(calls[variant]), percentiles(propagation[variant])
        figures[variant] = {
            "call": call,
            "propagation": spread,
            "requests": sorted(requests[variant]),
        }
        rows.append(
            (
                variant,
                "/".join(map(str, sorted(requests[variant]))),
                SAFE[variant],
                f"{call['p50']:.2f}",
                f"{call['p99']:.2f}",
                f"{spread['p50']:.2f}",
                f"{spread['p95']:.2f}",
                f"{spread['p99']:.2f}",
                len(propagation[variant]),
            )
        )
    report(
        "deregister",
        f"deregistration, {len(VARIANTS)} ways alternated, loopback, one ZooKeeper "
        f"({args.rounds} each)",
        (
            "way",
            "requests",
            "successor safe",
            "call p50 ms",
            "call p99 ms",
            "to cache p50 ms",
            "p95 ms",
            "p99 ms",
            "n",
        ),
        rows,
        {"rounds": args.rounds, "interval": args.interval, "figures": figures},
    )


if __name__ == "__main__":
    main()
