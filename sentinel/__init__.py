"""Sentinel for Python: ZooKeeper-based service discovery for partitioned, multi-tenant services.

The entry point is :class:`Sentinel`, a client that is also a context manager (and
:class:`AsyncSentinel`, its asyncio twin, see :mod:`sentinel.aio`)::

    from sentinel import Sentinel

    with Sentinel(hosts="127.0.0.1:2181") as sentinel:
        sentinel.register("billing-db", "p1", "10.0.0.5", 5432, scheme="postgresql")

This package also exports what a user of the client touches, and nothing else (``__all__``;
tests/unit/test_exported_members.py holds this list to it):

- :class:`Endpoint` (what ``get_service`` returns), :class:`Registration` (what ``register``
  returns), the records :class:`InstanceRecord` and :class:`ServiceSpec`, and
  :class:`HealthCheck`;
- the settings grouped as values: :class:`CacheConfig`, :class:`MassLossProtection`,
  :class:`AuthConfig` and :class:`TlsConfig`;
- the change events: :data:`ChangeEvent`, one of :class:`InstancesChanged`,
  :class:`MetricsChanged`, :class:`ServiceSpecChanged`, :class:`ShardKeysChanged`,
  :class:`ConnectionChanged` and :class:`AuthChanged`; and :class:`EventsMissed`, what an
  :class:`AsyncSentinel` stream raises when it fell behind;
- the bases of each group of errors: :class:`SentinelError` (every error derives from it),
  :class:`ValidationError`, :class:`ResolutionError`, :class:`ZooKeeperUnavailable`,
  :class:`RegistryError`, :class:`RegistryConflict` and :class:`AuthError` (the whole tree is
  drawn in :mod:`sentinel.errors`);
- ``__version__``, the installed distribution's version.

The names are loaded on first use (PEP 562), so that importing one module of the package, say
``sentinel.errors`` or ``sentinel.strategies`` from a plug-in, does not import the client and
everything it needs.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sentinel.aio import AsyncSentinel, EventsMissed
    from sentinel.auth.config import AuthConfig
    from sentinel.cache.config import CacheConfig
    from sentinel.cache.protection import MassLossProtection
    from sentinel.client import Sentinel
    from sentinel.errors import (
        AuthError,
        RegistryConflict,
        RegistryError,
        ResolutionError,
        SentinelError,
        ValidationError,
        ZooKeeperUnavailable,
    )
    from sentinel.events import (
        AuthChanged,
        ChangeEvent,
        ConnectionChanged,
        InstancesChanged,
        MetricsChanged,
        ServiceSpecChanged,
        ShardKeysChanged,
    )
    from sentinel.health import HealthCheck
    from sentinel.publisher import Registration
    from sentinel.registry.endpoint import Endpoint
    from sentinel.registry.records import InstanceRecord, ServiceSpec
    from sentinel.version import __version__
    from sentinel.zk.tls import TlsConfig

# Each exported name and the module that defines it.
_EXPORTS = {
    "Sentinel": "sentinel.client",
    "AsyncSentinel": "sentinel.aio",
    "EventsMissed": "sentinel.aio",
    "Endpoint": "sentinel.registry.endpoint",
    "Registration": "sentinel.publisher",
    "HealthCheck": "sentinel.health",
    "InstanceRecord": "sentinel.registry.records",
    "ServiceSpec": "sentinel.registry.records",
    "TlsConfig": "sentinel.zk.tls",
    "CacheConfig": "sentinel.cache.config",
    "MassLossProtection": "sentinel.cache.protection",
    "AuthConfig": "sentinel.auth.config",
    # Read from the installed package's metadata (importlib.metadata) when first asked.
    "__version__": "sentinel.version",
    **dict.fromkeys(
        (
            "SentinelError",
            "ValidationError",
            "ResolutionError",
            "ZooKeeperUnavailable",
            "RegistryError",
            "RegistryConflict",
            "AuthError",
        ),
        "sentinel.errors",
    ),
    **dict.fromkeys(
        (
            "ChangeEvent",
            "InstancesChanged",
            "MetricsChanged",
            "ServiceSpecChanged",
            "ShardKeysChanged",
            "ConnectionChanged",
            "AuthChanged",
        ),
        "sentinel.events",
    ),
}

__all__ = [
    "AsyncSentinel",
    "AuthChanged",
    "AuthConfig",
    "AuthError",
    "CacheConfig",
    "ChangeEvent",
    "ConnectionChanged",
    "Endpoint",
    "EventsMissed",
    "HealthCheck",
    "InstanceRecord",
    "InstancesChanged",
    "MassLossProtection",
    "MetricsChanged",
    "Registration",
    "RegistryConflict",
    "RegistryError",
    "ResolutionError",
    "Sentinel",
    "SentinelError",
    "ServiceSpec",
    "ServiceSpecChanged",
    "ShardKeysChanged",
    "TlsConfig",
    "ValidationError",
    "ZooKeeperUnavailable",
    "__version__",
]


if not TYPE_CHECKING:  # type checkers see the imports above, and an unknown name is an error

    def __getattr__(name: str) -> object:
        """Import an exported name's module the first time the name is used."""
        module = _EXPORTS.get(name)
        if module is None:
            # Not an export: ``from sentinel import records`` then imports the submodule.
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    """The exported names with the module's own."""
    return sorted({*globals(), *__all__})
