"""Registry nodes of service ``api`` (partition ``p1``) as raw paths and bytes, for tests that
write them past the API (pipelined, or while the reader's worker is held)."""

from __future__ import annotations

from sentinel.registry.layout import instance_path, metrics_path
from sentinel.registry.records import InstanceRecord, MetricsRecord


def instance(label: str, weight: float = 1) -> tuple[str, bytes]:
    """The path and value of instance ``label`` at 10.0.0.1:8080."""
    path = instance_path("api", "p1", label)
    return path, InstanceRecord("api", "p1", label, "10.0.0.1", 8080, weight=weight).to_bytes(path)


def metrics(label: str, load: float) -> tuple[str, bytes]:
    """The path and value of instance ``label``'s metrics node: ``load``, measured at 1.0."""
    path = metrics_path("api", "p1", label)
    return path, MetricsRecord("api", "p1", label, {"load": load}, 1.0).to_bytes(path)
