"""Policies over run-time metrics (``/metrics``), as the paper's replica and relay rules.

A metric counts only when it is a number; a missing or non-numeric metric never makes an
instance eligible. Metrics older than ``max_age`` seconds are not trusted either: by default
:data:`~sentinel.freshness.METRICS_MAX_AGE` (three of a collector's default publication
intervals, 30 s), so values a dead collector left behind never choose an instance. Such an
instance is excluded, not ranked last: a stale value is no evidence, and ranking it would still
route to it when every instance is stale, which is how a stopped collector goes unnoticed.
``max_age=None`` trusts metrics of any age, explicitly.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from sentinel.freshness import METRICS_MAX_AGE
from sentinel.strategies import Endpoints, SelectionPolicy

if TYPE_CHECKING:
    from sentinel.registry.endpoint import Endpoint


def numeric(endpoint: Endpoint, metric: str) -> float | None:
    """The endpoint's metric as a finite number, or None if missing or not one.

    Published metrics are validated as finite, but a NaN must never win a comparison, so it is
    checked here again.
    """
    value = endpoint.metrics.get(metric)
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return value
    return None


def number(name: str, value: object) -> float:
    """A policy's numeric argument checked when the policy is built: a finite number. Raises
    TypeError or ValueError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


def bound(name: str, value: object) -> float | None:
    """An optional numeric argument: None, or a :func:`number`."""
    return None if value is None else number(name, value)


class AgeLimited(SelectionPolicy):
    """Base of the policies that trust metrics only up to ``max_age`` seconds old.

    Subclasses implement :meth:`choose` over the endpoints whose metrics are fresh. Without an
    age limit the answer depends on the endpoints alone and is kept while the cache hands over
    the same tuple (``pure``); with one it is kept, for that tuple, until the first of the
    fresh endpoints grows too old, so a warm lookup still does no work per call but read the
    clock.
    """

    def __init__(self, max_age: float | None) -> None:
        self.max_age = bound("max_age", max_age)
        self.pure = self.max_age is None  # an age limit depends on the clock

    def choose(self, endpoints: Endpoints) -> Endpoints:
        """The eligible endpoints among ``endpoints``, whose metrics are all fresh."""
        raise NotImplementedError

    def stale(self, endpoints: Endpoints, now: float | None = None) -> tuple[Endpoint, ...]:
        """The endpoints this policy excludes for the age of their metrics (none without
        ``max_age``); an endpoint without metrics is not stale, it has nothing to trust."""
        if self.max_age is None:
            return ()
        oldest = (time.time() if now is None else now) - self.max_age
        return tuple(e for e in endpoints if e.metrics_at is not None and e.metrics_at < oldest)

    def select(self, endpoints: Endpoints) -> Endpoints:
        """The eligible endpoints now."""
        return self._select_at(endpoints, time.time())[0]

    def __call__(self, endpoints: Endpoints) -> Endpoints:
        # One memo for both cases: without an age limit an answer holds for ever (until=inf).
        now = time.time()
        window: dict[int, tuple[Endpoints, float, float, Endpoints]] | None = self.__dict__.get(
            "_windows"
        )
        if window is None:
            window = self.__dict__.setdefault("_windows", {})
        hit = window.get(id(endpoints))
        # Kept while no endpoint crossed the age limit since (and the clock did not go back).
        if hit is not None and hit[0] is endpoints and hit[1] <= now < hit[2]:
            return hit[3]
        chosen, until = self._select_at(endpoints, now)
        if len(window) >= 64:
            window.clear()
        window[id(endpoints)] = (endpoints, now, until, chosen)
        return chosen

    def _select_at(self, endpoints: Endpoints, now: float) -> tuple[Endpoints, float]:
        """The eligible endpoints at ``now``, and until when that answer holds."""
        if self.max_age is None:
            return self.choose(endpoints), math.inf
        oldest = now - self.max_age
        fresh = []
        until = math.inf  # when the first of the fresh ones grows too old
        for endpoint in endpoints:
            measured_at = endpoint.metrics_at
            if measured_at is not None and measured_at >= oldest:
                fresh.append(endpoint)
                until = min(until, measured_at + self.max_age)
        return self.choose(fresh), until


