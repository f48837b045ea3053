"""What a lookup returns: one instance of a service, ready to connect to."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from sentinel.registry.records import InstanceRecord, MetricValue

NO_METRICS: Mapping[str, MetricValue] = MappingProxyType({})
# An endpoint carries every field of its instance record under the same name, so the two
# convert by these names: a field added to InstanceRecord is one more field declared below.
RECORD_FIELDS = tuple(f.name for f in fields(InstanceRecord))


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
    published one). ``health`` is the source of a readiness check that sets ``status``
    (``check:http``...; None: the session alone), ``check_name`` and ``check_result`` that
    check's name and its result when it last set the status. ``joined`` is the zxid that created the
    instance's node: instances that joined earlier have smaller ones, which gives clusters a
    stable order (see topology).
    ``unlisted_since`` is None for every instance the registry lists; an instance it no
    longer lists (its session expired in a mass loss) and that the cache still serves, under
    ``CacheConfig(mass_loss_protection=...)``, carries the time it went (see :attr:`protected`).
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
    health: str | None = None
    check_name: str | None = None
    check_result: str | None = None
    unlisted_since: float | None = None

    @property
    def protected(self) -> bool:
        """Whether the registry no longer lists this instance and the cache serves it under
        its protection from mass loss (docs/health.md)."""
        return self.unlisted_since is not None

    @classmethod
    def from_record(cls, record: InstanceRecord, joined: int = 0) -> Endpoint:
        """The endpoint of a decoded instance record (``joined``: its node's creation zxid)."""
        return cls(
            **{name: getattr(record, name) for name in RECORD_FIELDS},
            uri=format_uri(record.scheme, record.host, record.port),
            joined=joined,
        )

    def record(self) -> InstanceRecord:
        """The instance record this endpoint was built from (never its ``auth``)."""
        return InstanceRecord(**{name: getattr(self, name) for name in RECORD_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        """Every field but ``auth`` (a secret), plus ``name``, as JSON-able values: what
        ``sentinel resolve --json``, ``sentinel watch --json`` and the collector's command
        source show of an instance."""
        document: dict[str, Any] = {"name": self.name}
        for name in SHOWN_FIELDS:
            value = getattr(self, name)
            document[name] = dict(value) if isinstance(value, Mapping) else value
        return document

    @property
    def metrics_age(self) -> float | None:
        """Seconds since the metrics were measured; None when there are none."""
        return None if self.metrics_at is None else time.time() - self.metrics_at

    @property
    def name(self) -> str:
        """The instance's node name, ``<partition>:<label>``."""
        return f"{self.partition}:{self.label}"


# ``auth`` holds the client's decrypted credential: never shown, logged or exported.
SHOWN_FIELDS = tuple(f.name for f in fields(Endpoint) if f.name != "auth")
