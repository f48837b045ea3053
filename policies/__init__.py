"""Selection policies: which of a partition's instances are eligible.

A policy is an object with one method, :meth:`SelectionPolicy.select`, from the partition's
``up`` endpoints to the eligible ones. Policies compose with ``&``; any plain callable with the
same signature works as a policy too. A policy of your own::

    from policies import SelectionPolicy

    class InZone(SelectionPolicy):
        def __init__(self, zone):
            self.zone = zone

        def select(self, endpoints):
            return tuple(e for e in endpoints if e.zone == self.zone)

Built-ins: :class:`AllUp` (the default), :class:`~policies.metrics.MinMetric`,
:class:`~policies.metrics.MinLag`, :class:`~policies.metrics.Threshold`,
:class:`~policies.metrics.FreshMetrics`, :class:`~policies.placement.ZoneAffinity`,
:class:`~policies.placement.Tagged` and :class:`Chain`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sentinel.memo import IdentityMemo

if TYPE_CHECKING:  # a plug-in package must not import the client at run time
    from sentinel.endpoint import Endpoint

Endpoints = Sequence["Endpoint"]


class SelectionPolicy:
    """Base class of selection policies.

    Set ``pure = True`` on a policy whose answer depends on its input alone (no clock, no
    outside state): ``get_service`` then reuses the answer while the cache hands over the
    same endpoints, i.e. until the partition's instances change.
    """

    pure = False

    def select(self, endpoints: Endpoints) -> Endpoints:
        """Return the eligible endpoints, in the order balancers should see them."""
        raise NotImplementedError

    def __call__(self, endpoints: Endpoints) -> Endpoints:
        if not self.pure:
            return self.select(endpoints)
        memo = self.__dict__.get("_memo")
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


class AllUp(SelectionPolicy):
    """Every instance whose status is ``up`` (the default: ``get_service`` applies it always)."""

    pure = True

    def select(self, endpoints: Endpoints) -> Endpoints:
        """The endpoints with status ``up``."""
        return tuple(e for e in endpoints if e.status == "up")


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


from policies.metrics import FreshMetrics, MinLag, MinMetric, Threshold  # noqa: E402
from policies.placement import Tagged, ZoneAffinity  # noqa: E402

__all__ = [
    "AllUp",
    "Chain",
    "Endpoints",
    "FreshMetrics",
    "MinLag",
    "MinMetric",
    "SelectionPolicy",
    "Tagged",
    "Threshold",
    "ZoneAffinity",
]
