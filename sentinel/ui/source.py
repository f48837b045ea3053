"""What the dashboard reads: one Sentinel client's cache, and the CLI's readers for the rest.

The client follows every service listed under ``/services`` (a children watch, as ``sentinel
watch`` keeps one: kazoo's thread only queues the listing, a thread of this source loads the
new services), so pages about services are read from its cache and cost ZooKeeper nothing.
What the cache does not hold (``/clients``, shard maps, ``doctor``) is read with the readers
``sentinel deps``, ``shard stats`` and ``doctor`` use (the command line hands its own in:
:class:`Readers`), at most once per ``ttl`` seconds whatever the number of viewers: a page
load never adds reads of its own while a recent answer is at hand.

Everything is read as the client's identity: ZooKeeper's ACLs decide what this dashboard may
show, and a service it may not read is listed with the reason only.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import ChildrenWatch

from sentinel.errors import SentinelError
from sentinel.registry.layout import SERVICES
from sentinel.registry.reads import read_clients
from sentinel.zk.errors import translate

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from sentinel.cache.views import ServiceSnapshot
    from sentinel.client import Sentinel
    from sentinel.registry.records import ClientRecord

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a read of ``/clients``, the shard maps or doctor's findings is reused.
DEFAULT_TTL = 2.0


class _Shared:
    """One value read at most once per ``ttl`` seconds, however many threads ask.

    The first read is waited for; after that an answer older than ``ttl`` is given as it is
    while one thread of its own reads it again (a page never waits for a read the others
    made it need), and a failed read again keeps the last answer (logged).
    """

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._lock = threading.Lock()
        self._value: Any = None
        self._read_at: float | None = None
        self._refreshing = False

    def get(self, read: Callable[[], T]) -> T:
        with self._lock:
            if self._read_at is None:  # nothing to give yet: read, the others wait
                self._value = read()
                self._read_at = time.monotonic()
            elif time.monotonic() - self._read_at >= self._ttl and not self._refreshing:
                self._refreshing = True
                threading.Thread(
                    target=self._refresh, args=(read,), name="sentinel-ui-read", daemon=True
                ).start()
            value: T = self._value
            return value

    def _refresh(self, read: Callable[[], Any]) -> None:
        try:
            value = read()
        except Exception:
            log.warning("the dashboard could not read the registry again", exc_info=True)
            value = self._value
        with self._lock:
            self._value, self._read_at, self._refreshing = value, time.monotonic(), False


#: ``sentinel drain``'s write: ``(zk, service, instance, status)`` to ``(name, status
#: before)``, or why the instance is not there.
SetStatus = Callable[["KazooClient", str, str, str], "tuple[str, str] | str"]


@dataclass(frozen=True)
class Readers:
    """What the command line lends the dashboard (the dashboard stands above nothing of it).

    ``shard_maps(zk)``: each policy as ``(policy, (spec, keys per partition, gaps by
    service, digest problem))`` or ``(policy, why it is unreadable)``; ``findings()``:
    ``sentinel doctor``'s findings and whether they span regions; ``set_status``: the drain
    write. None: the page or action is not offered.
    """

    shard_maps: Callable[[KazooClient], list[tuple[str, Any]]] | None = None
    findings: Callable[[], tuple[list[Any], bool]] | None = None
    set_status: SetStatus | None = None


class RegistrySource:
    """The dashboard's view of the registry through ``sentinel`` (a started client) and
    ``readers``. ``on_listing`` is called (from this source's thread) when services appear
    or go, so that open pages hear of it.
    """

    def __init__(
        self, sentinel: Sentinel, readers: Readers = Readers(), *, ttl: float = DEFAULT_TTL
    ) -> None:
        self.sentinel = sentinel
        self.readers = readers
        self.on_listing: Callable[[], None] = lambda: None
        self._listed: tuple[str, ...] = ()
        #: Why a listed service could not be loaded (its spec unreadable to this identity...).
        self.unreadable: dict[str, str] = {}
        self._arrived: queue.SimpleQueue[list[str] | None] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._closed = False
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
        self._closed = True
        self._arrived.put(None)

    def _on_services(self, children: list[str]) -> bool | None:
        """kazoo's thread: queue the listing, nothing more (False ends the watch)."""
        if self._closed:
            return False
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

    def declared_partitions(self) -> dict[str, tuple[str, ...]]:
        """The partitions each shard policy the cache holds declares (a range policy's: those
        its boundaries name)."""
        return {
            policy: (*(m.spec.partitions or ()), *(p for _, p in m.spec.boundaries))
            for policy, m in dict(self.sentinel.session.cache.shard_maps).items()
            if m is not None
        }

    def clients(self) -> dict[str, dict[str, ClientRecord]]:
        """``/clients`` as ``sentinel deps`` reads it."""
        return self._shared["clients"].get(lambda: read_clients(self.sentinel.session.zk))

    def shard_maps(self) -> list[tuple[str, Any]]:
        """Each shard policy, as :attr:`Readers.shard_maps` reads it (none without it)."""
        read = self.readers.shard_maps
        if read is None:
            return []
        return self._shared["maps"].get(lambda: read(self.sentinel.session.zk))

    def findings(self) -> tuple[list[Any], bool]:
        """``sentinel doctor``'s findings (and whether they span regions)."""
        read = self.readers.findings
        if read is None:
            return [], False
        return self._shared["doctor"].get(read)
