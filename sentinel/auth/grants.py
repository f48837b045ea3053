"""Daemon services: the collector and the shard manager announce themselves (their cluster
views, :mod:`sentinel.topology`) under ``/services``, which only publishers write. The admin
grants each daemon role its own services, and no service that applications resolve.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError
from kazoo.security import ACL, Permissions

from sentinel.auth.acl import SECTION_OWNERS, WORLD_READ, identity_id, owner_acl
from sentinel.errors import AccessDenied, ValidationError
from sentinel.registry.layout import (
    COLLECTOR_SERVICE_PREFIX,
    DEFAULT_COLLECTOR_CLUSTER,
    NAME_MAX_LENGTH,
    SERVICES,
    SHARD_INFO,
    SHARD_MANAGER_SERVICE_PREFIX,
    service_path,
    validate_name,
)
from sentinel.registry.reads import valid_children
from sentinel.registry.records import ServiceSpec

# Which services each daemon role announces itself under (its cluster views). Only these can be
# granted, so a grant never lets a daemon write a service that applications resolve.
DAEMON_SERVICE_PREFIXES = {
    "collector": COLLECTOR_SERVICE_PREFIX,
    "shard_manager": SHARD_MANAGER_SERVICE_PREFIX,
}


def parse_grant(text: str) -> tuple[str, str]:
    """``"ROLE=SERVICE"`` (``collector=metric-collector-eu``) as (role, service), checked.

    The role must be a daemon role and the service one of its own names
    (:data:`DAEMON_SERVICE_PREFIXES`); ValidationError otherwise.
    """
    role, sep, service = text.partition("=")
    prefix = DAEMON_SERVICE_PREFIXES.get(role)
    if not sep or prefix is None:
        raise ValidationError(
            f"a grant is ROLE=SERVICE with ROLE one of {sorted(DAEMON_SERVICE_PREFIXES)}, "
            f"got {text!r}"
        )
    validate_name("service", service)
    if not service.startswith(prefix) or service == prefix:
        raise ValidationError(
            f"the {role} role may only be granted its own services, named {prefix}NAME; "
            f"got {service!r}"
        )
    return role, service


def service_acl(identities: Mapping[str, str], role: str) -> list[ACL]:
    """The ACL of a service that ``role`` announces itself under: the admin's (only the
    admin may change the spec or the ACL), and ``role`` may add and remove instances below
    it. The publisher, which writes the rest of ``/services``, may only read it: a member it
    could add would take a share of the daemons' work (a collector member with a forged
    configuration digest stopped the whole cluster's collection)."""
    return [
        owner_acl(identities["admin"]),
        ACL(
            Permissions.READ | Permissions.CREATE | Permissions.DELETE,
            identity_id(identities[role]),
        ),
        WORLD_READ,
    ]


def grant_service(zk: KazooClient, service: str, role: str, identities: Mapping[str, str]) -> None:
    """Let ``role`` register instances of ``service`` (and nothing else under ``/services``).

    Creates the service's spec if it is missing (with the defaults a first registration would
    give it), since the role cannot create it itself, and sets :func:`service_acl` on it. The
    instances below keep their creators' ACLs. ``zk`` is rooted at the namespace and acts as
    ``admin``, and as ``publisher`` too when the spec was created by the publisher's identity
    (only its creator may change the ACL of such a node): :func:`grant_daemon_services` does.
    """
    path = service_path(validate_name("service", service))
    acl = service_acl(identities, role)
    try:
        zk.create(path, ServiceSpec(service).to_bytes(path), acl=acl)
    except NodeExistsError:
        zk.set_acls(path, acl)


def daemon_grants(zk: KazooClient, requested: Iterable[tuple[str, str]] = ()) -> dict[str, str]:
    """The daemon services to grant, service -> role: the default collector cluster's, the
    shard manager's of every shard policy, every daemon service that exists already (so that
    granting again keeps the earlier grants), and ``requested``."""
    grants = {f"{COLLECTOR_SERVICE_PREFIX}{DEFAULT_COLLECTOR_CLUSTER}": "collector"}
    for policy in valid_children(zk, SHARD_INFO):
        grants[f"{SHARD_MANAGER_SERVICE_PREFIX}{policy}"] = "shard_manager"
    for service in valid_children(zk, SERVICES):
        for role, prefix in DAEMON_SERVICE_PREFIXES.items():
            if service.startswith(prefix) and service != prefix:
                grants[service] = role
    for role, service in requested:
        grants[service] = role
    return {
        service: role
        for service, role in sorted(grants.items())
        if len(service) <= NAME_MAX_LENGTH  # a policy name too long to have a manager
    }


def grant_daemon_services(
    zk: KazooClient,
    identities: Mapping[str, str],
    requested: Iterable[tuple[str, str]] = (),
) -> dict[str, str]:
    """Apply :func:`grant_service` to every one of :func:`daemon_grants`; returns them.

    ``zk`` acts as ``admin``; it is given the publisher's identity too. After
    :func:`secure_namespace` (which gives every service the section's ACL), and whenever a
    shard policy or daemon service is added.
    """
    grants = daemon_grants(zk, requested)
    # Daemons used to run as the publisher, whose specs only the publisher may re-ACL.
    zk.add_auth("digest", identities[SECTION_OWNERS[SERVICES]])
    for service, role in grants.items():
        grant_service(zk, service, role, identities)
    return grants


def not_granted(role: str, service: str) -> AccessDenied:
    """The error of a daemon refused to announce itself as ``service``: what to do about it."""
    return AccessDenied(
        f"ZooKeeper's ACLs refused to register this {role.replace('_', ' ')} in {service!r}: "
        f"run it as the {role!r} identity, and have the admin grant that service "
        f"(sentinel grant --identities FILE {role}={service})"
    )
