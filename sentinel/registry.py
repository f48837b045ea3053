"""Reading the registry straight from ZooKeeper, trusting nothing it holds.

Any program can write under the namespace, so every node is decoded and validated; a node that
fails is logged, counted and skipped, and the rest is served. Nodes may vanish between the
listing and the read; that is normal churn, not an error.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from sentinel.errors import DecodeError, ServiceNotFound
from sentinel.layout import service_path
from sentinel.records import InstanceRecord, ServiceSpec

log = logging.getLogger(__name__)

T = TypeVar("T")
# Enough reads in flight to hide the round trip, few enough that a large load never holds
# every response (a million-key shard map is tens of MB) in memory at once.
PIPELINE_WINDOW = 64


def pipelined_reads(
    zk: KazooClient,
    items: Iterable[T],
    path_of: Callable[[T], str],
    watch: Callable[..., Any] | None = None,
) -> Iterator[tuple[T, Any]]:
    """Read the node of each item with at most PIPELINE_WINDOW requests in flight.

    Yields ``(item, async_result)`` in order; ``async_result.get()`` returns ``(data, stat)``
    or raises (``NoNodeError`` for a node deleted meanwhile).
    """
    in_flight: deque[tuple[T, Any]] = deque()
    for item in items:
        in_flight.append((item, zk.get_async(path_of(item), watch=watch)))
        if len(in_flight) >= PIPELINE_WINDOW:
            yield in_flight.popleft()
    while in_flight:
        yield in_flight.popleft()


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
    instances, skipped = [], 0
    for name, result in pipelined_reads(zk, sorted(names), lambda n: f"{path}/{n}"):
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
