"""How the cache follows ZooKeeper and answers lookups, as one validated value.

:class:`CacheConfig` groups the cache's settings as :class:`~sentinel.zk.tls.TlsConfig` groups
TLS's: a frozen value checked when it is made, so a wrong setting fails where it is written,
and plain data that pickles into a Spark closure::

    Sentinel(hosts, "billing-api", cache=CacheConfig(snapshot_path="/var/lib/billing/zk.json"))
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sentinel import validation as check
from sentinel.cache.protection import MassLossProtection
from sentinel.errors import ValidationError
from sentinel.registry.layout import validate_base_path

# A forked child serves its parent's cache only this young: with the re-sync's jitter (at most
# resync_jitter, 0.5 s) added, what it serves stays within the 1 s wait that
# deregister(registration, wait=1.0) gives before a server stops (docs/publishing.md).
DEFAULT_INHERITED_MAX_AGE = 0.5


@dataclass(frozen=True)
class CacheConfig:
    """The cache's settings (``docs/resolution.md``, ``docs/reliability.md``).

    Each is checked here: a value of the wrong type or out of its range raises
    :class:`~sentinel.errors.ValidationError` naming it.

    Attributes
    ----------
    persistent_watches : bool, default True
        Follow each section with one ZooKeeper 3.6 persistent recursive watch, kept across
        reconnections within the session (:mod:`sentinel.zk.watches`); False, or a server
        older than 3.6, keeps kazoo's one-shot watches, re-read after every reconnection.
    negative_ttl : float, default 1.0
        Seconds a shard key found nowhere is remembered as missing before ZooKeeper is asked
        again.
    read_through_rate : float, default 100.0
        Cap on Procedure 1's direct reads of uncached keys, per service and second.
    resync_jitter : float, default 0.5
        The re-read after a reconnection waits a random delay of up to this many seconds, so
        a fleet does not re-read at once.
    snapshot_path : path or None, default None (no snapshot)
        A file the cache is written to; when no server answers at start, the client serves
        that last-known-good snapshot, marked stale, and keeps connecting.
    snapshot_interval : float, default 1.0
        The snapshot is written at most this often (seconds).
    inherited_max_age : float or None, default 0.5
        In a forked child (gunicorn ``--preload``, ``multiprocessing``), the oldest the
        parent's cache may be for the child to serve it while its own session connects.
        Older, the child's first lookup of each service waits for its own session's read (up
        to the client's ``connect_timeout``, then
        :class:`~sentinel.errors.ZooKeeperUnavailable`), so a worker forked long before its
        first request never returns an instance drained since. None serves the inherited
        cache however old it is.
    curator_base_paths : tuple of str, default () (none)
        Apache Curator x-discovery base paths (Curator, Spring Cloud Zookeeper, Dubbo 3) on
        the client's own ensemble: a service the namespace does not hold is looked for under
        each, in order, and followed there on the client's session (``docs/interop.md``).
        Needs ZooKeeper 3.6's persistent watches.
    events_on_connection_thread : bool, default True
        With persistent watches: take each watch event on kazoo's connection thread as it is
        read, and send the changed instance's or metrics node's read right there, so the
        cache's worker wakes once, to the reply. False hands events to kazoo's callback thread
        and leaves every read to the worker (one thread wake-up more per change: the path
        ``python -m benchmarks.floor`` and ``benchmarks.hops --worker-reads`` compare).
    mass_loss_protection : MassLossProtection or None, default None (off)
        When more than a share of a service's instances vanish through session expiries
        (never deregistrations) within seconds, keep serving them, each marked
        ``Endpoint.unlisted_since`` and for a bounded time, while they may register again
        (``docs/health.md``, "Protection from mass loss"). Off by default: a lookup then only
        returns instances the registry lists. Needs persistent watches, and applies only to
        services whose spec marks departures (``ensure_service(..., mark_departures=True)``);
        ``explain()`` says when it does not apply.
    """

    persistent_watches: bool = True
    negative_ttl: float = 1.0
    read_through_rate: float = 100.0
    resync_jitter: float = 0.5
    snapshot_path: str | os.PathLike[str] | None = None
    snapshot_interval: float = 1.0
    inherited_max_age: float | None = DEFAULT_INHERITED_MAX_AGE
    curator_base_paths: tuple[str, ...] = ()
    events_on_connection_thread: bool = True
    mass_loss_protection: MassLossProtection | None = None

    def __post_init__(self) -> None:
        check.flag("persistent_watches", self.persistent_watches)
        check.flag("events_on_connection_thread", self.events_on_connection_thread)
        check.instance("mass_loss_protection", self.mass_loss_protection, MassLossProtection)
        check.number("negative_ttl", self.negative_ttl, least=0)
        check.number("read_through_rate", self.read_through_rate, above=0)
        check.number("resync_jitter", self.resync_jitter, least=0)
        check.path("snapshot_path", self.snapshot_path)
        check.number("snapshot_interval", self.snapshot_interval, above=0)
        if self.inherited_max_age is not None:
            check.number("inherited_max_age", self.inherited_max_age, least=0)
        paths = self.curator_base_paths
        if isinstance(paths, str) or not isinstance(paths, tuple | list):
            raise ValidationError("curator_base_paths must be a tuple of ZooKeeper paths")
        for path in paths:
            validate_base_path(path, "curator_base_paths entry")
        object.__setattr__(self, "curator_base_paths", tuple(paths))