class MinMetric(AgeLimited):
    """The instances with the smallest value of ``metric`` (all of them on a tie).

    With ``cutoff``, instances above it are not eligible, so when every instance is above it
    nothing is (``get_service`` raises ``NoInstanceAvailable``). Instances whose metrics are
    older than ``max_age`` seconds (default :data:`~sentinel.freshness.METRICS_MAX_AGE`) are
    not eligible; ``max_age=None`` trusts any age.
    """

    def __init__(
        self,
        metric: str,
        cutoff: float | None = None,
        max_age: float | None = METRICS_MAX_AGE,
    ):
        self.metric = metric
        self.cutoff = bound("cutoff", cutoff)
        super().__init__(max_age)

    def choose(self, endpoints: Endpoints) -> Endpoints:
        """The endpoints sharing the minimum value."""
        best: float | None = None
        chosen: list[Endpoint] = []
        for endpoint in endpoints:
            value = self.value(endpoint)
            if value is None or (self.cutoff is not None and value > self.cutoff):
                continue
            if best is None or value < best:
                best, chosen = value, [endpoint]
            elif value == best:
                chosen.append(endpoint)
        return tuple(chosen)

    def value(self, endpoint: Endpoint) -> float | None:
        """The number compared for ``endpoint`` (None: not eligible)."""
        return numeric(endpoint, self.metric)


class MinLag(MinMetric):
    """The paper's replica rule: least replication lag among replicas under ``cutoff``.

    A negative lag (clock skew between primary and replica) counts as zero: caught up, and no
    better than another caught-up replica.
    """

    def __init__(
        self,
        cutoff: float | None = None,
        metric: str = "replication_lag",
        max_age: float | None = METRICS_MAX_AGE,
    ) -> None:
        super().__init__(metric, cutoff, max_age)

    def value(self, endpoint: Endpoint) -> float | None:
        """The lag, with negative values read as zero."""
        lag = numeric(endpoint, self.metric)
        return None if lag is None else max(lag, 0.0)


class Threshold(AgeLimited):
    """Instances whose ``metric`` is below ``below`` and/or above ``above`` (strictly), among
    those whose metrics are at most ``max_age`` seconds old (as :class:`MinMetric`)."""

    def __init__(
        self,
        metric: str,
        below: float | None = None,
        above: float | None = None,
        max_age: float | None = METRICS_MAX_AGE,
    ):
        if below is None and above is None:
            raise ValueError("Threshold needs below=, above= or both")
        self.metric = metric
        self.below = bound("below", below)
        self.above = bound("above", above)
        super().__init__(max_age)

    def choose(self, endpoints: Endpoints) -> Endpoints:
        """The endpoints whose value lies inside the bounds."""
        eligible = []
        for endpoint in endpoints:
            value = numeric(endpoint, self.metric)
            if value is None:
                continue
            if self.below is not None and not value < self.below:
                continue
            if self.above is not None and not value > self.above:
                continue
            eligible.append(endpoint)
        return tuple(eligible)


class FreshMetrics(AgeLimited):
    """Instances whose metrics were measured at most ``max_age`` seconds ago (default
    :data:`~sentinel.freshness.METRICS_MAX_AGE`).

    Instances with no metrics, or stale ones, are not trusted.
    """

    def __init__(self, max_age: float = METRICS_MAX_AGE) -> None:
        super().__init__(number("max_age", max_age))

    def choose(self, endpoints: Endpoints) -> Endpoints:
        """Every endpoint given: they all have fresh metrics."""
        return tuple(endpoints)


__all__ = ["AgeLimited", "FreshMetrics", "MinLag", "MinMetric", "Threshold"]
