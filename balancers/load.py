"""Load-aware balancing: the power of two random choices."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sentinel.strategies import Balancer

if TYPE_CHECKING:
    from sentinel.feedback import InstanceFeedback
    from sentinel.registry.endpoint import Endpoint


class PowerOfTwoChoices(Balancer):
    """Two endpoints at random, then the less loaded of the two.

    Load is ``metric`` when given (lower is better; an endpoint without it counts as the most
    loaded), else the latency the application reported through ``Sentinel.report`` (pass
    ``feedback=sentinel.feedback``; an endpoint not measured yet counts as the least loaded, so
    that a new instance is tried and measured rather than never chosen); with neither, the
    first of the two. Compared with always
    taking the least loaded, it avoids every client herding onto the same instance.
    """

    def __init__(
        self,
        metric: str | None = None,
        feedback: InstanceFeedback | None = None,
        seed: int | None = None,
    ) -> None:
        self.metric = metric
        self.feedback = feedback
        self._random = random.Random(seed)

    def load(self, endpoint: Endpoint) -> float:
        """The load figure compared (a metric missing: infinity; a latency missing: 0)."""
        if self.metric is not None:
            value = endpoint.metrics.get(self.metric)
            return float(value) if type(value) is int or type(value) is float else math.inf
        if self.feedback is not None:
            latency = self.feedback.latency(endpoint)
            return 0.0 if latency is None else latency
        return 0.0

    def pick(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        """The less loaded of two random endpoints."""
        if len(endpoints) == 1:
            return endpoints[0]
        first = self._random.randrange(len(endpoints))
        second = self._random.randrange(len(endpoints) - 1)
        a, b = endpoints[first], endpoints[second + (second >= first)]  # two distinct ones
        return b if self.load(b) < self.load(a) else a


__all__ = ["PowerOfTwoChoices"]
