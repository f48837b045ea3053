"""What the dashboard reads: one Sentinel client's cache, and the CLI's readers for the rest.

The client follows every service listed under ``/services`` (a children watch, as ``sentinel
watch`` keeps one: kazoo's thread only queues the listing, a thread of this source loads the
new services), so pages about services are read from its cache and cost ZooKeeper nothing.
What the cache does not hold (``/clients``, shard maps, ``doctor``) is read with the CLI's own
readers, at most once per ``ttl`` seconds whatever the number of viewers: a page load never
adds reads of its own while a recent answer is at hand.

Everything is read as the client's identity: ZooKeeper's ACLs decide what this dashboard may
show, and a service it may not read is listed with the reason only.
"""

from __future__ import annotations

import argparse
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import ChildrenWatch

from sentinel.errors import SentinelError
from sentinel.registry.layout import SERVICES
from sentinel.zk.errors import translate

if TYPE_CHECKING:
    from sentinel.cache.views import ServiceSnapshot
    from sentinel.cli.findings import Finding
    from sentinel.client import Sentinel
    from sentinel.registry.records import ClientRecord

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a read of ``/clients``, the shard maps or doctor's findings is reused.
DEFAULT_TTL = 2.0


class _Shared:
    """One value read at most once per ``ttl`` seconds, however many threads ask: the ones
    asking while it is read wait for that read rather than making their own."""

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._lock = threading.Lock()
        self._value: Any = None
        self._read_at = -float("inf")

    def get(self, read: Callable[[], T]) -> T:
        with self._lock:
            if time.monotonic() - self._read_at >= self._ttl:
                self._value = read()
                self._read_at = time.monotonic()
            value: T = self._value
            return value


class RegistrySource:
    """The dashboard's view of the registry through ``sentinel`` (a started client).

    ``doctor_args`` are ``sentinel doctor``'s options for the doctor page (None: the page
    says doctor is not available here); ``on_listing`` is called (from this source's thread)
    when services appear or go, so that open pages hear of it.
    """

    def __init__(
        self,
        sentinel: Sentinel,
        *,
        ttl: float = DEFAULT_TTL,
        doctor_args: argparse.Namespace | None = None,
    ) -> None:
        self.sentinel = sentinel
        self.doctor_args = doctor_args
        self.on_listing: Callable[[], None] = lambda: None
        self._listed: tuple[str, ...] = ()
        #: Why a listed service could not be loaded (its spec unreadable to this identity...).
        self.unreadable: dict[str, str] = {}
        self._arrived: queue.SimpleQueue[list[str] | None] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="sentinel-ui-follow", daemon=True)
        self._shared = {name: _Shared(ttl) for name in ("clients", "maps", "doctor")}

    # --- following every service ----------------------------------------------------------

    def start(self, timeout: float = 10.0) -> RegistrySource:
        """Follow ``/services`` and load what is listed now (waits up to ``timeout``)."""
        self._thread.start()
        ChildrenWatch(self.sentinel.session.zk, SERVICES, self._on_services)
        self._ready.wait(timeout)
        return self

    def close(self) -> None:
        """Stop following (the client is its owner's to close)."""
        self._arrived.put(None)

    def _on_services(self, children: list[str]) -> bool | None:
        """kazoo's thread: queue the listing, nothing more."""
        self._arrived.put(list(children))
        return None

    def _follow(self) -> None:
        while (children := self._arrived.get()) is not None:
            listed = tuple(sorted(children))
            for service in listed:
                if service in self.sentinel.session.cache.snapshots:
                    continue
                try:
                    self.sentinel.prefetch(service)
                    self.unreadable.pop(service, None)
                except SentinelError as exc:
                    self.unreadable[service] = str(exc)
                except (KazooException, KazooTimeoutError) as exc:
                    self.unreadable[service] = str(translate(exc, f"reading {service}"))
            changed = listed != self._listed
            self._listed = listed
            self._ready.set()
            if changed:
                self.on_listing()

    # --- what the pages read --------------------------------------------------------------

    @property
    def listed(self) -> tuple[str, ...]:
        """The services ``/services`` lists (every one, readable or not)."""
        return self._listed

    @property
    def snapshots(self) -> dict[str, ServiceSnapshot]:
        """The cache's snapshots by service (a copy: the cache swaps its entries)."""
        return dict(self.sentinel.session.cache.snapshots)

    def clients(self) -> dict[str, dict[str, ClientRecord]]:
        """``/clients`` as ``sentinel deps`` reads it."""
        from sentinel.registry.reads import read_clients

        return self._shared["clients"].get(lambda: read_clients(self.sentinel.session.zk))

    def shard_maps(self) -> list[tuple[str, Any]]:
        """Each shard policy: ``(policy, (spec, keys per partition, gaps, digest problem))``,
        as ``sentinel shard stats`` and ``doctor`` read them, or ``(policy, error text)``."""
        return self._shared["maps"].get(self._read_maps)

    def _read_maps(self) -> list[tuple[str, Any]]:
        from sentinel.cli.shard import keys_and_gaps
        from sentinel.shards.store import existing_policies, read_map_state

        zk = self.sentinel.session.zk
        found: list[tuple[str, Any]] = []
        for policy in existing_policies(zk):
            try:
                counts, gaps = keys_and_gaps(zk, policy)
                state = read_map_state(zk, policy)
            except SentinelError as exc:
                found.append((policy, str(exc)))
                continue
            found.append((policy, (state.spec, counts, gaps, state.digest_problem)))
        return found

    def findings(self) -> tuple[list[Finding], bool]:
        """``sentinel doctor``'s findings (and whether they span regions)."""
        from sentinel.cli.doctor import diagnose

        if self.doctor_args is None:
            return [], False
        return self._shared["doctor"].get(lambda: diagnose(self.doctor_args))
