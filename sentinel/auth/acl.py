"""ZooKeeper ACLs that keep each role to its own section (``sentinel init --secure``).

Each role has a digest identity (``user:password``), or a SASL one (``sasl:user:password``,
DIGEST-MD5 against the server's JAAS users). In a secured namespace:

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
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Permissions, make_acl, make_digest_acl

from sentinel.auth.keys import write_secret_file
from sentinel.errors import KeyFileError, ValidationError
from sentinel.layout import AUTH, AUTH_KEYS, CLIENTS, METRICS, SERVICES, SHARD_INFO

IDENTITY_ENV = "SENTINEL_ZK_IDENTITY"
# "sasl:user:password" authenticates with SASL DIGEST-MD5 instead of the digest scheme.
SASL_PREFIX = "sasl:"
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
    """All permissions for one identity: digest ``user:password``, or ``sasl:user:password``
    (SASL DIGEST-MD5; the ACL names the user)."""
    if identity.startswith(SASL_PREFIX):
        return make_acl("sasl", split_identity(identity.removeprefix(SASL_PREFIX))[0], all=True)
    return make_digest_acl(*split_identity(identity), all=True)


def client_arguments(identity: str | None) -> dict[str, Any]:
    """kazoo arguments for a client acting as ``identity`` (none: anonymous, open ACLs)."""
    if identity is None:
        return {}
    default_acl = [owner_acl(identity), WORLD_READ]
    if identity.startswith(SASL_PREFIX):
        user, password = split_identity(identity.removeprefix(SASL_PREFIX))
        sasl = {"mechanism": "DIGEST-MD5", "username": user, "password": password}
        return {"sasl_options": sasl, "default_acl": default_acl}
    return {"auth_data": [("digest", identity)], "default_acl": default_acl}


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
