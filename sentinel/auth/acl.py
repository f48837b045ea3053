"""ZooKeeper ACLs that keep each role to its own section (``sentinel init --secure``).

Each role has a digest identity (``user:password``). In a secured namespace:

| node | who may write | everyone |
| --- | --- | --- |
| the namespace root | ``admin`` | read |
| ``/services`` and below | ``publisher``, ``admin`` | read |
| ``/auth`` and below | ``auth_manager``, ``admin`` | read |
| ``/auth/.keys`` | ``admin`` (it enrols clients) | read |
| ``/auth/.keys/<client>`` | ``admin``; the client's enrolled identity writes its keys | read |
| ``/metrics`` and below | ``collector``, ``admin`` | read |
| ``/shard_info`` and below | ``shard_manager``, ``admin`` | read |
| ``/clients`` | ``admin``; ``publisher`` creates ``/clients/<service>`` | read |
| ``/clients/<service>`` | ``admin``; any client *creates* its own entry | read, create |
| ``/clients/<service>/<client>`` | the client's identity | read |

Nobody claims a node someone else should own: the admin grants (a key slot, a service's
``/clients`` node), and nothing open to anyone lets its creator choose who controls it next.
Credentials are encrypted, so the world-readable ``/auth`` leaks nothing but their existence.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.security import (
    ACL,
    OPEN_ACL_UNSAFE,
    Id,
    Permissions,
    make_acl,
    make_digest_acl,
    make_digest_acl_credential,
)

from sentinel.auth.keys import write_secret_file
from sentinel.errors import KeyFileError, ValidationError
from sentinel.layout import AUTH, AUTH_KEYS, CLIENTS, METRICS, SERVICES, SHARD_INFO

IDENTITY_ENV = "SENTINEL_ZK_IDENTITY"
SECTION_OWNERS = {
    SERVICES: "publisher",
    AUTH: "auth_manager",
    METRICS: "collector",
    SHARD_INFO: "shard_manager",
}
ROLES = ("admin", *SECTION_OWNERS.values())
WORLD_READ = make_acl("world", "anyone", read=True)
WORLD_READ_CREATE = make_acl("world", "anyone", read=True, create=True)
# ACL schemes that need no authentication: an entry of theirs is open to anyone.
_UNIDENTIFIED = ("world", "ip")


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


def load_client_identity(path: str | Path, client: str, *, create_missing: bool = False) -> str:
    """A client's identity from its file (JSON ``{"client": ..., "identity": "user:password"}``,
    mode 0600), generated as ``<client>:<random>`` when missing and asked to."""
    path = Path(path)
    if not path.exists():
        if not create_missing:
            raise KeyFileError(f"identity file {str(path)!r} does not exist")
        identity = f"{client}:{secrets.token_urlsafe(18)}"
        write_secret_file(path, {"client": client, "identity": identity})
        return identity
    try:
        document = _json_object(path.read_text())
    except OSError as exc:
        raise KeyFileError(f"cannot read identity file {str(path)!r}: {exc.strerror}") from None
    if document.get("client") != client or "identity" not in document:
        raise KeyFileError(f"identity file {str(path)!r} is not client {client!r}'s")
    split_identity(document["identity"])
    return document["identity"]


def parse_digest_id(text: str) -> Id:
    """``user:base64(sha1(user:password))`` as ZooKeeper shows it, or ValidationError."""
    user, sep, digest = text.partition(":")
    if not sep or not user or len(digest) != 28 or not digest.endswith("="):
        raise ValidationError("a digest id is 'user:<28 base64 characters>' (see getAcl)")
    return Id("digest", text)


def _json_object(text: str) -> dict[str, str]:
    """A JSON object of strings, or KeyFileError."""
    try:
        document = json.loads(text)
    except ValueError:
        raise KeyFileError("the identities file is not JSON") from None
    if not isinstance(document, dict) or not all(isinstance(v, str) for v in document.values()):
        raise KeyFileError("the identities file must map role names to 'user:password'")
    return document


def digest_id(identity: str) -> Id:
    """The ACL id ZooKeeper gives a session authenticated as ``identity`` (``user:password``).

    It holds a hash of the password, not the password, and is what ``getACL`` shows anyone.
    """
    return Id("digest", make_digest_acl_credential(*split_identity(identity)))


def admins(zk: KazooClient) -> frozenset[Id]:
    """The identities that administer the namespace: those with ADMIN on its root."""
    entries, _ = zk.get_acls("/")
    return frozenset(
        e.id for e in entries if e.perms & Permissions.ADMIN and e.id.scheme not in _UNIDENTIFIED
    )


def writers(entries: list[ACL]) -> frozenset[Id]:
    """The ids an ACL lets change a node or create and delete below it."""
    return frozenset(e.id for e in entries if grants_write(e))


def principal(identity: Id) -> Id:
    """An ACL id as anyone may compare it. ZooKeeper shows a digest id's hash only to
    sessions with ADMIN on the node (``user:x`` to the others), so comparisons that may see
    either form go by the user name."""
    if identity.scheme == "digest":
        return Id("digest", identity.id.split(":", 1)[0])
    return identity


def world_writable(entries: list[ACL]) -> bool:
    """Whether an ACL gives anything but READ to someone who need not identify."""
    return any(e.id.scheme in _UNIDENTIFIED for e in entries if grants_write(e))


def namespace_acls(identities: Mapping[str, str]) -> dict[str, list[ACL]]:
    """The ACL of the namespace root and of each section, by path.

    ``/auth/.keys`` is the admin's alone: it creates each client's key slot
    (:mod:`sentinel.auth.enrolment`). ``/clients`` lets publishers create the node of each
    service (``/clients/<service>``: :func:`clients_service_acl`), where clients add their own.
    """
    admin = owner_acl(identities["admin"])
    acls = {
        "/": [admin, WORLD_READ],
        CLIENTS: [admin, ACL(Permissions.CREATE, digest_id(identities["publisher"])), WORLD_READ],
    }
    for section, role in SECTION_OWNERS.items():
        acls[section] = [admin, owner_acl(identities[role]), WORLD_READ]
    acls[AUTH_KEYS] = [admin, WORLD_READ]
    return acls


def clients_service_acl(zk: KazooClient) -> list[ACL]:
    """The ACL of ``/clients/<service>``: every client may add its own node, nobody but the
    admins may delete one or change the ACL. Open when ``/clients`` itself is open."""
    section, _ = zk.get_acls(CLIENTS)
    if world_writable(section):
        return list(OPEN_ACL_UNSAFE)
    return clients_service_acl_for(e.id for e in section if e.perms & Permissions.ADMIN)


def clients_service_acl_for(admin_ids: Iterable[Id]) -> list[ACL]:
    """:func:`clients_service_acl` in a secured namespace with these admins."""
    return [*(ACL(Permissions.ALL, i) for i in sorted(admin_ids)), WORLD_READ_CREATE]


def ensure_clients_node(zk: KazooClient, service: str) -> None:
    """Create ``/clients/<service>`` with :func:`clients_service_acl` unless it exists."""
    path = f"{CLIENTS}/{service}"
    if zk.exists(path) is None:
        with contextlib.suppress(NodeExistsError):
            zk.create(path, acl=clients_service_acl(zk))


@dataclass(frozen=True)
class SecureReport:
    """What :func:`secure_namespace` did: nodes checked and changed, key slots reset to the
    admin (not enrolled), and nodes it could not repair (their ACL shuts the admin out)."""

    checked: int
    changed: int
    reset_key_slots: tuple[str, ...]
    unrepaired: tuple[str, ...]


def secure_namespace(
    zk: KazooClient,
    identities: Mapping[str, str],
    progress: Callable[[str], None] | None = None,
) -> SecureReport:
    """Apply :func:`namespace_acls` to the root, every section and every node below them.

    Convergent: running it again re-applies every ACL, existing nodes included, and changes
    only what differs. ``zk`` must be rooted at the namespace and authenticated as ``admin``
    (or the nodes still open). Below the key slots and ``/clients/<service>`` the rules are:

    * a key slot keeps its enrolled client only if ``/auth/.keys`` was already the admin's
      before this run (its ACL then was set by the admin); any other slot, one made while
      anyone could create key nodes, is reset to the admin and must be enrolled again;
    * each service gets its ``/clients/<service>`` node; clients' own entries keep their
      owners' ACLs.
    """
    acls = namespace_acls(identities)
    admin = digest_id(identities["admin"])
    zk.ensure_path(AUTH_KEYS)
    slots_trusted = writers(zk.get_acls(AUTH_KEYS)[0]) == {admin}
    plan = _Plan(zk, progress)
    for path, acl in acls.items():
        plan.apply(path, acl)
    for section in SECTION_OWNERS:
        skip = AUTH_KEYS if section == AUTH else None
        plan.apply_below(section, acls[section], skip=skip)
    reset = []
    for slot in _children(zk, AUTH_KEYS):
        path = f"{AUTH_KEYS}/{slot}"
        acl = plan.current(path)
        if acl is None:
            continue
        try:
            # Only the admin can have made a slot in a /auth/.keys that was already its own.
            if not slots_trusted or ACL(Permissions.ALL, admin) not in acl:
                raise ValueError("not made by the admin")
            owner = enrolled_owner(acl, {admin})
        except ValueError:
            # Made by someone never enrolled: made again, the admin's and empty, so that
            # nothing is ever encrypted to the keys in it.
            if plan.replace(path, key_slot_acl({admin}, None)):
                reset.append(path)
            continue
        plan.apply(path, key_slot_acl({admin}, owner))
        plan.apply_below(path, acls[AUTH_KEYS])
    for service in _children(zk, SERVICES):
        ensure_clients_node(zk, service)
    for service in _children(zk, CLIENTS):
        plan.apply(f"{CLIENTS}/{service}", clients_service_acl(zk))
    return SecureReport(plan.checked, plan.changed, tuple(reset), tuple(plan.unrepaired))


def key_slot_acl(admin_ids: Iterable[Id], owner: Id | None) -> list[ACL]:
    """A client's key slot: the admins own it, the enrolled identity may write its keys."""
    client = [] if owner is None else [ACL(Permissions.READ | Permissions.WRITE, owner)]
    return [*(ACL(Permissions.ALL, i) for i in sorted(admin_ids)), *client, WORLD_READ]


