"""What a selection policy and a load balancer are, and the default balancer the cache uses.

``get_service`` filters a partition's instances through a policy (which of them are eligible)
and hands the eligible ones to a balancer (which one to use). The two contracts live here, in
the core, so that the client and cache need nothing from the ``sentinel.policies`` and
``sentinel.balancers`` packages: those packages, and any third-party plug-in, import this
module, never the other way round. It imports nothing but :mod:`sentinel.memo` at run time.

A policy of your own::

    from sentinel.strategies import SelectionPolicy

    class InZone(SelectionPolicy):
        pure = True

        def __init__(self, zone):
            self.zone = zone

        def select(self, endpoints):
            return tuple(e for e in endpoints if e.zone == self.zone)

and a balancer::

    from sentinel.strategies import Balancer

    class First(Balancer):
        def pick(self, endpoints):
            return endpoints[0]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sentinel.memo import IdentityMemo

if TYPE_CHECKING:
    from sentinel.registry.endpoint import Endpoint

Endpoints = Sequence["Endpoint"]
"""What a policy is given and returns, and a balancer picks from: endpoints, in order."""


class SelectionPolicy:
    """Base class of selection policies: :meth:`select` keeps the eligible endpoints.

    Policies compose with ``&``; any plain callable from endpoints to endpoints works as a
    policy too. Set ``pure = True`` on a policy whose answer depends on its input alone (no
    clock, no outside state): ``get_service`` then reuses the answer while the cache hands over
    the same endpoints, i.e. until the partition's instances change.
    """

    pure = False

    def select(self, endpoints: Endpoints) -> Endpoints:
        """Return the eligible endpoints, in the order balancers should see them."""
        raise NotImplementedError

    def __call__(self, endpoints: Endpoints) -> Endpoints:
        if not self.pure:
            return self.select(endpoints)
        memo: IdentityMemo[Endpoints, Endpoints] | None = self.__dict__.get("_memo")
        if memo is None:
            memo = self.__dict__.setdefault("_memo", IdentityMemo())
        return memo.get(endpoints, self.select)

    def __and__(self, other: SelectionPolicy | Callable[[Endpoints], Endpoints]) -> Chain:
        return Chain(self, other)

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_") and k != "pure"
        )
        return f"{type(self).__name__}({fields})"


class Chain(SelectionPolicy):
    """Policies applied one after the other; ``a & b`` builds one."""

    def __init__(self, *policies: SelectionPolicy | Callable[[Endpoints], Endpoints]) -> None:
        self.policies = policies
        self.pure = all(getattr(p, "pure", False) for p in policies)

    def select(self, endpoints: Endpoints) -> Endpoints:
        """Each policy filters what the previous one kept."""
        for policy in self.policies:
            endpoints = policy(endpoints)
        return endpoints


class Balancer:
    """Base class of load balancers: :meth:`pick` chooses one endpoint.

    Its state lives in the object and must be safe to share between threads. The endpoints it
    is given are an immutable tuple that stays the same object until that partition changes, so
    work derived from them alone can be kept (see :class:`sentinel.memo.IdentityMemo`).
    """

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


__all__ = ["Balancer", "Chain", "Endpoints", "RoundRobin", "SelectionPolicy"]
