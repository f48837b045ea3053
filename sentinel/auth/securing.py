"""``sentinel init --secure``: apply :mod:`sentinel.auth.acl`'s ACLs to a whole namespace.

Convergent: running it again re-applies every ACL, existing nodes included, and changes only
what differs; a node whose own ACL shuts the admin out is reported, not skipped silently.

Roles are recognised by their full identity (scheme and id: the digest's hash), never by the
user name: anyone may authenticate as ``publisher:<any password>``, and the node it creates
shows ``digest:publisher:...`` too. ZooKeeper shows a digest's hash only to sessions with
ADMIN on the node, so securing acts as every role at once (it holds all their identities):
a node any role made then shows its hash, and one that still hides it was made by nobody
securing knows. Such a node is removed (its parent is the admin's), or named as unrepaired.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError, NotEmptyError
from kazoo.security import ACL, Permissions

from sentinel.auth.acl import (
    AUTH_KEYS,
    SECTION_OWNERS,
    WORLD_READ,
    act_as_every_role,
    clients_service_acl,
    ensure_clients_node,
    identity_id,
    namespace_acls,
    principal,
    publish_admins,
    world_writable,
    writers,
)
from sentinel.auth.enrolment import enrolled_owner, key_slot_acl
from sentinel.auth.grants import daemon_grants, grant_daemon_services, service_acl
from sentinel.errors import NamespaceNotControlled
from sentinel.registry.layout import AUTH, CLIENTS, SERVICES, service_path
from sentinel.registry.reads import all_children


def check_namespace_control(zk: KazooClient, namespace: str, identities: Mapping[str, str]) -> None:
    """Refuse to secure ``namespace`` unless one of ``identities`` controls its root and
    every parent.

    ``zk`` is rooted at the ensemble's root and acts as every role
    (:func:`~sentinel.auth.acl.act_as_every_role`). ZooKeeper's own root is writable by
    anyone, so anyone may create a namespace first, with their own admin: securing it would
    leave that admin in charge (and key slots it made would pass for the admin's). A node is
    controlled when ADMIN on it is held by anyone (``world``: securing takes the root over)
    or by one of ``identities`` (compared whole: the hash ZooKeeper shows only to a session
    with ADMIN); otherwise :class:`~sentinel.errors.NamespaceNotControlled` names the node
    and the fix, and nothing is changed. Missing nodes are created by the caller.
    """
    ours = {identity_id(identity) for identity in identities.values()}
    path = ""
    for part in namespace.strip("/").split("/"):
        path = f"{path}/{part}"
        try:
            entries, _ = zk.get_acls(path)
        except NoNodeError:
            return
        holders = {e.id for e in entries if e.perms & Permissions.ADMIN}
        if holders & ours or any(i.scheme == "world" for i in holders):
            continue
        names = ", ".join(sorted(f"{i.scheme}:{principal(i).id}" for i in holders)) or "nobody"
        raise NamespaceNotControlled(
            f"{path} is controlled by {names}, none of them an identity of the identities "
            "file: someone created it before the namespace was secured (ZooKeeper lets anyone "
            f"create under {path.rpartition('/')[0] or '/'}). Nothing was changed. Delete it as "
            f"a ZooKeeper superuser (`deleteall {path}` with "
            "-Dzookeeper.DigestAuthenticationProvider.superDigest) or choose another "
            "--namespace, then run `sentinel init --secure` again"
        )


@dataclass(frozen=True)
class SecureReport:
    """What :func:`secure_namespace` did: nodes checked and changed, key slots reset to the
    admin (not enrolled), nodes removed (written by an identity that is none of the roles'
    and whose ACL it could not reset), and nodes it could not repair (their ACL shuts the
    admin out)."""

    checked: int
    changed: int
    reset_key_slots: tuple[str, ...]
    unrepaired: tuple[str, ...]
    grants: dict[str, str] = field(default_factory=dict)  # daemon service -> role
    removed: tuple[str, ...] = ()


def secure_namespace(
    zk: KazooClient,
    identities: Mapping[str, str],
    grants: Iterable[tuple[str, str]] = (),
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
      owners' ACLs, and what is no process's entry there (a persistent node, or one with
      children: a client's is ephemeral) is removed, or named when its ACL shuts the admin
      out (rotations ignore it: :func:`~sentinel.auth.entries.live_processes`);
    * the daemons' services keep (or get: ``grants``, (role, service) pairs) their grants
      (:func:`~sentinel.auth.grants.grant_daemon_services`).
    """
    acls = namespace_acls(identities)
    admin = identity_id(identities["admin"])
    act_as_every_role(zk, identities)
    zk.ensure_path(AUTH_KEYS)
    slots_trusted = writers(zk.get_acls(AUTH_KEYS)[0]) == {admin}
    granted = daemon_grants(zk, grants)
    plan = _Plan(zk, progress)
    for path, acl in acls.items():
        plan.apply(path, acl)
    skips = {AUTH: {AUTH_KEYS}, SERVICES: {service_path(service) for service in granted}}
    for section in SECTION_OWNERS:
        plan.apply_below(section, acls[section], skip=skips.get(section, set()))
    reset = []
    for slot in all_children(zk, AUTH_KEYS):
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
    publish_admins(zk)
    for service in all_children(zk, SERVICES):
        ensure_clients_node(zk, service)
    clients_acl = clients_service_acl(zk)  # the admin sees the ids whole: never None here
    for service in all_children(zk, CLIENTS):
        if plan.apply(f"{CLIENTS}/{service}", clients_acl):
            plan.remove_squatters(f"{CLIENTS}/{service}")
    granted = grant_daemon_services(zk, identities, grants)
    for service, role in granted.items():
        plan.apply_below(service_path(service), service_acl(identities, role))
    return SecureReport(
        plan.checked,
        plan.changed,
        tuple(reset),
        tuple(plan.unrepaired),
        granted,
        tuple(plan.removed),
    )


class _Plan:
    """Reads each node's ACL and sets it where it differs, counting what it did."""

    def __init__(self, zk: KazooClient, progress: Callable[[str], None] | None) -> None:
        self._zk = zk
        self._progress = progress
        self.checked = 0
        self.changed = 0
        self.unrepaired: list[str] = []
        self.removed: list[str] = []

    def current(self, path: str) -> list[ACL] | None:
        try:
            return self._zk.get_acls(path)[0]
        except NoNodeError:
            return None

    def apply(self, path: str, acl: list[ACL], *, exact: bool = True) -> bool:
        """Set ``acl`` on ``path`` unless it has it; False if the node is gone (or removed).

        Not ``exact``, a node that only ``acl``'s writers may change and anyone may read is
        left as it is (a publisher's instance node is its own, not the admin's); one that
        someone else may change and whose ACL cannot be reset (it was made by an identity
        that is none of the roles', such as ``publisher`` with another password) is removed,
        since nothing in it comes from a role.
        """
        current = self.current(path)
        if current is None:
            return False
        self.checked += 1
        if sorted(current) == sorted(acl) or (not exact and _within(current, acl)):
            return True
        try:
            self._zk.set_acls(path, acl)
        except NoNodeError:
            return False
        except NoAuthError:
            if exact or not self._remove(path):
                self.unrepaired.append(path)
                return True
            return False
        self._changed(path)
        return True

    def _remove(self, path: str) -> bool:
        """Delete ``path`` and what is below it, if the admin may; True if it is gone."""
        try:
            self._zk.delete(path, recursive=True)
        except NoNodeError:
            return True
        except (NoAuthError, NotEmptyError):
            return False
        self.removed.append(path)
        self._changed(path)
        return True

    def _changed(self, path: str) -> None:
        self.changed += 1
        if self._progress:
            self._progress(path)

    def remove_squatters(self, parent: str) -> None:
        """Remove each child of ``parent`` that is not a live process's entry: a client's is
        an ephemeral node, which cannot have children."""
        for child in all_children(self._zk, parent):
            path = f"{parent}/{child}"
            stat = self._zk.exists(path)
            if stat is None or (stat.ephemeralOwner and not stat.numChildren):
                continue
            self.checked += 1
            if not self._remove(path):
                self.unrepaired.append(path)

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
        self._changed(path)
        return True

    def apply_below(self, parent: str, acl: list[ACL], skip: set[str] | None = None) -> None:
        for child in all_children(self._zk, parent):
            path = f"{parent.rstrip('/')}/{child}"
            if path not in (skip or ()) and self.apply(path, acl, exact=False):
                self.apply_below(path, acl, skip)


def _within(current: list[ACL], wanted: list[ACL]) -> bool:
    """Whether ``current`` lets some of ``wanted``'s writers and nobody else write, and
    anyone read. A node nobody may write is nobody's: left behind so that no one can change
    or remove it (its maker shut it to READ).

    Identities are compared whole (scheme and id, a digest's hash included): a digest whose
    hash ZooKeeper hid (``user:x``) is none of the roles', whose hashes this session sees.
    """
    readable = any(e.id == WORLD_READ.id and e.perms & Permissions.READ for e in current)
    found = writers(current)
    return readable and not world_writable(current) and bool(found) and found <= writers(wanted)
