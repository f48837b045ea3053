"""Random and weighted balancers."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from balancers import Balancer

if TYPE_CHECKING:
    from sentinel.endpoint import Endpoint


class Random(Balancer):
    """Any endpoint, uniformly at random."""

    def __init__(self, seed: int | None = None) -> None:
        self._random = random.Random(seed)

    def pick(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        """A uniformly random endpoint."""
        return endpoints[self._random.randrange(len(endpoints))]


class WeightedRandom(Balancer):
    """At random, in proportion to each endpoint's weight.

    Without ``metric`` the weight is the instance's static ``weight``. With ``metric`` (a load
    figure such as a mail relay's queue length, the paper's case) it is ``weight / (1 +
    load)``, so the busiest instance gets the fewest requests; an instance without the metric
    counts as loaded as the busiest one that has it. When every weight is zero, all are equal.
    """

    def __init__(self, metric: str | None = None, seed: int | None = None) -> None:
        self.metric = metric
        self._random = random.Random(seed)

    def weights(self, endpoints: Sequence[Endpoint]) -> list[float]:
        """The weight of each endpoint, as this balancer sees it."""
        if self.metric is None:
            return [float(e.weight) for e in endpoints]
        loads = [e.metrics.get(self.metric) for e in endpoints]
        numbers = [max(float(x), 0.0) for x in loads if type(x) is int or type(x) is float]
        worst = max(numbers, default=0.0)
        return [
            e.weight / (1.0 + (max(float(x), 0.0) if type(x) is int or type(x) is float else worst))
            for e, x in zip(endpoints, loads, strict=True)
        ]

    def pick(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        """A random endpoint, drawn by weight."""
        weights = self.weights(endpoints)
        if sum(weights) <= 0:
            return endpoints[self._random.randrange(len(endpoints))]
        return self._random.choices(endpoints, weights)[0]


class SmoothWeightedRoundRobin(Balancer):
    """nginx's smooth weighted round robin over the static ``weight``s.

    Over every run of ``sum(weights)`` picks each endpoint is chosen exactly ``weight`` times,
    interleaved rather than in bursts. Each pick updates every endpoint's running weight, so
    picks take a lock. Endpoints of weight 0 are never chosen unless all weigh 0.
    """

    def __init__(self) -> None:
        self._current: dict[str, float] = {}
        self._lock = threading.Lock()

    def pick(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        """The endpoint whose running weight is highest."""
        weights = [float(e.weight) for e in endpoints]
        if sum(weights) <= 0:
            weights = [1.0] * len(endpoints)
        total = sum(weights)
        with self._lock:
            current = {}
            best = 0
            for i, (endpoint, weight) in enumerate(zip(endpoints, weights, strict=True)):
                value = current[endpoint.name] = self._current.get(endpoint.name, 0.0) + weight
                if value > current[endpoints[best].name]:
                    best = i
            current[endpoints[best].name] -= total
            self._current = current  # endpoints that left drop their state here
        return endpoints[best]
