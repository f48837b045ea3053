"""Sentinel for Python: ZooKeeper-based service discovery for partitioned, multi-tenant services.

The entry point is :class:`Sentinel`, a client that is also a context manager::

    from sentinel import Sentinel

    with Sentinel(hosts="127.0.0.1:2181") as sentinel:
        sentinel.register_service("billing-db", "p1", "10.0.0.5", 5432, scheme="postgresql")

Errors derive from :class:`sentinel.errors.SentinelError`.
"""

from sentinel.client import Sentinel
from sentinel.errors import SentinelError
from sentinel.publisher import Registration
from sentinel.records import InstanceRecord, ServiceSpec
from sentinel.redaction import install_kazoo_redaction
from sentinel.tls import TlsConfig
from sentinel.version import __version__

install_kazoo_redaction()

__all__ = [
    "InstanceRecord",
    "Registration",
    "Sentinel",
    "SentinelError",
    "ServiceSpec",
    "TlsConfig",
    "__version__",
]
