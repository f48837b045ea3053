"""What the application learned by using endpoints: errors, latency, instances marked down.

``Sentinel.report(endpoint, ok, latency)`` feeds it. The down rule is Curator's
``DownInstancePolicy``: ``errors`` failures of one instance within ``window`` seconds mark it
down for ``down_for`` seconds, during which ``get_service`` does not return it. Latencies feed an
exponentially weighted moving average that load-aware balancers read.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence

from sentinel import validation as check
from sentinel.registry.endpoint import Endpoint

_Key = tuple[str, str, str]


def _key(endpoint: Endpoint) -> _Key:
    return (endpoint.service, endpoint.partition, endpoint.label)


# Every record of this process, for the at-fork hook; weak, so a dropped one is not kept.
_records: weakref.WeakSet[InstanceFeedback] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for feedback in list(_records):
        InstanceFeedback._after_fork(feedback)


os.register_at_fork(after_in_child=_after_fork_in_child)


class InstanceFeedback:
    """Per-instance error and latency records, and the instances currently marked down.

    ``errors`` failures (an int, 1 or more) within ``window`` seconds (above 0) mark an
    instance down for ``down_for`` seconds (0 or more); ``smoothing`` (above 0, at most 1) is
    the weight of a new latency in the moving average. Other values raise
    :class:`~sentinel.errors.ValidationError`.
    """

    def __init__(
        self,
        errors: int = 3,
        window: float = 30.0,
        down_for: float = 30.0,
        smoothing: float = 0.3,
    ) -> None:
        self.errors = check.integer("errors", errors, least=1)
        self.window = check.number("window", window, above=0)
        self.down_for = check.number("down_for", down_for, least=0)
        self.smoothing = check.number("smoothing", smoothing, above=0, most=1)
        # Read without a lock on the lookup path: a non-empty dict means "filter".
        self.down: dict[_Key, float] = {}
        self._failures: dict[_Key, deque[float]] = {}
        self._latency: dict[_Key, float] = {}
        self._lock = threading.Lock()
        _records.add(self)

    def report(self, endpoint: Endpoint, ok: bool = True, latency: float | None = None) -> None:
        """Record one use of ``endpoint``: whether it worked and how long it took (seconds, a
        finite number of 0 or more, else :class:`~sentinel.errors.ValidationError`)."""
        if latency is not None:  # NaN would poison the average for good
            latency = check.number("latency", latency, least=0)
        key = _key(endpoint)
        now = time.monotonic()
        with self._lock:
            if latency is not None:
                previous = self._latency.get(key)
                self._latency[key] = (
                    latency
                    if previous is None
                    else previous + self.smoothing * (latency - previous)
                )
            if ok:
                self._failures.pop(key, None)
                return
            failures = self._failures.setdefault(key, deque())
            failures.append(now)
            while failures and failures[0] < now - self.window:
                failures.popleft()
            if len(failures) >= self.errors:
                failures.clear()
                self.down[key] = now + self.down_for

    def _after_fork(self) -> None:
        """In a forked child (the at-fork hook): a lock another thread of the parent held at
        the fork is held forever in the child, so it is replaced."""
        self._lock = threading.Lock()

    def latency(self, endpoint: Endpoint) -> float | None:
        """The smoothed latency reported for ``endpoint`` (None before any report)."""
        return self._latency.get(_key(endpoint))

    def is_down(self, endpoint: Endpoint) -> bool:
        """Whether ``endpoint`` is marked down now."""
        until = self.down.get(_key(endpoint))
        return until is not None and until > time.monotonic()

    def exclude_down(self, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        """``endpoints`` without those marked down; forgets marks that have expired."""
        now = time.monotonic()
        expired = [key for key, until in list(self.down.items()) if until <= now]
        for key in expired:
            self.down.pop(key, None)
        if not self.down:
            return endpoints
        return tuple(e for e in endpoints if _key(e) not in self.down)
