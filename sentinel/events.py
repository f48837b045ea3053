"""Typed change events, with the diff, delivered to listeners (``Sentinel.listen``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sentinel.auth.envelope import Credential
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.records import ServiceSpec


@dataclass(frozen=True)
class InstancesChanged:
    """Instances of ``service`` appeared, disappeared or changed (status, weight, ...)."""

    service: str
    added: tuple[Endpoint, ...] = ()
    removed: tuple[Endpoint, ...] = ()
    updated: tuple[tuple[Endpoint, Endpoint], ...] = ()  # (old, new)


@dataclass(frozen=True)
class MetricsChanged:
    """Run-time metrics of instances of ``service`` changed: ``(old, new)`` endpoints."""

    service: str
    updated: tuple[tuple[Endpoint, Endpoint], ...] = ()


@dataclass(frozen=True)
class ServiceSpecChanged:
    """The spec of ``service`` changed; ``new`` is None when the service was removed."""

    service: str
    old: ServiceSpec | None
    new: ServiceSpec | None


@dataclass(frozen=True)
class ShardKeysChanged:
    """Keys of shard ``policy`` moved; delivered to listeners of each service using it."""

    service: str
    policy: str
    changes: Mapping[str, tuple[str | None, str | None]] = field(default_factory=dict)
    # key -> (old partition, new partition); None means unassigned


@dataclass(frozen=True)
class ConnectionChanged:
    """The client's connection to ZooKeeper changed state.

    ``state`` is ``connected``, ``suspended`` (the cache serves its last known state) or
    ``lost`` (the session expired; it re-syncs on the next connection).
    """

    state: str
    at: float


@dataclass(frozen=True)
class AuthChanged:
    """This client's credential for ``service`` changed: rebuild connection pools on it.

    ``old_version``/``new_version`` are None when there was or is no readable credential;
    ``credential`` is the new one (its repr shows no secret). The client confirms the new
    version in ``/clients/<service>/<client>`` only after every listener has returned, so a
    rotation waits for the application, not just for the cache.
    """

    service: str
    old_version: int | None
    new_version: int | None
    credential: Credential | None


ChangeEvent = (
    InstancesChanged
    | MetricsChanged
    | ServiceSpecChanged
    | ShardKeysChanged
    | ConnectionChanged
    | AuthChanged
)
"""What a listener receives: one of the events above (``isinstance`` tells which)."""

# How a daemon role (shard manager, metric collector) tells its operator what happened:
# ``report(kind, details)`` with JSON-able details.
Reporter = Callable[[str, dict], None]

__all__ = [
    "AuthChanged",
    "ChangeEvent",
    "ConnectionChanged",
    "InstancesChanged",
    "MetricsChanged",
    "ServiceSpecChanged",
    "ShardKeysChanged",
]
