"""Sentinel for Python: ZooKeeper-based service discovery for partitioned, multi-tenant services.

The entry point is :class:`Sentinel`, a client that is also a context manager::

    from sentinel import Sentinel

    with Sentinel(hosts="127.0.0.1:2181") as sentinel:
        sentinel.register_service("billing-db", "p1", "10.0.0.5", 5432, scheme="postgresql")

Errors derive from :class:`sentinel.errors.SentinelError`.
"""

from importlib.metadata import PackageNotFoundError, version

from sentinel.client import Sentinel
from sentinel.errors import SentinelError
from sentinel.publisher import Registration
from sentinel.records import InstanceRecord, ServiceSpec

try:
    __version__ = version("sentinel-discovery")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

__all__ = [
    "InstanceRecord",
    "Registration",
    "Sentinel",
    "SentinelError",
    "ServiceSpec",
    "__version__",
]
