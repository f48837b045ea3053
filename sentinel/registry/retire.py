"""Retiring a service: its spec and everything kept under its name, in one transaction.

A service with no instance stays listed (``sentinel ls``) and checked (``sentinel doctor``)
until someone removes it, as Consul's and Eureka's users expect to be able to. Its nodes are
``/services/<service>`` (the spec, and its instances below it), ``/metrics/<service>``,
``/clients/<service>`` (the clients that follow it) and ``/auth/<service>`` (their
credentials). :func:`retire_service` deletes all of them in one ZooKeeper transaction,
conditional on the spec's version: a registration, a follower or a spec change that comes
in between fails the whole transaction, and nothing is removed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError

from sentinel.errors import RegistryConflict, ServiceInUse, ServiceNotFound, ValueTooLarge
from sentinel.registry.layout import AUTH, CLIENTS, METRICS, service_path, validate_name
from sentinel.registry.reads import all_children
from sentinel.registry.records import MAX_VALUE_BYTES
from sentinel.zk.ephemeral import first_failure

log = logging.getLogger(__name__)

# What one delete costs in a transaction besides its path (ZooKeeper's multi header and the
# delete request's version): a bound for the request's size, kept under jute.maxbuffer.
_DELETE_OVERHEAD = 16


@dataclass(frozen=True)
class Retired:
    """What retiring a service removed: how many instances and followers it still had (with
    ``force``), and every node deleted, deepest first."""

    service: str
    instances: int
    followers: int
    removed: tuple[str, ...]


def retire_service(zk: KazooClient, service: str, *, force: bool = False) -> Retired:
    """Delete ``service``: its spec, instances, metrics, followers' entries and credentials,
    in one transaction. Refused (:class:`~sentinel.errors.ServiceInUse`) while instances are
    registered or clients follow it, unless ``force``; ServiceNotFound when it has no spec;
    RegistryConflict when it changed while it was being retired (run it again); ValueTooLarge
    when it holds more nodes than one transaction can carry (``sentinel prune`` its metrics
    first). Nothing is removed unless everything is."""
    validate_name("service", service)
    spec = service_path(service)
    try:
        _, stat = zk.get(spec)
    except NoNodeError:
        raise ServiceNotFound(service) from None
    instances = all_children(zk, spec)
    followers = all_children(zk, f"{CLIENTS}/{service}")
    if (instances or followers) and not force:
        raise ServiceInUse(service, len(instances), len(followers))
    removed = [
        *_subtree(zk, spec),
        *_subtree(zk, f"{METRICS}/{service}"),
        *_subtree(zk, f"{CLIENTS}/{service}"),
        *_subtree(zk, f"{AUTH}/{service}"),
    ]
    size = sum(len(path.encode()) + _DELETE_OVERHEAD for path in removed)
    if size > MAX_VALUE_BYTES:
        raise ValueTooLarge(
            f"service {service!r} holds {len(removed)} nodes, more than one transaction can "
            "delete; nothing was removed (sentinel prune removes metrics without an instance)"
        )
    transaction = zk.transaction()
    transaction.check(spec, stat.version)  # a spec rewritten meanwhile: not the one judged
    for path in removed:
        transaction.delete(path)
    failure = first_failure(transaction.commit())
    if isinstance(failure, NoAuthError):
        raise failure  # this identity may not delete one of them: AccessDenied, as any write
    if failure is not None:
        # A node added under one of them (a registration, a follower) makes its delete fail
        # (not empty); a node gone, or the spec rewritten, fails its own op.
        raise RegistryConflict(
            f"service {service!r} changed while it was being retired ({type(failure).__name__}); "
            "nothing was removed: run it again"
        )
    log.info(
        "retired service %r (%d instance(s), %d follower(s), %d node(s))",
        service,
        len(instances),
        len(followers),
        len(removed),
    )
    return Retired(service, len(instances), len(followers), tuple(removed))


def _subtree(zk: KazooClient, root: str) -> list[str]:
    """``root`` and every node below it, children before their parent; none if it does not
    exist."""
    if zk.exists(root) is None:
        return []
    ordered: list[str] = []
    stack = [root]
    while stack:
        path = stack.pop()
        ordered.append(path)
        stack.extend(f"{path}/{child}" for child in all_children(zk, path))
    return ordered[::-1]
