"""Reading the registry straight from ZooKeeper, trusting nothing it holds.

Any program can write under the namespace, so every node is decoded and validated; a node that
fails is logged, counted and skipped, and the rest is served. Nodes may vanish between the
listing and the read; that is normal churn, not an error.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from sentinel.errors import DecodeError, InvalidName, ServiceNotFound
from sentinel.registry.layout import CLIENTS, METRICS, SERVICES, service_path, validate_name
from sentinel.registry.records import (
    ClientRecord,
    InstanceRecord,
    MetricsRecord,
    ServiceSpec,
    fields_of,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
# Enough reads in flight to hide the round trip, few enough that a large load never holds
# every response (a million-key shard map is tens of MB) in memory at once.
PIPELINE_WINDOW = 64
# A reader of many nodes: (items, path_of) -> (item, result) pairs, result.get() as kazoo's.
Reads = Callable[[Iterable[Any], Callable[[Any], str]], Iterator[tuple[Any, Any]]]


def pipelined(
    request: Callable[[str], Any], items: Iterable[T], path_of: Callable[[T], str]
) -> Iterator[tuple[T, Any]]:
    """Send ``request(path)`` (a kazoo ``*_async`` call) for each item with at most
    PIPELINE_WINDOW requests in flight; yield ``(item, async_result)`` in order."""
    in_flight: deque[tuple[T, Any]] = deque()
    for item in items:
        in_flight.append((item, request(path_of(item))))
        if len(in_flight) >= PIPELINE_WINDOW:
            yield in_flight.popleft()
    while in_flight:
        yield in_flight.popleft()


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
    return pipelined(functools.partial(zk.get_async, watch=watch), items, path_of)


@dataclass
class ReadBudget:
    """How many bytes of node data a read may still take; ``skipped`` counts the nodes left
    unread once it is spent. Bounds what a writer flooding a subtree costs its readers."""

    size: int
    skipped: int = 0


def decode_children(
    zk: KazooClient,
    parent: str,
    names: Sequence[str],
    decode: Callable[[str, str, bytes, ZnodeStat], T],
    watch: Callable[..., Any] | None = None,
    reads: Reads | None = None,
    budget: ReadBudget | None = None,
) -> tuple[dict[str, T], dict[str, DecodeError]]:
    """Read and decode the children ``names`` of ``parent`` (optionally setting watches), with
    :func:`pipelined_reads` or ``reads`` (same contract, e.g. multi-reads).

    ``decode(name, path, data, stat)`` builds a value or raises DecodeError. Returns the decoded
    children and the ones that failed (a child whose ACL refuses the read among them), by name;
    children deleted meanwhile are left out. With a
    ``budget``, reading stops once it is spent (no more requests are sent) and the children
    left unread are counted in it.
    """
    decoded: dict[str, T] = {}
    invalid: dict[str, DecodeError] = {}
    reads = reads or functools.partial(pipelined_reads, zk, watch=watch)
    for done, (name, result) in enumerate(reads(names, lambda n: f"{parent}/{n}")):
        if budget is not None and budget.size < 0:
            budget.skipped += len(names) - done
            break
        try:
            data, stat = result.get()
        except NoNodeError:
            continue  # deleted between the listing and the read: churn, not an error
        except NoAuthError:  # shut to this identity (planted, or another's): skipped as unreadable
            invalid[name] = DecodeError(f"{parent}/{name}", "its ACL refuses this identity a read")
            continue
        if budget is not None:
            budget.size -= len(data or b"")
        path = f"{parent}/{name}"
        try:
            with fields_of(path):  # whatever the decoder raises: a skipped node
                decoded[name] = decode(name, path, data, stat)
        except DecodeError as exc:
            invalid[name] = exc
    return decoded, invalid


def _skip_logged(invalid: dict[str, DecodeError]) -> int:
    for exc in invalid.values():
        log.warning("skipping %s", exc)
    return len(invalid)


@dataclass(frozen=True)
class ServiceListing:
    """One read of a service: its spec, its decodable instances, how many were skipped, and
    the paths of the decodable ones whose node is persistent (a publisher's is ephemeral:
    such a node was planted, and a secured namespace does not serve it)."""

    spec: ServiceSpec
    instances: tuple[InstanceRecord, ...]
    skipped: int
    persistent_nodes: tuple[str, ...] = ()


def read_service(zk: KazooClient, service: str) -> ServiceListing:
    """Read the spec and live instances of ``service``; raise ServiceNotFound if it has no spec."""
    path = service_path(service)
    try:
        data, _ = zk.get(path)
        names = zk.get_children(path)
    except NoNodeError:
        raise ServiceNotFound(service) from None
    spec = ServiceSpec.from_bytes(service, path, data)
    persistent: list[str] = []

    def decode(name: str, node: str, value: bytes, stat: ZnodeStat) -> InstanceRecord:
        record = InstanceRecord.from_bytes(service, name, node, value)
        if not stat.ephemeralOwner:
            persistent.append(node)
        return record

    instances, invalid = decode_children(zk, path, sorted(names), decode)
    return ServiceListing(spec, tuple(instances.values()), _skip_logged(invalid), tuple(persistent))


def valid_children(zk: KazooClient, path: str) -> list[str]:
    """The valid names under ``path``, sorted; none if it does not exist (yet)."""
    try:
        return sorted(n for n in zk.get_children(path) if _is_name(n))
    except NoNodeError:
        return []


def all_children(zk: KazooClient, path: str) -> list[str]:
    """Every name under ``path``, sorted, valid or not (what an ACL check must see); none if
    it does not exist (yet)."""
    try:
        return sorted(zk.get_children(path))
    except NoNodeError:
        return []


def list_services(zk: KazooClient) -> list[str]:
    """The names under ``/services`` (valid names only), sorted."""
    return valid_children(zk, SERVICES)


def services_sharded_by(zk: KazooClient, policy: str) -> list[str]:
    """The services whose spec names shard ``policy``, sorted.

    Only the specs are read (pipelined), not the instances; an unreadable spec is skipped
    (``sentinel doctor`` reports it).
    """
    specs, _ = decode_children(
        zk, SERVICES, list_services(zk), lambda n, p, d, _: ServiceSpec.from_bytes(n, p, d)
    )
    return [name for name, spec in specs.items() if spec.shard_policy == policy]


def read_metrics(zk: KazooClient, service: str) -> tuple[dict[str, MetricsRecord], int]:
    """The metrics nodes of ``service`` by instance name, and how many were skipped."""
    parent = f"{METRICS}/{service}"
    try:
        names = zk.get_children(parent)
    except NoNodeError:
        return {}, 0
    records, invalid = decode_children(
        zk, parent, sorted(names), lambda n, p, d, _: MetricsRecord.from_bytes(service, n, p, d)
    )
    return records, _skip_logged(invalid)


def read_clients(zk: KazooClient) -> dict[str, dict[str, ClientRecord]]:
    """Every decodable ``/clients/<service>/<client>`` node, by service then client id."""
    return {service: read_clients_of(zk, service) for service in valid_children(zk, CLIENTS)}


def read_clients_of(zk: KazooClient, service: str) -> dict[str, ClientRecord]:
    """Every decodable ``/clients/<service>/<client>`` node of one service, by client id."""
    parent = f"{CLIENTS}/{service}"
    try:
        names = zk.get_children(parent)
    except NoNodeError:
        return {}
    records, invalid = decode_children(
        zk, parent, sorted(names), lambda n, p, d, _: ClientRecord.from_bytes(service, n, p, d)
    )
    _skip_logged(invalid)
    return records


def _is_name(value: object) -> bool:
    try:
        validate_name("name", value)
    except InvalidName:
        return False
    return True
