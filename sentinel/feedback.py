"""What the application learned by using endpoints: outcomes, latency, and the instances
ejected for their failures (passive outlier detection, after Envoy's).

``Sentinel.report(endpoint, ok, latency)`` feeds it (the HTTP transport and the pools do it for
every call). :class:`OutlierDetection` says when an instance is ejected: ``consecutive_failures``
failures in a row, or a success rate under ``min_success_percent`` over at least
``min_requests`` calls within ``interval`` seconds. An ejection lasts ``base_ejection_time``
times the number of times the instance was ejected (capped by ``max_ejection_time``; the count
falls by one per ``interval`` it spends healthy). Two bounds protect a partition from its own
feedback: at most ``max_ejection_percent`` of its up instances are ejected at once, and when
fewer than ``panic_threshold`` percent of them are unflagged the partition is in *panic*:
lookups spread over every up instance, and the client says so (a log line per episode,
:meth:`Sentinel.explain() <sentinel.client.Sentinel.explain>`, Prometheus). Latencies feed an
exponentially weighted moving average that load-aware balancers read; it decays toward zero
while it is not refreshed, as Finagle's ``PeakEwma`` cost does, so an instance whose first
answer was slow (a cold start) is tried again once its estimate has decayed below the others'
rather than never (:meth:`InstanceFeedback.latency`).

The lookup path reads :attr:`InstanceFeedback.outliers` without a lock: a dict that is replaced,
never changed, and that is empty while nothing is ejected. What it decides for a partition is
kept with that dict (:meth:`InstanceFeedback.admit`), so a warm lookup during an ejection is a
dict lookup, an identity check and one clock read.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sentinel import validation as check
from sentinel.errors import ValidationError
from sentinel.registry.endpoint import Endpoint

log = logging.getLogger(__name__)

_Key = tuple[str, str, str, str]

# Decisions kept per published outlier dict, one per partition looked up (by the identity of the
# snapshot's tuple of up instances). Past this many (more partitions looked up, or old snapshots'
# tuples) the memo starts again empty, so it cannot grow without bound.
_MAX_VERDICTS = 4096

# Seconds (of the feedback's clock) an instance goes unreported before its record may be
# forgotten, and between two sweeps for such records: instances come and go for months, and a
# record kept per instance ever reported would grow with every one of them. Only a record that
# holds nothing a new one would not is forgotten (see InstanceFeedback._sweep), so forgetting
# changes no ejection; the latency estimate goes with it, as one never refreshed for this long
# says nothing of the instance now.
_FORGET_AFTER = 600.0


def _key(endpoint: Endpoint) -> _Key:
    # The URI with the name: a client that fails over shares its feedback with its clients of
    # the other regions, whose instances may bear the same (service, partition, label); what
    # failed is the address called, so one region's failures never eject another's instance.
    return (endpoint.service, endpoint.partition, endpoint.label, endpoint.uri)


# Every record of this process, for the at-fork hook; weak, so a dropped one is not kept.
_records: weakref.WeakSet[InstanceFeedback] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for feedback in list(_records):
        InstanceFeedback._after_fork(feedback)


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True)
class OutlierDetection:
    """When reported failures eject an instance, for how long, and the bounds that protect a
    partition (``docs/health.md``, "Passive ejection", gives the reasons for each default).

    Each is checked here: a value of the wrong type or out of its range raises
    :class:`~sentinel.errors.ValidationError` naming it.

    Attributes
    ----------
    consecutive_failures : int, default 3
        Failures in a row (no success between, each within ``interval`` of the one before)
        that eject an instance.
    interval : float, default 10.0
        Seconds of the window the success rate is counted over; also how long an instance
        must stay healthy for its ejection multiplier to fall by one.
    min_success_percent : float, default 50.0
        An instance whose calls within ``interval`` succeed less often than this (in percent,
        0 turns the rule off) is ejected, once it has at least ``min_requests`` calls there.
    min_requests : int, default 20
        Calls within ``interval`` below which the success rate is not judged.
    base_ejection_time : float, default 30.0
        Seconds of a first ejection; the n-th ejection in a row lasts n times as long.
    max_ejection_time : float, default 300.0
        The longest an ejection lasts (at least ``base_ejection_time``).
    max_ejection_percent : float, default 30.0
        At most this share of a partition's up instances is ejected at once (at least one
        instance whatever the share, unless it is 0); those ejected first stay ejected, the
        others are served.
    panic_threshold : float, default 50.0
        When fewer than this percent of a partition's up instances are free of ejection, the
        partition is in panic: lookups ignore ejections there (0: never).
    """

    consecutive_failures: int = 3
    interval: float = 10.0
    min_success_percent: float = 50.0
    min_requests: int = 20
    base_ejection_time: float = 30.0
    max_ejection_time: float = 300.0
    max_ejection_percent: float = 30.0
    panic_threshold: float = 50.0

    def __post_init__(self) -> None:
        check.integer("consecutive_failures", self.consecutive_failures, least=1)
        check.number("interval", self.interval, above=0)
        check.number("min_success_percent", self.min_success_percent, least=0, most=100)
        check.integer("min_requests", self.min_requests, least=1)
        check.number("base_ejection_time", self.base_ejection_time, least=0)
        check.number("max_ejection_time", self.max_ejection_time, least=0)
        if self.max_ejection_time < self.base_ejection_time:
            raise ValidationError(
                f"max_ejection_time must be at least base_ejection_time "
                f"({self.base_ejection_time:g}), got {self.max_ejection_time!r}"
            )
        check.number("max_ejection_percent", self.max_ejection_percent, least=0, most=100)
        check.number("panic_threshold", self.panic_threshold, least=0, most=100)


class Ejection(NamedTuple):
    """One instance's current ejection: when it began and when it ends (the feedback's clock)."""

    since: float
    until: float


class Outliers(dict[_Key, Ejection]):
    """The instances ejected now, by ``(service, partition, label, uri)``: published whole, never
    changed once published; ``verdicts`` holds what it decided per partition."""

    __slots__ = ("generation", "verdicts")

    def __init__(self, *args: Any, generation: int = 0) -> None:
        super().__init__(*args)
        #: Counts the publications: a decision on a later one saw a later state.
        self.generation = generation
        self.verdicts: dict[int, Verdict] = {}


@dataclass(frozen=True, slots=True)
class Verdict:
    """What outlier detection makes of one partition's up instances at one time.

    ``admitted`` is what lookups choose from: ``instances`` itself (the same object) when
    nothing is ejected or in ``panic``; ``ejected`` are skipped; ``spared`` were ejected by
    their failures but are served, over ``max_ejection_percent`` or in panic. The verdict holds
    until ``until`` (the earliest end of an ejection among them) or the next ejection.
    """

    instances: Sequence[Endpoint]
    admitted: Sequence[Endpoint]
    ejected: tuple[Endpoint, ...]
    spared: tuple[Endpoint, ...]
    panic: bool
    until: float

    def describe(self, detection: OutlierDetection) -> str:
        """One line for ``explain()``: what was ejected, what was spared and why."""
        flagged = len(self.ejected) + len(self.spared)
        if self.panic:
            return (
                f"outlier detection: panic, {flagged} of {len(self.instances)} up instances "
                f"ejected for reported failures leave fewer than {detection.panic_threshold:g} % "
                "healthy: every up instance is served"
            )
        spared = (
            f", {len(self.spared)} served over max_ejection_percent "
            f"{detection.max_ejection_percent:g}"
            if self.spared
            else ""
        )
        return f"outlier detection: {len(self.ejected)} ejected for reported failures{spared}"


class Census(NamedTuple):
    """One service's ejections now: instances skipped by lookups, partitions in panic."""

    ejected: int
    panicking: int


