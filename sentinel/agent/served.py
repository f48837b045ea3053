"""What every surface of the agent that serves a service to programs without Sentinel (xDS,
DNS) says of a cached snapshot alike: which partitions are served on their own, and each
instance's weight scaled to the integers the protocol carries.

Pure functions of a :class:`~sentinel.cache.views.ServiceSnapshot`: no I/O, no protocol
library (the DNS server needs no gRPC, the xDS server no DNS library).
"""

from __future__ import annotations

from sentinel.cache.views import ServiceSnapshot
from sentinel.registry.endpoint import Endpoint


def partitions_of(snapshot: ServiceSnapshot) -> list[str | None]:
    """The partitions served on their own: None for an unsharded service, else each
    partition the registry lists an instance in."""
    if snapshot.spec.shard_policy is None:
        return [None]
    return sorted((p for p in snapshot.partitions if p is not None), key=str)


def scaled_weights(instances: tuple[Endpoint, ...], scale: int) -> dict[str, int]:
    """Each instance's weight by its name, as Sentinel's weighted balancer sees it (all
    equal when every weight is 0), scaled to integers with the heaviest at ``scale`` and the
    others in proportion (at least 1); an instance of weight 0 beside heavier ones has none."""
    # The balancer's own rule, imported when used: the core imports no plug-in when imported.
    from sentinel.balancers.weighted import WeightedRandom

    if not instances:
        return {}
    weights = WeightedRandom().weights(instances)
    heaviest = max(weights)
    return {
        instance.name: max(1, round(weight / heaviest * scale))
        for instance, weight in zip(instances, weights, strict=True)
        if weight > 0
    }
