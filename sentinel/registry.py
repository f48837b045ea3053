"""Reading the registry straight from ZooKeeper, trusting nothing it holds.

Any program can write under the namespace, so every node is decoded and validated; a node that
fails is logged, counted and skipped, and the rest is served. Nodes may vanish between the
listing and the read; that is normal churn, not an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from sentinel.errors import DecodeError, ServiceNotFound
from sentinel.layout import service_path
from sentinel.records import InstanceRecord, ServiceSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceListing:
    """One read of a service: its spec, its decodable instances, and how many were skipped."""

    spec: ServiceSpec
    instances: tuple[InstanceRecord, ...]
    skipped: int


def read_service(zk: KazooClient, service: str) -> ServiceListing:
    """Read the spec and live instances of ``service``; raise ServiceNotFound if it has no spec."""
    path = service_path(service)
    try:
        data, _ = zk.get(path)
        names = zk.get_children(path)
    except NoNodeError:
        raise ServiceNotFound(f"service {service!r} is not registered") from None
    spec = ServiceSpec.from_bytes(service, path, data)
    # Issue every read before waiting on any, so a listing costs one round trip, not one each.
    pending = [(name, zk.get_async(f"{path}/{name}")) for name in sorted(names)]
    instances, skipped = [], 0
    for name, result in pending:
        child = f"{path}/{name}"
        try:
            child_data, _ = result.get()
            instances.append(InstanceRecord.from_bytes(service, name, child, child_data))
        except NoNodeError:
            continue
        except DecodeError as exc:
            skipped += 1
            log.warning("skipping %s", exc)
    return ServiceListing(spec, tuple(instances), skipped)
