"""Mediator-less load balancers: which one of the eligible endpoints to use.

A balancer is an object with one method, :meth:`Balancer.pick`; its state lives in the object
and must be safe to share between threads. The endpoints it is given are an immutable tuple
that stays the same object until the service changes, so work derived from them alone can be
kept (see :class:`sentinel.memo.IdentityMemo`). A balancer of your own::

    from balancers import Balancer

    class First(Balancer):
        def pick(self, endpoints):
            return endpoints[0]

Built-ins: :class:`RoundRobin` (the default), :class:`~balancers.weighted.Random`,
:class:`~balancers.weighted.WeightedRandom`,
:class:`~balancers.weighted.SmoothWeightedRoundRobin`, :class:`~balancers.sticky.Sticky` and
:class:`~balancers.load.PowerOfTwoChoices`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a plug-in package must not import the client at run time
    from sentinel.endpoint import Endpoint


class Balancer:
    """Base class of load balancers."""

    def pick(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        """Choose one of ``endpoints`` (never empty)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


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


from balancers.load import PowerOfTwoChoices  # noqa: E402
from balancers.sticky import Sticky  # noqa: E402
from balancers.weighted import Random, SmoothWeightedRoundRobin, WeightedRandom  # noqa: E402

__all__ = [
    "Balancer",
    "PowerOfTwoChoices",
    "Random",
    "RoundRobin",
    "SmoothWeightedRoundRobin",
    "Sticky",
    "WeightedRandom",
]
