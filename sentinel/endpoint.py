"""What a lookup returns: one instance of a service, ready to connect to."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sentinel.records import InstanceRecord, MetricValue

NO_METRICS: Mapping[str, MetricValue] = MappingProxyType({})


def format_uri(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, with IPv6 literals in brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One live instance as the cache holds it: location, identity, state and properties.

    Endpoints are built once per change of the instance, not per lookup, so ``get_service``
    returns a shared, immutable object. ``metrics`` are the instance's last published run-time
    metrics, measured at ``metrics_at`` (None when none were published). ``auth`` is the
    client's decrypted credential for the service (None until the authentication manager has
    published one). ``joined`` is the zxid that created the instance's node: instances that
    joined earlier have smaller ones, which gives clusters a stable order (see topology).
    """

    service: str
    partition: str
    label: str
    scheme: str
    host: str
    port: int
    uri: str
    status: str
    weight: float
    zone: str | None
    properties: Mapping[str, Any]
    registered_at: float
    joined: int = 0
    metrics: Mapping[str, MetricValue] = field(default_factory=lambda: NO_METRICS)
    metrics_at: float | None = None
    auth: Mapping[str, Any] | None = None

    @classmethod
    def from_record(cls, record: InstanceRecord, joined: int = 0) -> Endpoint:
        """The endpoint of a decoded instance record (``joined``: its node's creation zxid)."""
        return cls(
            service=record.service,
            partition=record.partition,
            label=record.label,
            scheme=record.scheme,
            host=record.host,
            port=record.port,
            uri=format_uri(record.scheme, record.host, record.port),
            status=record.status,
            weight=record.weight,
            zone=record.zone,
            properties=record.properties,
            registered_at=record.registered_at,
            joined=joined,
        )

    def record(self) -> InstanceRecord:
        """The instance record this endpoint was built from (never its ``auth``)."""
        return InstanceRecord(
            service=self.service,
            partition=self.partition,
            label=self.label,
            host=self.host,
            port=self.port,
            scheme=self.scheme,
            status=self.status,
            weight=self.weight,
            zone=self.zone,
            properties=self.properties,
            registered_at=self.registered_at,
        )

    @property
    def metrics_age(self) -> float | None:
        """Seconds since the metrics were measured; None when there are none."""
        return None if self.metrics_at is None else time.time() - self.metrics_at

    @property
    def name(self) -> str:
        """The instance's node name, ``<partition>:<label>``."""
        return f"{self.partition}:{self.label}"
