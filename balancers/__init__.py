"""Mediator-less load balancers: which one of the eligible endpoints to use.

A balancer is an object with one method, :meth:`Balancer.pick`; its state lives in the object
and must be safe to share between threads. A balancer of your own::

    import random
    from balancers import Balancer

    class Random(Balancer):
        def pick(self, endpoints):
            return endpoints[random.randrange(len(endpoints))]
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from sentinel.endpoint import Endpoint


class Balancer:
    """Base class of load balancers."""

    def pick(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        """Choose one of ``endpoints`` (never empty)."""
        raise NotImplementedError


class RoundRobin(Balancer):
    """Each endpoint in turn (the default balancer).

    ``next()`` on an ``itertools.count`` is atomic under the GIL, so threads share one
    counter without a lock.
    """

    def __init__(self) -> None:
        self._counter = itertools.count()

    def pick(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        """The next endpoint in turn."""
        return endpoints[next(self._counter) % len(endpoints)]


__all__ = ["Balancer", "RoundRobin"]
