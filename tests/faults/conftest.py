"""The fault suite's shared parts: a 3-member ensemble, a prober that looks up without pause,
the recovery measure, a reader behind a relay, and the table of results printed at the end of
the pytest run."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from sentinel import Sentinel
from sentinel.cache.config import CacheConfig
from sentinel.errors import ZooKeeperUnavailable
from sentinel.testing.helpers import TcpProxy, cached_view, registry_view, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from tests.conftest import SUMMARY_ROW

HEADERS = ("fault", "recovery s", "lookups", "failed", "stale-served", "note")


@dataclass(frozen=True)
class FaultRow:
    """One line of the fault table."""

    fault: str
    recovery_s: float
    lookups: int
    failed: int
    stale_served: int
    note: str = ""


SECTION = "faults: recovery and lookups during each fault"


@pytest.fixture
def fault_table(request: pytest.FixtureRequest) -> Iterator[list[FaultRow]]:
    """Rows added here are printed after the run (tests/conftest.py's summary tables)."""
    rows: list[FaultRow] = []
    yield rows
    for r in rows:
        row = (r.fault, f"{r.recovery_s:.2f}", r.lookups, r.failed, r.stale_served, r.note)
        request.node.user_properties.append((SUMMARY_ROW, (SECTION, HEADERS, row)))


@pytest.fixture(scope="module")
def ensemble() -> Iterator[LocalZooKeeper]:
    """A 3-member ensemble for one module; tests put back every member they break."""
    with LocalZooKeeper(size=3) as zk:
        yield zk


class Prober:
    """Looks ``service`` up on ``client`` without pause, on a thread of its own, counting what
    a caller would have seen: lookups, failures (any exception, by type), and answers served
    while the client was not connected (stale but served).

    On exit it waits (bounded) for at least ``min_lookups`` lookups and records whether its
    thread was still alive: :meth:`check` fails a test whose prober died or stalled, so "0
    failed lookups" always means lookups were made and none failed.
    """

    def __init__(self, client: Sentinel, service: str, min_lookups: int = 50) -> None:
        self.client = client
        self.service = service
        self.min_lookups = min_lookups
        self.lookups = self.failed = self.stale = 0
        self.errors: list[str] = []
        self.error_types: Counter[str] = Counter()
        self.alive_at_exit: bool | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        wait_until(
            lambda: self.lookups >= self.min_lookups or not self._thread.is_alive(), timeout=10
        )
        self.alive_at_exit = self._thread.is_alive()
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.client.get_service(self.service)
            except Exception as exc:  # any exception is a failed lookup a caller would have seen
                self.failed += 1
                self.error_types[type(exc).__name__] += 1
                if len(self.errors) < 5:
                    self.errors.append(repr(exc))
            else:
                self.stale += self.client.connection_state != "connected"
            self.lookups += 1
            time.sleep(0.002)

    def check(self) -> None:
        """Assert the prober lived to the end, made ``min_lookups`` lookups and none failed."""
        assert self.alive_at_exit, f"the prober's thread died after {self.lookups} lookups"
        assert self.lookups >= self.min_lookups, (
            f"the prober made {self.lookups} lookups, fewer than {self.min_lookups}"
        )
        assert self.failed == 0, (dict(self.error_types), self.errors)


def when_possible(write: Callable[[], Any], timeout: float = 60) -> Any:
    """Do ``write`` as soon as the writer's connection allows (it may be recovering too)."""
    results: list[Any] = []
    took = wait_until(
        lambda: results.append(write()) or True,
        timeout=timeout,
        interval=0.05,
        ignore=(ZooKeeperUnavailable,),
    )
    assert took is not None, f"no write went through within {timeout}s"
    return results[0]


def time_to_recover(writer: Sentinel, reader: Sentinel, service: str, label: str) -> float:
    """Seconds from now until a change made now is in ``reader``'s cache, and the cache equals
    a fresh read: the end-to-end recovery a user sees (the writer may be reconnecting too)."""
    started = time.monotonic()
    when_possible(lambda: writer.register(service, "p1", "127.0.0.1", 7000, label=label))
    arrived = wait_until(
        lambda: any(e.label == label for e in reader.cached_instances(service)), timeout=60
    )
    assert arrived is not None, f"{label} never reached the reader: watches not set again"
    elapsed = time.monotonic() - started
    assert wait_until(
        lambda: cached_view(reader, service) == registry_view(writer, service), timeout=10
    ), (cached_view(reader, service), registry_view(writer, service))
    return elapsed


@pytest.fixture
def proxy(zookeeper: LocalZooKeeper) -> Iterator[TcpProxy]:
    """A relay to the session's server, for one reader whose link a test cuts or holds."""
    relay = TcpProxy("127.0.0.1", zookeeper.members[0].client_port)
    yield relay
    relay.close()


def relayed_reader(
    make_client: Callable[..., Sentinel],
    raw_zk: Any,
    proxy: TcpProxy,
    persistent: bool,
    nodes: list[tuple[str, bytes]],
) -> tuple[Sentinel, Sentinel]:
    """Service ``api`` holding ``nodes`` (written raw), its writer, and a reader following it
    through ``proxy`` in one watch mode, re-syncing at once after a reconnection; the reader's
    cache starts equal to a fresh read."""
    writer = make_client("writer", announce=False)
    writer.ensure_service("api")
    for path, data in nodes:
        raw_zk.create(path, data, makepath=True)
    reader = make_client(
        "reader",
        hosts=proxy.address,
        announce=False,
        cache=CacheConfig(resync_jitter=0),
        persistent_watches=persistent,
    )
    assert reader.persistent_watches is persistent
    reader.prefetch("api")
    assert cached_view(reader, "api") == registry_view(writer, "api")
    return writer, reader
