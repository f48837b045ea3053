"""The sessions a client holds to other regions: one per region, opened lazily, with the
round-trip time measured on each.

A :class:`Remote` is one other region as this client sees it: the client made for it (by a
factory the facade gives, so that nothing here imports the facade), whether it has connected,
and the round-trip times measured to its ensemble. Nothing is opened before a service needs
the region (its first failover there, or a warm service's load): a client whose services
never leave the local region never connects anywhere else.

Opening never blocks a lookup longer than the region's first connection deadline: the first
lookup that needs a region waits for its connection up to ``connect_timeout``; while the
region has not answered by then, lookups skip it at once and a background thread keeps
trying (a new client each attempt, every :data:`RETRY_SECONDS`), so a region cut off at
start-up costs one wait, not one per lookup.

Round-trip time (docs/decisions/nearest-region-by-measured-round-trip.md): the time of one
ZooKeeper request (``exists`` of the namespace root) on the region's own session, so it is
what a lookup there would pay, through whatever the path is (a relay, TLS); the median of the
last :data:`SAMPLES`: :data:`OPENING_SAMPLES` of them when the session opens (one sample on a
busy host can misrank), then one every :data:`RTT_INTERVAL` seconds, on one thread per
client. A region that does not answer within :data:`RTT_TIMEOUT`, or whose session is not
connected, measures infinite. In agent mode the client has no session of its own there: the
time of a ``ping`` through the host agent, which answers once one request on its own session
to the region has come back (docs/decisions/agent-sessions-to-other-regions.md).

A region that no rule of a followed service names, and that no lookup has used, for
:data:`CLOSE_AFTER` seconds is closed again (its session, its round-trip times); the prober
ends when no region is open. Over months of rules set and removed, what a client holds
elsewhere is what its rules need now.

In a forked child none of these threads exist: at the fork the child's regions forget the
openings under way and the prober (:meth:`Remotes._forked`); the next use opens and measures
again, and each region's client renews its own session on first use.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from sentinel.errors import SentinelError, ZooKeeperUnavailable
from sentinel.events import ConnectionChanged
from sentinel.regions.config import Region

log = logging.getLogger(__name__)

#: Seconds between two attempts to open a region's session that did not answer.
RETRY_SECONDS = 1.0
#: Seconds between two measurements of a region's round-trip time.
RTT_INTERVAL = 5.0
#: A measurement waits this long at most; then the region measures infinite.
RTT_TIMEOUT = 2.0
#: Measurements kept per region; the round-trip time is their median.
SAMPLES = 5
#: Measurements taken when a region's session opens, before it is ranked.
OPENING_SAMPLES = 3
#: Seconds a region stays open once no rule of a followed service names it and no lookup has
#: gone there: then its session closes (opened again on next need), so that a rule set for a
#: while holds nothing there once it is removed. Checked by the prober, every RTT_INTERVAL.
CLOSE_AFTER = 300.0

# Every Remotes of this process, for the at-fork hook; weak, so a dropped client is not kept.
_every: weakref.WeakSet[Remotes] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for remotes in list(_every):
        Remotes._forked(remotes)


os.register_at_fork(after_in_child=_after_fork_in_child)


class RemoteClient(Protocol):
    """What this module uses of a client of another region (a :class:`~sentinel.Sentinel`)."""

    session: Any  # its zk, its cache's state, on_listener_thread()

    def start(self) -> Any: ...
    def close(self) -> None: ...
    def eligible_instances(
        self, service: str, key: object = None, policy: Any = None, failover: Any = None
    ) -> Any: ...
    def explain(self, service: str, key: object = None, policy: Any = None) -> Any: ...
    def prefetch(self, service: str) -> None: ...
    def listen(self, service: str | None, callback: Any) -> Any: ...
    def cached_instances(self, service: str) -> Any: ...
    @property
    def connection_state(self) -> str: ...
    @property
    def staleness(self) -> float: ...


class Remote:
    """One other region: its client once connected, and its round-trip times."""

    def __init__(self, region: Region) -> None:
        self.region = region
        #: The region's client, set once it has connected (None before).
        self.client: RemoteClient | None = None
        self.ready = threading.Event()
        self.deadline: float | None = None  # the first connection's, monotonic; None: unopened
        self._samples: deque[float] = deque(maxlen=SAMPLES)
        self.rtt = math.inf  # seconds, the median of the samples
        #: Lookups that went to the region (bumped without a lock: a lost bump is harmless,
        #: only whether it changed is read).
        self.uses = 0
        self._uses_seen = 0
        self._idle_since: float | None = None

    def idle_for(self, needed: bool, now: float) -> float:
        """Seconds the region has been neither ``needed`` by a rule nor used by a lookup, as
        the prober sees it at ``now`` (0: it is, or was since the last look)."""
        if needed or self.uses != self._uses_seen:
            self._uses_seen, self._idle_since = self.uses, None
            return 0.0
        if self._idle_since is None:
            self._idle_since = now
        return now - self._idle_since

    @property
    def connected(self) -> bool:
        """Whether its session is connected now."""
        client = self.client
        # the cache's own state: the facade's property also checks for a fork (a syscall)
        return client is not None and client.session.cache.connection_state == "connected"

    @property
    def down(self) -> bool:
        """Whether the region is known not to answer now: its session was opened and is not
        connected (lost, or never connected within its first deadline)."""
        if self.deadline is None:
            return False  # not opened yet: nothing known
        if self.client is None:
            return time.monotonic() >= self.deadline
        return not self.connected

    def record(self, seconds: float) -> None:
        """Add a measurement (math.inf: no answer)."""
        if math.isinf(seconds):
            self._samples.clear()
            self.rtt = math.inf
            return
        self._samples.append(seconds)
        self.rtt = statistics.median(self._samples)


class Remotes:
    """The other regions of one client, opened lazily, their round-trip times measured.

    ``connect(region)`` makes a client of ``region`` (not started); ``connect_timeout`` bounds
    the first wait for a region's session; ``on_open(name, client)`` is called each time a region
    opens, when its client has connected and before any lookup can use it; ``on_fork()`` in a
    forked child, at the fork, after this object's own renewal (same rules: no I/O, no
    thread); ``needed(name)`` says whether a rule names the region now (:data:`CLOSE_AFTER`).
    """

    def __init__(
        self,
        regions: Iterable[Region],
        connect: Callable[[Region], RemoteClient],
        connect_timeout: float,
        on_open: Callable[[str, RemoteClient], None] = lambda name, client: None,
        on_fork: Callable[[], None] = lambda: None,
        needed: Callable[[str], bool] = lambda name: True,
    ) -> None:
        self.by_name: Mapping[str, Remote] = {r.name: Remote(r) for r in regions}
        self._connect = connect
        self._on_open = on_open
        self._on_fork = on_fork
        self._needed = needed
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._prober: threading.Thread | None = None
        _every.add(self)

    def _forked(self) -> None:
        """In a forked child, at the fork (no I/O, no lock taken, no thread started): none of
        the parent's threads exist here. The locks and events another thread may have held
        are new; a region whose opening thread was running is unopened again (opened on next
        use); the prober is started again by the next use of an opened region
        (:meth:`open`). The regions' clients renew their own sessions on first use, as any
        client in a forked child does (docs/decisions/fork-child-gets-its-own-session.md)."""
        self._lock = threading.Lock()
        self._closed = _copied(self._closed)
        self._prober = None
        for remote in self.by_name.values():
            remote.ready = _copied(remote.ready)
            if not remote.ready.is_set():
                remote.deadline = None
        self._on_fork()

    def open(self, name: str, wait: bool = True) -> RemoteClient | None:
        """The client of region ``name``, opening its session on first use; None when it has
        not connected (within its first deadline, when ``wait``) or is not configured."""
        remote = self.by_name.get(name)
        if remote is None or self._closed.is_set():
            return None
        if remote.ready.is_set():  # no lock on a lookup's way, opened or not
            if self._prober is None:  # a forked child's first use: measure here too
                with self._lock:
                    self._start_prober()
            return remote.client
        if remote.deadline is None:
            with self._lock:
                if remote.deadline is None:
                    self._start_opening(remote)
        left = remote.deadline - time.monotonic()  # type: ignore[operator]  # set above
        if wait and left > 0:  # only until the first deadline: then skipped at once
            remote.ready.wait(left)
        return remote.client if remote.ready.is_set() else None

    def _start_opening(self, remote: Remote) -> None:
        """Begin opening ``remote``'s session in the background (holding the lock)."""
        remote.deadline = time.monotonic() + self._connect_timeout
        threading.Thread(
            target=self._open,
            args=(remote,),
            name=f"sentinel-region-{remote.region.name}",
            daemon=True,
        ).start()
        self._start_prober()

    def _start_prober(self) -> None:
        """Start the round-trip prober unless it runs (holding the lock)."""
        if self._prober is None and not self._closed.is_set():
            self._prober = threading.Thread(
                target=self._probe, name="sentinel-region-rtt", daemon=True
            )
            self._prober.start()

    def open_all(self, names: Iterable[str], wait: bool = True) -> None:
        """Open every region of ``names`` at once and, when ``wait``, wait for them (each
        within its first deadline), so that each has a round-trip time: what ``nearest``
        needs."""
        names = [n for n in names if n in self.by_name]
        for name in names:
            self.open(name, wait=False)
        if wait:
            for name in names:
                self.open(name, wait=True)

    def opening(self, name: str) -> bool:
        """Whether region ``name``'s session is being opened and still within its first
        deadline (a lookup that waited would get it, or give up at that deadline)."""
        remote = self.by_name.get(name)
        if remote is None or remote.deadline is None or remote.ready.is_set():
            return False
        return time.monotonic() < remote.deadline

    def _open(self, remote: Remote) -> None:
        """Connect ``remote`` (a thread per region, until it has connected or we close)."""
        failures = 0
        while not self._closed.is_set():
            client = self._connect(remote.region)
            try:
                client.start()
                self._wait_connected(client, remote.deadline)  # type: ignore[arg-type]  # set
            except Exception as exc:  # this thread must not die: lookups skip the region
                failures += 1
                if not isinstance(exc, SentinelError):
                    log.error("opening region %r failed", remote.region.name, exc_info=True)
                elif failures == 1:
                    log.warning(
                        "region %r (%s) did not answer: %s; lookups skip it while it does not, "
                        "retrying every %gs",
                        remote.region.name,
                        client.session.agent or remote.region.hosts,  # the agent: its socket
                        exc,
                        RETRY_SECONDS,
                    )
                client.close()
                self._closed.wait(RETRY_SECONDS)
                continue
            with self._lock:
                if self._closed.is_set():
                    client.close()
                    return
                remote.client = client
            self._on_open(remote.region.name, client)
            for _ in range(OPENING_SAMPLES):  # one sample on a busy host can mislead a rank
                remote.record(self._measure(client))
            remote.ready.set()
            log.info("region %r connected (%s)", remote.region.name, remote.region.hosts)
            return

    @staticmethod
    def _wait_connected(client: RemoteClient, deadline: float) -> None:
        """Return once ``client`` is connected: at once for a session of its own (its start
        waited); through the host agent, once the agent's session to the region is (the
        agent opens it on the first process's hello), waiting until the first ``deadline``
        (at least RETRY_SECONDS). ZooKeeperUnavailable otherwise: the region has not
        answered, as when a session of its own does not connect."""
        link = client.session.agent_link
        if link is None:
            return  # a session of its own: its start waited for it
        connected = threading.Event()

        def heard(event: object) -> None:
            if isinstance(event, ConnectionChanged) and event.state == "connected":
                connected.set()

        remove = client.listen(None, heard)
        try:
            wait = max(deadline - time.monotonic(), RETRY_SECONDS)
            if not link.agent_connected and not connected.wait(wait):
                raise ZooKeeperUnavailable(
                    f"the host agent's session to it is {client.connection_state}"
                )
        finally:
            remove()

    @staticmethod
    def _measure(client: RemoteClient) -> float:
        """One round trip to the client's ensemble, in seconds (math.inf: no answer)."""
        if client.connection_state != "connected":
            return math.inf
        session = client.session
        started = time.perf_counter()
        try:
            if session.agent_link is not None:  # through the agent's session to the region
                session.agent_link.request({"op": "ping"}, timeout=RTT_TIMEOUT)
            else:
                session.zk.exists_async("/").get(timeout=RTT_TIMEOUT)
        except Exception:  # a timeout, a lost connection: no answer is the measurement
            return math.inf
        return time.perf_counter() - started

    def _probe(self) -> None:
        """Measure every connected region's round trip, every RTT_INTERVAL seconds; close
        those idle for CLOSE_AFTER; end when no region is open."""
        while not self._closed.wait(RTT_INTERVAL):
            now = time.monotonic()
            for remote in list(self.by_name.values()):
                if remote.client is None:
                    continue
                if remote.idle_for(self._needed(remote.region.name), now) >= CLOSE_AFTER:
                    self._shut(remote)
                else:
                    remote.record(self._measure(remote.client))
            with self._lock:
                if all(r.deadline is None for r in self.by_name.values()):
                    self._prober = None  # the next opening starts another
                    return

    def _shut(self, remote: Remote) -> None:
        """Close an opened region's session and make it unopened again (opened on next use).
        A lookup that took its client just before gets the closed client's error, and tries
        the next region."""
        with self._lock:
            client = remote.client
            if client is None or self._closed.is_set() or not remote.ready.is_set():
                return
            remote.client, remote.deadline, remote.ready = None, None, threading.Event()
            remote.record(math.inf)
        log.info(
            "region %r closed: no rule names it and no lookup went there for %gs",
            remote.region.name,
            CLOSE_AFTER,
        )
        client.close()

    def nearest(self, count: int, exclude: Iterable[str] = ()) -> list[str]:
        """The ``count`` regions of least round-trip time (connected ones only)."""
        skip = set(exclude)
        measured = [
            r
            for r in self.by_name.values()
            if r.region.name not in skip and r.connected and not math.isinf(r.rtt)
        ]
        measured.sort(key=lambda r: r.rtt)
        return [r.region.name for r in measured[:count]]

    def close(self) -> None:
        """Close every region's session; nothing opens after this."""
        with self._lock:
            self._closed.set()
            clients = [r.client for r in self.by_name.values() if r.client is not None]
        for client in clients:
            client.close()


def _copied(event: threading.Event) -> threading.Event:
    """A new event in the state of ``event`` (whose lock a thread that is gone may hold)."""
    fresh = threading.Event()
    if event.is_set():  # reads the flag without the lock
        fresh.set()
    return fresh