class _Episode:
    """A panic episode of one partition, begun at ``since``."""

    __slots__ = ("since",)

    def __init__(self, since: float) -> None:
        self.since = since


class _Instance:
    """What the feedback counts for one instance (under the feedback's lock)."""

    __slots__ = (
        "consecutive",
        "ended",
        "failed",
        "last_failure",
        "ok",
        "reported",
        "times",
        "window_start",
    )

    def __init__(self, now: float) -> None:
        self.reported = now  # the last report, for _sweep
        self.consecutive = 0
        self.last_failure = now
        self.window_start = now
        self.ok = 0
        self.failed = 0
        self.times = 0  # the ejection multiplier
        self.ended = now  # when the last ejection ended (for the multiplier's decay)


class InstanceFeedback:
    """Per-instance outcomes and latency, and the instances ejected for their failures.

    ``detection`` is an :class:`OutlierDetection` (default: its defaults); ``smoothing``
    (above 0, at most 1) is the weight of a new latency in the moving average; ``decay_time``
    (seconds, above 0; Finagle's ``PeakEwma`` default) is the time constant with which an
    estimate that is not refreshed decays toward zero (:meth:`latency`); ``clock`` is the
    monotonic clock ejections and the decay are timed on (tests pass their own, so nothing
    sleeps). Other values raise :class:`~sentinel.errors.ValidationError`.
    """

    def __init__(
        self,
        detection: OutlierDetection | None = None,
        *,
        smoothing: float = 0.3,
        decay_time: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        detection = check.instance("detection", detection, OutlierDetection) or OutlierDetection()
        if not callable(clock):
            raise ValidationError(f"clock must be callable, not {type(clock).__name__}")
        #: The rules and bounds in force.
        self.detection = detection
        self.smoothing = check.number("smoothing", smoothing, above=0, most=1)
        #: Seconds over which an estimate not refreshed falls to 1/e of itself.
        self.decay_time = check.number("decay_time", decay_time, above=0)
        #: The instances ejected now (see :class:`Outliers`); empty while none is, which is
        #: all a lookup checks. Replaced, never changed: read it without a lock.
        self.outliers = Outliers()
        #: Panic episodes so far, by service.
        self.panic_episodes: dict[str, int] = {}
        self._clock = clock
        # Partitions in panic now, (service, partition) -> the episode's start (see _episode).
        self._panics: dict[tuple[str, str | None], _Episode] = {}
        # Lookups decide on the outliers and the time they read, racing each other: a decision
        # may begin or end an episode only if it saw a later state (generation, time) than the
        # last decision that did, else a stale "no panic" would end an episode a newer "panic"
        # began, and count it again. Taken once per change and partition, never by a warm call.
        self._decided: dict[tuple[str, str | None], tuple[int, float]] = {}
        self._instances: dict[_Key, _Instance] = {}
        # key -> (the estimate, when it was made): a tuple replaced whole, read without the lock.
        self._latency: dict[_Key, tuple[float, float]] = {}
        self._next_expiry = math.inf
        self._lock = threading.Lock()
        self._episodes_lock = threading.Lock()
        self._next_sweep = clock() + _FORGET_AFTER
        _records.add(self)

    def report(self, endpoint: Endpoint, ok: bool = True, latency: float | None = None) -> None:
        """Record one use of ``endpoint``: whether it worked and how long it took (seconds, a
        finite number of 0 or more, else :class:`~sentinel.errors.ValidationError`)."""
        if latency is not None:  # NaN would poison the average for good
            latency = check.number("latency", latency, least=0)
        key = _key(endpoint)
        now = self._clock()
        with self._lock:
            if latency is not None:
                held = self._latency.get(key)
                if held is None:
                    estimate = latency
                else:  # blended with what the estimate has decayed to by now
                    previous = self._decayed(held, now)
                    estimate = previous + self.smoothing * (latency - previous)
                self._latency[key] = (estimate, now)
            outliers = self.outliers
            if now >= self._next_expiry:
                outliers = self._publish({k: e for k, e in outliers.items() if e.until > now})
            if now >= self._next_sweep:
                self._sweep(now)
            instance = self._instances.get(key)
            if instance is None:
                instance = self._instances[key] = _Instance(now)
            instance.reported = now
            detection = self.detection
            if now - instance.window_start >= detection.interval:
                instance.window_start, instance.ok, instance.failed = now, 0, 0
            if ok:
                instance.ok += 1
                instance.consecutive = 0
                return
            instance.failed += 1
            # A streak is failures each within `interval` of the one before (as the old rule's
            # window): rare failures of an idle instance, days apart, are not a streak.
            if now - instance.last_failure > detection.interval:
                instance.consecutive = 0
            instance.consecutive += 1
            instance.last_failure = now
            if key in outliers:  # ejected already: served in panic or over the cap
                return
            calls = instance.ok + instance.failed
            if instance.consecutive >= detection.consecutive_failures or (
                calls >= detection.min_requests
                and instance.ok * 100 < detection.min_success_percent * calls
            ):
                self._eject(key, instance, now)

    def _eject(self, key: _Key, instance: _Instance, now: float) -> None:
        """Eject ``key`` from ``now`` (under the lock): ``base_ejection_time`` times its
        ejections in a row (less one per healthy ``interval``), at most ``max_ejection_time``."""
        detection = self.detection
        healthy_intervals = int(max(now - instance.ended, 0.0) // detection.interval)
        instance.times = max(instance.times - healthy_intervals, 0) + 1
        duration = min(detection.base_ejection_time * instance.times, detection.max_ejection_time)
        instance.ended = now + duration
        instance.consecutive, instance.window_start, instance.ok, instance.failed = 0, now, 0, 0
        self._publish({**self.outliers, key: Ejection(now, now + duration)})
        log.info(
            "ejected %s:%s (%s) of %s for %gs (ejection %d in a row) after reported failures",
            key[1],
            key[2],
            key[3],
            key[0],
            duration,
            instance.times,
        )

    def _publish(self, ejections: dict[_Key, Ejection]) -> Outliers:
        """Publish ``ejections`` as the new :attr:`outliers` (under the lock)."""
        outliers = Outliers(ejections, generation=self.outliers.generation + 1)
        self._next_expiry = min((e.until for e in outliers.values()), default=math.inf)
        self.outliers = outliers
        if not outliers:  # no ejection left: whatever partition was in panic is not
            for where in list(self._panics):
                self._episode(where, False, (outliers.generation, self._clock()), 0, 0)
        return outliers

    def _sweep(self, now: float) -> None:
        """Forget the records of instances unreported for ``_FORGET_AFTER`` that a new record
        would replace exactly: not ejected, their window and streak over (``interval``), their
        ejection multiplier decayed to zero. Once per ``_FORGET_AFTER``, under the lock."""
        interval = self.detection.interval
        outliers = self.outliers
        for key in [
            key
            for key, instance in self._instances.items()
            if (idle := now - instance.reported) >= _FORGET_AFTER
            and idle > interval
            and now - instance.ended >= interval * instance.times
            and key not in outliers
        ]:
            del self._instances[key]
            self._latency.pop(key, None)
        self._next_sweep = now + _FORGET_AFTER

    def _after_fork(self) -> None:
        """In a forked child (the at-fork hook): a lock another thread of the parent held at
        the fork is held forever in the child, so it is replaced."""
        self._lock = threading.Lock()
        self._episodes_lock = threading.Lock()

    def latency(self, endpoint: Endpoint) -> float | None:
        """The smoothed latency reported for ``endpoint`` (None before any report), decayed
        toward zero by ``exp(-t / decay_time)`` for the ``t`` seconds since its last report.

        Finagle's ``PeakEwma`` decays its cost in the same way: without it, an instance whose
        first answer was slow kept that estimate for good, since a balancer that always takes
        the lower one never chose it again to measure it anew.
        """
        held = self._latency.get(_key(endpoint))
        if held is None:
            return None
        return self._decayed(held, self._clock())

    def _decayed(self, held: tuple[float, float], now: float) -> float:
        """The estimate ``held`` (value, when it was made) as it has decayed by ``now``."""
        estimate, made = held
        age = now - made  # <= 0: a clock read before the report's (another thread's)
        return estimate * math.exp(-age / self.decay_time) if age > 0.0 else estimate

    def is_down(self, endpoint: Endpoint) -> bool:
        """Whether ``endpoint`` is ejected now for its reported failures. Lookups skip it
        unless its partition is over ``max_ejection_percent`` or in panic (:meth:`verdict`)."""
        ejection = self.outliers.get(_key(endpoint))
        return ejection is not None and ejection.until > self._clock()

    def admit(self, instances: Sequence[Endpoint]) -> Sequence[Endpoint]:
        """``instances`` (one partition's up instances) as lookups choose from them now:
        without the ejected ones, within the cap, or all of them in panic.

        The lookup path: on the snapshot's own tuple a warm call is a dict lookup, an identity
        check and a clock read; what it decides is computed once per change.
        """
        verdict = self.outliers.verdicts.get(id(instances))
        if verdict is not None and verdict.instances is instances and self._clock() < verdict.until:
            return verdict.admitted
        return self.verdict(instances).admitted

    def verdict(self, instances: Sequence[Endpoint]) -> Verdict:
        """What outlier detection makes of ``instances``, one partition's up instances, now.

        Notes a panic episode's beginning and end (a log line and :attr:`panic_episodes`) the
        first time either is seen.
        """
        outliers = self.outliers
        now = self._clock()
        verdict = outliers.verdicts.get(id(instances))
        if verdict is not None and verdict.instances is instances and now < verdict.until:
            return verdict
        verdict = self._decide(outliers, instances, now)
        verdicts = outliers.verdicts
        if len(verdicts) >= _MAX_VERDICTS:
            verdicts.clear()
        verdicts[id(instances)] = verdict  # holds `instances`: the id is not reused meanwhile
        return verdict

    def _decide(self, outliers: Outliers, instances: Sequence[Endpoint], now: float) -> Verdict:
        flagged = sorted(
            (ejection, i)
            for i, e in enumerate(instances)
            if (ejection := outliers.get(_key(e))) is not None and ejection.until > now
        )
        until = min((ejection.until for ejection, _ in flagged), default=math.inf)
        detection = self.detection
        total = len(instances)
        panic = bool(flagged) and (total - len(flagged)) * 100 < detection.panic_threshold * total
        if panic or (self._panics and instances):
            self._episode(_where(instances), panic, (outliers.generation, now), len(flagged), total)
        if not flagged or panic:
            spared = tuple(instances[i] for _, i in flagged)
            return Verdict(instances, instances, (), spared, panic, until)
        allowed = int(total * detection.max_ejection_percent / 100)
        if detection.max_ejection_percent > 0:
            allowed = max(allowed, 1)
        skipped = {i for _, i in flagged[:allowed]}  # the earliest ejections stay
        return Verdict(
            instances,
            tuple(e for i, e in enumerate(instances) if i not in skipped) if skipped else instances,
            tuple(instances[i] for i in sorted(skipped)),
            tuple(instances[i] for _, i in flagged[allowed:]),
            False,
            until,
        )

    def _episode(
        self,
        where: tuple[str, str | None],
        panic: bool,
        seen: tuple[int, float],
        flagged: int,
        total: int,
    ) -> None:
        """A decision for partition ``where`` made on the state ``seen`` (the outliers'
        generation, the time): begins or ends its panic episode, logged and counted once, unless
        a decision on a later state came first."""
        with self._episodes_lock:
            if seen < self._decided.get(where, (-1, -math.inf)):
                return
            self._decided[where] = seen
            if panic and where not in self._panics:
                self._panics[where] = _Episode(seen[1])
                self.panic_episodes[where[0]] = self.panic_episodes.get(where[0], 0) + 1
                log.warning(
                    "panic in %s%s: %d of %d up instances are ejected for reported failures, "
                    "fewer than %g %% left healthy; lookups there spread over every up instance "
                    "until enough recover",
                    where[0],
                    "" if where[1] is None else f" partition {where[1]}",
                    flagged,
                    total,
                    self.detection.panic_threshold,
                )
            elif not panic and self._panics.pop(where, None) is not None:
                log.warning(
                    "panic over in %s%s: enough instances are free of ejection again",
                    where[0],
                    "" if where[1] is None else f" partition {where[1]}",
                )

    def census(self, partitions: Iterable[Sequence[Endpoint]]) -> Census:
        """The ejected instances and the partitions in panic among ``partitions`` (each one
        partition's up instances), as lookups would see them now: for the metrics."""
        if not self.outliers:
            return Census(0, 0)
        verdicts = [self.verdict(instances) for instances in partitions if instances]
        return Census(sum(len(v.ejected) for v in verdicts), sum(v.panic for v in verdicts))


def _where(instances: Sequence[Endpoint]) -> tuple[str, str | None]:
    """The service and partition of one partition's instances (None: several, unsharded)."""
    first = instances[0]
    partition: str | None = first.partition
    if any(e.partition != partition for e in instances):
        partition = None
    return first.service, partition


__all__ = ["Census", "Ejection", "InstanceFeedback", "OutlierDetection", "Outliers", "Verdict"]