def enrolled_owner(acl: list[ACL], admin_ids: Iterable[Id]) -> Id | None:
    """The one identity besides the admins that may write a key slot, or None if there is
    none. ValueError if the ACL is not an enrolled slot's (world-writable, several writers,
    or a writer that may change the ACL)."""
    admin_ids = set(admin_ids)
    if world_writable(acl):
        raise ValueError("anyone may write it")
    owners = [e for e in acl if grants_write(e) and e.id not in admin_ids]
    if len(owners) > 1:
        raise ValueError(f"{len(owners)} identities besides the admin may write it")
    if owners and owners[0].perms & (Permissions.ADMIN | Permissions.CREATE | Permissions.DELETE):
        raise ValueError("its writer may change its ACL or nodes below it")
    return owners[0].id if owners else None


class _Plan:
    """Reads each node's ACL and sets it where it differs, counting what it did."""

    def __init__(self, zk: KazooClient, progress: Callable[[str], None] | None) -> None:
        self._zk = zk
        self._progress = progress
        self.checked = 0
        self.changed = 0
        self.unrepaired: list[str] = []

    def current(self, path: str) -> list[ACL] | None:
        try:
            return self._zk.get_acls(path)[0]
        except NoNodeError:
            return None

    def apply(self, path: str, acl: list[ACL], *, exact: bool = True) -> None:
        """Set ``acl`` on ``path`` unless it has it; not ``exact``, a node that only ``acl``'s
        writers may change and anyone may read is left as it is (a publisher's instance
        node is its own, not the admin's)."""
        current = self.current(path)
        if current is None:
            return
        self.checked += 1
        if sorted(current) == sorted(acl) or (not exact and _within(current, acl)):
            return
        try:
            self._zk.set_acls(path, acl)
        except NoNodeError:
            return
        except NoAuthError:
            self.unrepaired.append(path)
            return
        self.changed += 1
        if self._progress:
            self._progress(path)

    def replace(self, path: str, acl: list[ACL]) -> bool:
        """Delete ``path`` (and what is below it) and create it empty with ``acl``; the
        admin may do that where the ACL of the node itself shuts it out."""
        self.checked += 1
        try:
            self._zk.delete(path, recursive=True)
            self._zk.create(path, b"", acl=acl)
        except (NoAuthError, NotEmptyError):
            self.unrepaired.append(path)
            return False
        self.changed += 1
        if self._progress:
            self._progress(path)
        return True

    def apply_below(self, parent: str, acl: list[ACL], skip: str | None = None) -> None:
        for child in _children(self._zk, parent):
            path = f"{parent.rstrip('/')}/{child}"
            if path != skip:
                self.apply(path, acl, exact=False)
                self.apply_below(path, acl, skip)


def _within(current: list[ACL], wanted: list[ACL]) -> bool:
    """Whether ``current`` lets nobody write whom ``wanted`` does not, and anyone read."""
    readable = any(e.id == WORLD_READ.id and e.perms & Permissions.READ for e in current)
    allowed = {principal(i) for i in writers(wanted)}
    return (
        readable
        and not world_writable(current)
        and {principal(i) for i in writers(current)} <= allowed
    )


def _children(zk: KazooClient, path: str) -> list[str]:
    try:
        return sorted(zk.get_children(path))
    except NoNodeError:
        return []
