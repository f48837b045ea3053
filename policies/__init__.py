"""Selection policies: which of a partition's instances are eligible.

A policy is an object with one method, :meth:`~sentinel.strategies.SelectionPolicy.select`,
from the partition's ``up`` endpoints to the eligible ones. Policies compose with ``&``; any
plain callable with the same signature works as a policy too. The contract lives in the core
(:mod:`sentinel.strategies`, re-exported here), so this package imports the core and never the
other way round. A policy of your own::

    from sentinel.policies import SelectionPolicy

    class InZone(SelectionPolicy):
        def __init__(self, zone):
            self.zone = zone

        def select(self, endpoints):
            return tuple(e for e in endpoints if e.zone == self.zone)

Built-ins: :class:`AllUp` (the default), :class:`~sentinel.policies.metrics.MinMetric`,
:class:`~sentinel.policies.metrics.MinLag`, :class:`~sentinel.policies.metrics.Threshold`,
:class:`~sentinel.policies.metrics.FreshMetrics`,
:class:`~sentinel.policies.placement.ZoneAffinity`,
:class:`~sentinel.policies.placement.Tagged` and :class:`~sentinel.strategies.Chain`.
"""

from __future__ import annotations

from sentinel.strategies import Chain, Endpoints, SelectionPolicy

from .metrics import AgeLimited, FreshMetrics, MinLag, MinMetric, Threshold
from .placement import Tagged, ZoneAffinity


class AllUp(SelectionPolicy):
    """Every instance whose status is ``up`` (the default: ``get_service`` applies it always)."""

    pure = True

    def select(self, endpoints: Endpoints) -> Endpoints:
        """The endpoints with status ``up``."""
        return tuple(e for e in endpoints if e.status == "up")


__all__ = [
    "AgeLimited",
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
