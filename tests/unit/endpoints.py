"""Endpoints built by hand for unit tests of policies and balancers."""

import time
from types import MappingProxyType

from sentinel.registry.endpoint import Endpoint


def endpoint(
    label,
    partition="p1",
    *,
    weight=1,
    zone=None,
    status="up",
    metrics=None,
    metrics_at=None,
    properties=None,
    service="db",
):
    if metrics is not None and metrics_at is None:
        metrics_at = time.time()
    return Endpoint(
        service=service,
        partition=partition,
        label=label,
        scheme="postgresql",
        host="h",
        port=5432,
        uri="postgresql://h:5432",
        status=status,
        weight=weight,
        zone=zone,
        properties=MappingProxyType(properties or {}),
        registered_at=0.0,
        metrics=MappingProxyType(metrics or {}),
        metrics_at=metrics_at,
    )
