"""Random and weighted balancers."""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING

from sentinel.memo import IdentityMemo
from sentinel.strategies import Balancer

if TYPE_CHECKING:
    from sentinel.registry.endpoint import Endpoint


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
    Cumulative weights are computed once per set of endpoints, so a pick is a bisection.
    """

    def __init__(self, metric: str | None = None, seed: int | None = None) -> None:
        self.metric = metric
        self._random = random.Random(seed)
        self._cumulative: IdentityMemo[Sequence[Endpoint], list[float]] = IdentityMemo()

    def weights(self, endpoints: Sequence[Endpoint]) -> list[float]:
        """The weight of each endpoint, as this balancer sees it."""
        if self.metric is None:
            weights = [float(e.weight) for e in endpoints]
        else:
            loads = [_load(e, self.metric) for e in endpoints]
            worst = max((x for x in loads if x is not None), default=0.0)
            weights = [
                e.weight / (1.0 + (worst if x is None else x))
                for e, x in zip(endpoints, loads, strict=True)
            ]
        return weights if sum(weights) > 0 else [1.0] * len(endpoints)

    def pick(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        """A random endpoint, drawn by weight."""
        cumulative = self._cumulative.get(endpoints, lambda e: list(accumulate(self.weights(e))))
        point = self._random.random() * cumulative[-1]
        return endpoints[min(bisect.bisect_right(cumulative, point), len(endpoints) - 1)]


def _load(endpoint: Endpoint, metric: str) -> float | None:
    value = endpoint.metrics.get(metric)
    return max(float(value), 0.0) if type(value) is int or type(value) is float else None


class SmoothWeightedRoundRobin(Balancer):
    """nginx's smooth weighted round robin over the static ``weight``s.

    Over every run of ``sum(weights)`` picks each endpoint is chosen exactly ``weight`` times,
    interleaved rather than in bursts. The sequence is periodic, so for each set of endpoints
    one period is computed once and then walked with a lock-free counter. Endpoints of weight
    0 are never chosen unless all weigh 0. Fractional weights are scaled to integers (to 1/100),
    and a period is capped at 100,000 picks by scaling further.
    """

    MAX_PERIOD = 100_000

    def __init__(self) -> None:
        self._cycles: IdentityMemo[Sequence[Endpoint], tuple[list[int], Iterator[int]]] = (
            IdentityMemo()
        )

    def pick(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        """The next endpoint of this set's smooth weighted cycle."""
        cycle, counter = self._cycles.get(endpoints, _smooth_cycle)
        return endpoints[cycle[next(counter) % len(cycle)]]


def _smooth_cycle(endpoints: Sequence[Endpoint]) -> tuple[list[int], Iterator[int]]:
    """One period of nginx's algorithm for these weights, and a counter to walk it."""
    weights = [max(round(float(e.weight) * 100), 0) for e in endpoints]
    divisor = math.gcd(*weights) or 1
    weights = [w // divisor for w in weights] if any(weights) else [1] * len(endpoints)
    total = sum(weights)
    if total > SmoothWeightedRoundRobin.MAX_PERIOD:
        scale = SmoothWeightedRoundRobin.MAX_PERIOD / total
        weights = [max(round(w * scale), 1 if w else 0) for w in weights]
        total = sum(weights)
    current = [0] * len(weights)
    cycle = []
    for _ in range(total):
        best = 0
        for i, weight in enumerate(weights):
            current[i] += weight
            if current[i] > current[best]:
                best = i
        current[best] -= total
        cycle.append(best)
    return cycle, itertools.count()
