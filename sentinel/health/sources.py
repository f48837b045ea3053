"""Where an instance's health comes from, as operators see it (``sentinel ls``, ``watch``).

Three sources, the first that applies: the publisher's readiness check (``check:http``,
``check:tcp``, ``check:grpc``, ``check:call``: the instance node says so, and its status is
the check's state), the collector's active check (the metric ``health``, 1 or 0, see
:mod:`sentinel.collector.health`), or the registry alone (``registry``: the session is alive,
and the status is whatever was published).
"""

from __future__ import annotations

from collections.abc import Mapping

REGISTRY = "registry"
COLLECTOR = "collector"


def health_of(health: str | None, status: str, metrics: Mapping[str, object]) -> tuple[str, str]:
    """``(source, state)`` of an instance with ``health`` (its node's health source), its
    ``status`` and its published ``metrics``."""
    if health is not None:
        return health, status
    value = metrics.get("health")
    if type(value) is int and value in (0, 1):
        return COLLECTOR, "up" if value else "down"
    return REGISTRY, status
