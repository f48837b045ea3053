"""Policies over run-time metrics (``/metrics``), as the paper's replica and relay rules.

A metric counts only when it is a number; a missing or non-numeric metric never makes an
instance eligible. Pair any of these with :class:`FreshMetrics` (or give ``max_age``) so that
values a dead collector left behind are not trusted.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from sentinel.strategies import Endpoints, SelectionPolicy

if TYPE_CHECKING:
    from sentinel.endpoint import Endpoint


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


class MinMetric(SelectionPolicy):
    """The instances with the smallest value of ``metric`` (all of them on a tie).

    With ``cutoff``, instances above it are not eligible, so when every instance is above it
    nothing is (``get_service`` raises ``NoInstanceAvailable``). With ``max_age`` (seconds),
    instances whose metrics are older are not eligible.
    """

    def __init__(self, metric: str, cutoff: float | None = None, max_age: float | None = None):
        self.metric = metric
        self.cutoff = bound("cutoff", cutoff)
        self.max_age = bound("max_age", max_age)
        self.pure = max_age is None  # an age limit depends on the clock

    def select(self, endpoints: Endpoints) -> Endpoints:
        """The eligible endpoints sharing the minimum value."""
        oldest = None if self.max_age is None else time.time() - self.max_age
        best: float | None = None
        chosen: list[Endpoint] = []
        for endpoint in endpoints:
            value = self.value(endpoint)
            if value is None or (self.cutoff is not None and value > self.cutoff):
                continue
            if oldest is not None and (endpoint.metrics_at or 0.0) < oldest:
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
        max_age: float | None = None,
    ) -> None:
        super().__init__(metric, cutoff, max_age)

    def value(self, endpoint: Endpoint) -> float | None:
        """The lag, with negative values read as zero."""
        lag = numeric(endpoint, self.metric)
        return None if lag is None else max(lag, 0.0)


class Threshold(SelectionPolicy):
    """Instances whose ``metric`` is below ``below`` and/or above ``above`` (strictly)."""

    pure = True

    def __init__(self, metric: str, below: float | None = None, above: float | None = None):
        if below is None and above is None:
            raise ValueError("Threshold needs below=, above= or both")
        self.metric = metric
        self.below = bound("below", below)
        self.above = bound("above", above)

    def select(self, endpoints: Endpoints) -> Endpoints:
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


class FreshMetrics(SelectionPolicy):
    """Instances whose metrics were measured at most ``max_age`` seconds ago.

    Instances with no metrics, or stale ones, are not trusted.
    """

    def __init__(self, max_age: float) -> None:
        self.max_age = number("max_age", max_age)

    def select(self, endpoints: Endpoints) -> Endpoints:
        """The endpoints with fresh metrics."""
        oldest = time.time() - self.max_age
        return tuple(e for e in endpoints if e.metrics_at is not None and e.metrics_at >= oldest)
