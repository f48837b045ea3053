"""Mediator-less load balancers: which one of the eligible endpoints to use.

A balancer is an object with one method, :meth:`~sentinel.strategies.Balancer.pick`; its state
lives in the object and must be safe to share between threads. The endpoints it is given are an
immutable tuple that stays the same object until that partition changes, so work derived from them
alone can be kept (see :class:`sentinel.memo.IdentityMemo`). The contract and the default
:class:`~sentinel.strategies.RoundRobin` live in the core (:mod:`sentinel.strategies`,
re-exported here), so this package imports the core and never the other way round. A balancer
of your own::

    from sentinel.balancers import Balancer

    class First(Balancer):
        def pick(self, endpoints):
            return endpoints[0]

Built-ins: :class:`~sentinel.strategies.RoundRobin` (the default),
:class:`~sentinel.balancers.weighted.Random`,
:class:`~sentinel.balancers.weighted.WeightedRandom`,
:class:`~sentinel.balancers.weighted.SmoothWeightedRoundRobin`,
:class:`~sentinel.balancers.sticky.Sticky` and :class:`~sentinel.balancers.load.PowerOfTwoChoices`.
"""

from __future__ import annotations

from sentinel.strategies import Balancer, RoundRobin

from .load import PowerOfTwoChoices
from .sticky import Sticky
from .weighted import Random, SmoothWeightedRoundRobin, WeightedRandom

__all__ = [
    "Balancer",
    "PowerOfTwoChoices",
    "Random",
    "RoundRobin",
    "SmoothWeightedRoundRobin",
    "Sticky",
    "WeightedRandom",
]
