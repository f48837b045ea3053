"""Protection from mass loss: instances lost to session expiries, served a bounded time more.

When ZooKeeper expires many publishers' sessions at once (a server pause, a network blip on
the ensemble's side), their instance nodes vanish together and every client would drop most of
a service in one moment, though the processes behind them live and register again seconds
later. With :class:`MassLossProtection` set, a cache that sees more than ``share`` of a
service's instances vanish *unmarked* within ``window`` seconds keeps serving them, each for
``hold`` seconds from its loss at most, marked ``unlisted_since``, until the registry lists it
again (its process re-registered) or the hold ends (it is really gone).

A vanish is unmarked when it is not a deregistration: a deregistering owner creates and deletes
a departure mark in the transaction that deletes its node
(:func:`~sentinel.registry.layout.departure_path`), so deregistrations, drains and closing
clients are never held back (docs/decisions/deregistration-marks-its-delete.md). Owners mark
only when the service's spec says so (``ServiceSpec.mark_departures``), so only such services
are protected: for the others a deregistration and an expiry look the same. The state is
per cache and per service, changed on the cache's worker only; the protected instances live in
the service's immutable snapshot (:attr:`ServiceSnapshot.protected
<sentinel.cache.views.ServiceSnapshot.protected>`), so a lookup pays nothing for them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from sentinel import validation as check
from sentinel.cache.stats import CacheStats
from sentinel.cache.views import ServiceSnapshot
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.records import ServiceSpec

log = logging.getLogger(__name__)

# Wake-ups this close (seconds) are one: the hold's end recomputed on each change.
_SAME_TIME = 0.05


@dataclass(frozen=True)
class MassLossProtection:
    """When and how long a cache keeps serving instances lost to session expiries.

    Attributes
    ----------
    share : float, default 0.5
        Protection starts when more than this share of a service's instances (those listed
        plus those lost within ``window``) vanished unmarked within ``window``.
    window : float, default 10.0
        Seconds within which the losses are counted together.
    hold : float, default 10.0
        Seconds a lost instance is served at most, from its loss; one the registry lists
        again before then is the listed one at once. Four times the slowest return of a
        blip measured (``python -m benchmarks.mass_loss``, ``docs/benchmarks.md``).
    """

    share: float = 0.5
    window: float = 10.0
    hold: float = 10.0

    def __post_init__(self) -> None:
        # Below 1: "more than every instance" could never happen, and protection never start.
        check.number("share", self.share, least=0, most=0.99)
        check.number("window", self.window, above=0)
        check.number("hold", self.hold, above=0)


@dataclass
class _Losses:
    """One service's unmarked losses: name -> (endpoint as last listed, monotonic time lost,
    wall time lost), and when its episode began (None: not protecting)."""

    lost: dict[str, tuple[Endpoint, float, float]] = dataclasses.field(default_factory=dict)
    since: float | None = None


class Protection:
    """The protection state of one cache, applied to each snapshot it is about to serve.

    ``wake(service, delay)`` asks for :meth:`apply` to run again for ``service`` after
    ``delay`` seconds (the cache queues it on its worker), so a hold ends on time. What it
    does is counted in ``stats`` (exported: ``docs/telemetry.md``): the instances served
    protected now, by service, and the episodes begun.
    """

    def __init__(
        self, config: MassLossProtection, stats: CacheStats, wake: Callable[[str, float], None]
    ) -> None:
        self.config = config
        self._stats = stats
        self._wake = wake
        self._services: dict[str, _Losses] = {}

    def apply(
        self,
        service: str,
        old: ServiceSnapshot,
        new: ServiceSnapshot,
        lost: Collection[str] = (),
    ) -> ServiceSnapshot:
        """``new`` with the instances it should protect; ``lost``: the names that vanished
        from ``old`` unmarked (a session's expiry, as far as this cache can tell). A service
        whose spec does not mark departures is never protected: its every vanish is unmarked."""
        if not new.spec.mark_departures:
            if service in self._services:
                self.forget(service)
            return new.rebuilt(protected={}) if new.protected else new
        state = self._services.get(service)
        if state is None and not lost:
            return new  # nothing lost, nothing held: the common case costs this test
        state = state or self._services.setdefault(service, _Losses())
        now, wall = time.monotonic(), time.time()
        for name in lost:
            endpoint = old.endpoints.get(name)
            if endpoint is not None and name not in new.endpoints:
                state.lost[name] = (endpoint, now, wall)
        config = self.config
        keep_for = config.hold if state.since is not None else config.window
        state.lost = {
            name: loss
            for name, loss in state.lost.items()
            if name not in new.endpoints and now - loss[1] < keep_for
        }
        if state.since is None and len(state.lost) > config.share * (
            len(new.endpoints) + len(state.lost)
        ):
            state.since = wall
            self._stats.protection_episodes += 1
            state.lost = {n: loss for n, loss in state.lost.items() if now - loss[1] < config.hold}
            log.warning(
                "service %r lost %d of %d instance(s) to session expiries within %gs: serving "
                "them, marked protected, for up to %gs each while they may come back",
                service,
                len(state.lost),
                len(new.endpoints) + len(state.lost),
                config.window,
                config.hold,
            )
        protected = {}
        if state.since is not None:
            protected = {
                name: dataclasses.replace(endpoint, unlisted_since=at)
                for name, (endpoint, _, at) in state.lost.items()
            }
        if state.lost:
            first = min(loss[1] for loss in state.lost.values())
            self._wake(service, first + (config.hold if state.since else config.window) - now)
        else:
            if state.since is not None:
                log.warning("service %r: protection from mass loss ended", service)
            del self._services[service]
        self._count(service, len(protected))
        if dict(new.protected) != protected:
            new = new.rebuilt(protected=protected)
        return new

    def counting(self, service: str) -> bool:
        """Whether losses of ``service`` are being counted or held (a window or an episode)."""
        return service in self._services

    def forget(self, service: str) -> None:
        """``service`` is no longer followed: nothing of it is held."""
        self._services.pop(service, None)
        self._count(service, 0)

    def _count(self, service: str, protected: int) -> None:
        # A new dict each time: telemetry iterates it from another thread.
        counts = self._stats.protected
        if counts.get(service, 0) != protected:
            self._stats.protected = {s: n for s, n in counts.items() if s != service} | (
                {service: protected} if protected else {}
            )


def unprotected_note(config: MassLossProtection | None, spec: ServiceSpec) -> str | None:
    """What ``explain()`` says when a cache configured to protect cannot protect ``spec``'s
    service (None: it can, or it is not configured to)."""
    if config is None or spec.mark_departures:
        return None
    return (
        f"protection from mass loss is configured but does not apply: the spec of "
        f"{spec.service!r} does not mark departures, so its deregistrations look like session "
        f"expiries (create it with ensure_service({spec.service!r}, mark_departures=True))"
    )


def eligible_verdict(endpoint: Endpoint) -> str:
    """What ``explain()`` says of an eligible ``endpoint``: ``"eligible"``, or for one the
    registry no longer lists, that it is served protected and since when."""
    if endpoint.unlisted_since is None:
        return "eligible"
    gone = max(time.time() - endpoint.unlisted_since, 0.0)
    return (
        f"eligible, protected: no longer listed by the registry (its session ended {gone:.1f}s "
        "ago in a mass loss); served until it registers again or the hold ends"
    )


class Timers:
    """One pending wake-up per service, on daemon timer threads (at most one per service
    with losses: protection holds seconds, not hours); :meth:`close` cancels them all."""

    def __init__(self, run: Callable[[str], None]) -> None:
        self._run = run
        self._lock = threading.Lock()
        self._timers: dict[str, tuple[threading.Timer, float]] = {}  # with its monotonic due
        self._closed = False

    def wake(self, service: str, delay: float) -> None:
        """Call ``run(service)`` in ``delay`` seconds (replacing a wake-up pending for it at
        another time; one pending for the same time is kept, so a burst of changes during an
        episode starts no thread)."""
        due = time.monotonic() + max(delay, 0.0)
        with self._lock:
            if self._closed:
                return
            previous = self._timers.pop(service, None)
            if previous is not None:
                if abs(previous[1] - due) < _SAME_TIME:
                    self._timers[service] = previous
                    return
                previous[0].cancel()
            timer = threading.Timer(max(delay, 0.0), self._fire, (service, due))
            timer.daemon = True
            self._timers[service] = (timer, due)
            timer.start()

    def _fire(self, service: str, due: float) -> None:
        with self._lock:
            pending = self._timers.get(service)
            if pending is not None and pending[1] == due:
                del self._timers[service]
        self._run(service)

    def close(self) -> None:
        """Cancel every pending wake-up; later ones are ignored."""
        with self._lock:
            self._closed = True
            timers, self._timers = list(self._timers.values()), {}
        for timer, _ in timers:
            timer.cancel()
