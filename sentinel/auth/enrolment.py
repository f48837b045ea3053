"""Client key slots: the admin enrols a client, the client publishes its keys into its slot.

In a secured namespace nobody may create nodes under ``/auth/.keys`` but the admin. Enrolling
client ``C`` creates ``/auth/.keys/C`` owned by the admin, with READ and WRITE for the
identity the admin names for ``C``; that identity publishes ``C``'s public keys there, and no
one else can, or can change who may. Whoever encrypts to a key therefore first asks
:func:`slot_owner` who wrote it: an identity the admin enrolled, or the admin itself.

The same identity is what a rotation trusts in ``/clients``: a confirmation counts only from
an entry owned by the identity enrolled for its auth client (:func:`owned_by`).
"""

from __future__ import annotations

from collections.abc import Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError
from kazoo.security import ACL, Id, Permissions

from sentinel.auth import acl
from sentinel.errors import KeySlotNotOwned, NamespaceNotTrusted
from sentinel.registry.layout import AUTH, auth_keys_path, validate_name


def enroll(zk: KazooClient, client: str, owner: Id, *, replace: bool = False) -> bool:
    """Create (or re-grant) ``client``'s key slot for ``owner``; True if anything changed.

    ``zk`` acts as the admin. A slot enrolled for another identity is left alone unless
    ``replace``: then the keys the old identity published are cleared with the grant, so
    nothing is ever encrypted to them again. ValidationError on a bad client name.
    """
    validate_name("client", client)
    path = auth_keys_path(client)
    admin_ids = acl.admins(zk)
    wanted = key_slot_acl(admin_ids, owner)
    try:
        current, _ = zk.get_acls(path)
    except NoNodeError:
        zk.create(path, b"", acl=wanted, makepath=True)
        return True
    if sorted(current) == sorted(wanted):
        return False
    try:
        previous = enrolled_owner(current, admin_ids)
    except ValueError:
        previous = None  # not a slot's ACL (made before the namespace was secured)
    if previous is not None and previous != owner and not replace:
        raise KeySlotNotOwned(
            f"{path} is enrolled for another identity ({previous.id.split(':')[0]}): "
            "re-enrol with --replace to hand it over"
        )
    zk.set_acls(path, wanted)
    if previous != owner:
        zk.set(path, b"")  # published by someone else: never encrypt to those keys
    return True


def key_slot_acl(admin_ids: Iterable[Id], owner: Id | None) -> list[ACL]:
    """A client's key slot: the admins own it, the enrolled identity may write its keys."""
    client = [] if owner is None else [ACL(Permissions.READ | Permissions.WRITE, owner)]
    return [*(ACL(Permissions.ALL, i) for i in sorted(admin_ids)), *client, acl.WORLD_READ]


def enrolled_owner(entries: list[ACL], admin_ids: Iterable[Id]) -> Id | None:
    """The one identity besides the admins that may write a key slot, or None if there is
    none. ValueError if the ACL is not an enrolled slot's (world-writable, several writers,
    or a writer that may change the ACL)."""
    admin_ids = set(admin_ids)
    if acl.world_writable(entries):
        raise ValueError("anyone may write it")
    owners = [e for e in entries if acl.grants_write(e) and e.id not in admin_ids]
    if len(owners) > 1:
        raise ValueError(f"{len(owners)} identities besides the admin may write it")
    if owners and owners[0].perms & (Permissions.ADMIN | Permissions.CREATE | Permissions.DELETE):
        raise ValueError("its writer may change its ACL or nodes below it")
    return owners[0].id if owners else None


def slot_owner(zk: KazooClient, client: str) -> Id | None:
    """The identity enrolled to write ``client``'s keys (None: the admin wrote them).

    In an open namespace there is nothing to check and None is returned. In a secured one,
    :class:`~sentinel.errors.KeySlotNotOwned` names the slot when its ACL is not an enrolled
    slot's (anyone may write it, or several identities, or one that may change its ACL), and
    :class:`~sentinel.errors.NamespaceNotTrusted` says when the namespace was not secured by
    an admin that knew this session's identity (:func:`require_granted`).
    """
    if not acl.is_secured(zk):
        return None
    require_granted(zk)
    path = auth_keys_path(client)
    try:
        entries, _ = zk.get_acls(path)
    except NoNodeError:
        return None  # reading the keys says there are none, with the fix
    try:
        return enrolled_owner(entries, acl.admins(zk))
    except ValueError as exc:
        raise KeySlotNotOwned(
            f"{path} is not owned by client {client!r}'s enrolled identity ({exc}): "
            f"refusing to encrypt to it; run `sentinel auth enroll {client}` as the admin"
        ) from None


def require_granted(zk: KazooClient) -> None:
    """NamespaceNotTrusted unless ``/auth`` lets this session write it and nobody unidentified.

    Whoever holds ADMIN on a namespace's root is its admin, and anyone may create a namespace
    first with an admin of their own, key slots and all: the root alone proves nothing. The
    admin that ``sentinel init --secure`` made grants the auth manager's identity ``/auth``,
    which takes knowing that identity; a squatter does not. Checked without writing: a
    ``setData`` with a version no node has is refused for its ACL before its version.
    """
    entries, _ = zk.get_acls(AUTH)
    if not acl.world_writable(entries):
        try:
            zk.set(AUTH, b"", version=_NO_SUCH_VERSION)
        except BadVersionError:
            return  # the ACL let this session write
        except NoAuthError:
            pass
    raise NamespaceNotTrusted(
        f"this namespace looks secured, but its {AUTH} does not let this identity (and nobody "
        "unidentified) write it: connect as the auth manager's identity; if that is the one "
        "in use, whoever secured the namespace did not know it, and it may be someone else's "
        "(`sentinel doctor --identities FILE` checks it). Nothing was encrypted to its key "
        "slots"
    )


_NO_SUCH_VERSION = -2  # -1 means any version; a node's own is never negative


def owned_by(entries: list[ACL], owner: Id | None, admin_ids: frozenset[Id]) -> bool:
    """Whether a node with ACL ``entries`` can have been written only by ``owner`` (or by an
    admin, when ``owner`` is None). A node nobody may write (a squatter's, shut to READ after
    it wrote it) is nobody's.

    Compared by user name (:func:`~sentinel.auth.acl.principal`): ZooKeeper hides digest
    hashes from sessions without ADMIN on a node, which a rotation's manager lacks on
    clients' entries.
    """
    admins = {acl.principal(i) for i in admin_ids}
    everyone = {acl.principal(i) for i in acl.writers(entries)}
    if acl.world_writable(entries) or not everyone:
        return False
    expected = {acl.principal(owner)} if owner is not None else set()
    return everyone - admins == expected
