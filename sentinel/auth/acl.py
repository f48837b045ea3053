"""ZooKeeper ACLs that keep each role to its own section (``sentinel init --secure``).

Each role has a digest identity (``user:password``). In a secured namespace:

| node | who may write | everyone |
| --- | --- | --- |
| the namespace root | ``admin`` | read |
| ``/services`` and below | ``publisher``, ``admin`` | read |
| ``/auth`` and below | ``auth_manager``, ``admin`` | read |
| ``/auth/.keys`` | ``auth_manager``, ``admin``; any client *creates* its own key node | read |
| ``/metrics`` and below | ``collector``, ``admin`` | read |
| ``/shard_info`` and below | ``shard_manager``, ``admin`` | read |
| ``/clients`` and below | every client (each adds its own node) | read, write |

A client given ``identity`` creates its nodes writable by that identity alone (and readable by
all), so with one identity per client nobody can replace another client's public key.
Credentials are encrypted, so the world-readable ``/auth`` leaks nothing but their existence.
The collector and the shard manager also write their own services under ``/services`` (and
no others) once the admin grants them (:func:`grant_daemon_services`).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Permissions, make_acl, make_digest_acl

from sentinel.auth.keys import write_secret_file
from sentinel.errors import AccessDenied, KeyFileError, ValidationError
from sentinel.layout import (
    AUTH,
    AUTH_KEYS,
    CLIENTS,
    COLLECTOR_SERVICE_PREFIX,
    DEFAULT_COLLECTOR_CLUSTER,
    METRICS,
    NAME_MAX_LENGTH,
    SERVICES,
    SHARD_INFO,
    SHARD_MANAGER_SERVICE_PREFIX,
    service_path,
    validate_name,
)
from sentinel.records import ServiceSpec
from sentinel.registry import valid_children

IDENTITY_ENV = "SENTINEL_ZK_IDENTITY"
SECTION_OWNERS = {
    SERVICES: "publisher",
    AUTH: "auth_manager",
    METRICS: "collector",
    SHARD_INFO: "shard_manager",
}
ROLES = ("admin", *SECTION_OWNERS.values())
WORLD_READ = make_acl("world", "anyone", read=True)


def split_identity(identity: str) -> tuple[str, str]:
    """``"user:password"`` as (user, password); ValidationError (without the password) if not."""
    user, sep, password = identity.partition(":") if isinstance(identity, str) else ("", "", "")
    if not sep or not user or not password:
        raise ValidationError("a ZooKeeper identity is 'user:password' with both parts non-empty")
    return user, password


def owner_acl(identity: str) -> ACL:
    """All permissions for one digest identity."""
    return make_digest_acl(*split_identity(identity), all=True)


def client_arguments(identity: str | None) -> dict[str, Any]:
    """kazoo arguments for a client acting as ``identity`` (none: anonymous, open ACLs)."""
    if identity is None:
        return {}
    return {"auth_data": [("digest", identity)], "default_acl": [owner_acl(identity), WORLD_READ]}


def grants_write(entry: ACL) -> bool:
    """Whether an ACL entry lets its holder change the node or what is below it."""
    return bool(entry.perms & ~Permissions.READ)


def is_secured(zk: KazooClient) -> bool:
    """Whether the namespace (``zk``'s root) was secured: nobody unidentified may change it.

    A namespace whose root gives any write permission to ``world:anyone`` (or to no identity
    at all) is open, as every namespace is before ``sentinel init --secure``.
    """
    try:
        entries, _ = zk.get_acls("/")
    except NoNodeError:
        return False
    return not any(grants_write(entry) and entry.id.scheme in ("world", "ip") for entry in entries)


def load_identities(path: str | Path, *, create_missing: bool = False) -> dict[str, str]:
    """Every role's identity from a JSON file (mode 0600), generating missing ones if asked."""
    path = Path(path)
    try:
        identities = _json_object(path.read_text()) if path.exists() else {}
    except OSError as exc:
        raise KeyFileError(f"cannot read identities file {str(path)!r}: {exc.strerror}") from None
    unknown = sorted(set(identities) - set(ROLES))
    if unknown:
        raise KeyFileError(f"identities file {str(path)!r} names unknown roles {unknown}")
    missing = [role for role in ROLES if role not in identities]
    if missing and not create_missing:
        raise KeyFileError(f"identities file {str(path)!r} lacks roles {missing}")
    for role in missing:
        identities[role] = f"{role}:{secrets.token_urlsafe(18)}"
    for identity in identities.values():
        split_identity(identity)
    if missing:
        write_secret_file(path, identities)
    return identities


def _json_object(text: str) -> dict[str, str]:
    """A JSON object of strings, or KeyFileError."""
    try:
        document = json.loads(text)
    except ValueError:
        raise KeyFileError("the identities file is not JSON") from None
    if not isinstance(document, dict) or not all(isinstance(v, str) for v in document.values()):
        raise KeyFileError("the identities file must map role names to 'user:password'")
    return document


def namespace_acls(identities: Mapping[str, str]) -> dict[str, list[ACL]]:
    """The ACL of the namespace root and of each section, by path."""
    admin = owner_acl(identities["admin"])
    acls = {"/": [admin, WORLD_READ], CLIENTS: list(OPEN_ACL_UNSAFE)}
    for section, role in SECTION_OWNERS.items():
        acls[section] = [admin, owner_acl(identities[role]), WORLD_READ]
    creator = make_acl("world", "anyone", read=True, create=True)
    acls[AUTH_KEYS] = [admin, owner_acl(identities["auth_manager"]), creator]
    return acls


def secure_namespace(
    zk: KazooClient,
    identities: Mapping[str, str],
    progress: Callable[[str], None] | None = None,
) -> int:
    """Apply :func:`namespace_acls` to the root, the sections and what is below them.

    ``zk`` must be rooted at the namespace and authenticated as ``admin`` (or the nodes still
    open). Client key nodes and ``/clients`` keep their creators' ACLs. Returns the number of
    nodes changed.
    """
    acls = namespace_acls(identities)
    zk.ensure_path(AUTH_KEYS)
    changed = 0
    for path, acl in acls.items():
        zk.set_acls(path, acl)
        changed += 1
        if progress:
            progress(path)
        if path in SECTION_OWNERS:
            changed += _apply_below(zk, path, acl, skip={AUTH_KEYS})
    return changed


def _apply_below(zk: KazooClient, parent: str, acl: list[ACL], skip: set[str]) -> int:
    changed = 0
    try:
        children = zk.get_children(parent)
    except NoNodeError:
        return 0
    for child in children:
        path = f"{parent.rstrip('/')}/{child}"
        if path in skip:
            continue
        try:
            zk.set_acls(path, acl)
        except NoNodeError:
            continue
        changed += 1 + _apply_below(zk, path, acl, skip)
    return changed


# --- daemon services: a daemon role may write its own service and no other ----------------------

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
    """The ACL of a service that ``role`` announces itself under: the ``/services`` owners',
    and ``role`` may add and remove instances below it (not change the spec or the ACL)."""
    user, password = split_identity(identities[role])
    return [
        owner_acl(identities["admin"]),
        owner_acl(identities[SECTION_OWNERS[SERVICES]]),
        make_digest_acl(user, password, read=True, create=True, delete=True),
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
