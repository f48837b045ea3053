"""ZooKeeper ACLs that keep each role to its own section (``sentinel init --secure``).

Each role has a digest identity (``user:password``), or a SASL one (``sasl:user:password``,
DIGEST-MD5 against the server's JAAS users). In a secured namespace:

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

Only the admin holds ADMIN (the right to change a node's ACL) on the root, the sections and the
nodes it grants; each role holds every other right on its section, and ADMIN on the nodes it
creates itself (as anyone who creates a node may choose its ACL).
Nobody claims a node someone else should own: the admin grants (a key slot, a service's
``/clients`` node), and nothing open to anyone lets its creator choose who controls it next.
Credentials are encrypted, so the world-readable ``/auth`` leaks nothing but their existence.
The collector and the shard manager also write their own services under ``/services`` (and
no others) once the admin grants them (:mod:`sentinel.auth.grants`). Applying all of this to
a namespace, and again whenever it may have drifted, is :mod:`sentinel.auth.securing`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.security import (
    ACL,
    OPEN_ACL_UNSAFE,
    Id,
    Permissions,
    make_acl,
    make_digest_acl_credential,
)

from sentinel.errors import AccessDenied, DecodeError, KeyFileError, ValidationError
from sentinel.private_files import read_secret_file, write_secret_file
from sentinel.registry.layout import AUTH, AUTH_KEYS, CLIENTS, METRICS, SERVICES, SHARD_INFO
from sentinel.registry.records import decode, encode
from sentinel.zk.errors import translate

IDENTITY_ENV = "SENTINEL_ZK_IDENTITY"
#: An identity that says "none": anonymous even where ``$SENTINEL_ZK_IDENTITY`` is set (a
#: session to another region's ensemble, which must never be sent this region's password).
ANONYMOUS = ""


def effective_identity(identity: str | None) -> str | None:
    """The identity a session uses: ``identity``; None: ``$SENTINEL_ZK_IDENTITY`` (else
    anonymous); :data:`ANONYMOUS`: anonymous (None)."""
    if identity is None:
        return os.environ.get(IDENTITY_ENV) or None
    return identity or None


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
    """All permissions for one identity: digest ``user:password``, or ``sasl:user:password``
    (SASL DIGEST-MD5; the ACL names the user)."""
    return ACL(Permissions.ALL, identity_id(identity))


def role_acl(identity: str) -> ACL:
    """Every permission but ADMIN for one identity: what a role holds on a node it did not
    create (a section, a daemon's service). Only the admin may change who may do what there;
    a role holding ADMIN could open its section to anyone, or shut the admin out of it."""
    return ACL(Permissions.ALL & ~Permissions.ADMIN, identity_id(identity))


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
    identities = _json_object(read_secret_file(path, "identities file")) if path.exists() else {}
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
    document = _json_object(read_secret_file(path, "identity file"))
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


def _json_object(text: str | bytes) -> dict[str, str]:
    """A JSON object of strings, or KeyFileError."""
    try:
        document = json.loads(text)
    except ValueError:
        raise KeyFileError("the identities file is not JSON") from None
    if not isinstance(document, dict) or not all(isinstance(v, str) for v in document.values()):
        raise KeyFileError("the identities file must map role names to 'user:password'")
    return document


def identity_id(identity: str) -> Id:
    """The ACL id ZooKeeper gives a session authenticated as ``identity``: ``digest`` with a
    hash of ``user:password`` (not the password; ``getACL`` shows it to admins), or ``sasl``
    with the user name for ``sasl:user:password``."""
    if identity.startswith(SASL_PREFIX):
        return Id("sasl", split_identity(identity.removeprefix(SASL_PREFIX))[0])
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
    """An ACL id reduced to its user name. ZooKeeper shows a digest id's hash only to
    sessions with ADMIN on the node (``user:x`` to the others); a comparison by user name
    cannot tell a role from anyone who claims its user name with another password, so it
    only serves where nothing better can be seen (and says so: ``sentinel doctor``)."""
    if identity.scheme == "digest":
        return Id("digest", identity.id.split(":", 1)[0])
    return identity


def hidden(identity: Id) -> bool:
    """Whether ZooKeeper hid this digest id's hash (``user:x``): the session reading the ACL
    has no ADMIN on the node, so it cannot tell the role's identity from another password
    for the same user name."""
    return identity.scheme == "digest" and identity.id.endswith(":x")


def act_as_every_role(zk: KazooClient, identities: Mapping[str, str]) -> None:
    """Authenticate ``zk`` as every role's digest identity too, so that ZooKeeper shows it
    the hash of every id on every node a role made (it hides them from sessions without
    ADMIN on the node; :func:`hidden`). A SASL identity's id is its user name, shown to
    everyone."""
    for identity in identities.values():
        if not identity.startswith(SASL_PREFIX):
            zk.add_auth("digest", identity)


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
        CLIENTS: [admin, ACL(Permissions.CREATE, identity_id(identities["publisher"])), WORLD_READ],
    }
    for section, role in SECTION_OWNERS.items():
        acls[section] = [admin, role_acl(identities[role]), WORLD_READ]
    acls[AUTH_KEYS] = [admin, WORLD_READ]
    return acls


def clients_service_acl(zk: KazooClient) -> list[ACL] | None:
    """The ACL of ``/clients/<service>``: every client may add its own node, nobody but the
    admins may delete one or change the ACL. Open when ``/clients`` itself is open.

    ZooKeeper shows the admins' digest ids only to the admins (``user:x`` to the publisher
    that creates the node), so ``init --secure`` also writes them into ``/clients``' data,
    which nobody else may write. None when neither says who the admins are.
    """
    section, _ = zk.get_acls(CLIENTS)
    if world_writable(section):
        return list(OPEN_ACL_UNSAFE)
    admins = {e.id for e in section if e.perms & Permissions.ADMIN}
    if any(i.scheme == "digest" and i.id.endswith(":x") for i in admins):
        admins = _published_admins(zk, {principal(i) for i in admins})
    return clients_service_acl_for(admins) if admins else None


def clients_service_acl_for(admin_ids: Iterable[Id]) -> list[ACL]:
    """:func:`clients_service_acl` in a secured namespace with these admins."""
    return [*(ACL(Permissions.ALL, i) for i in sorted(admin_ids)), WORLD_READ_CREATE]


def publish_admins(zk: KazooClient) -> None:
    """Write the admins' ids into ``/clients``' data for :func:`clients_service_acl`; ``zk``
    is an admin (it sees the ids whole)."""
    section, _ = zk.get_acls(CLIENTS)
    admins = (e.id for e in section if e.perms & Permissions.ADMIN)
    ids = sorted(i.id for i in admins if i.scheme == "digest")
    data = encode(CLIENTS, {"admins": ids})
    if zk.get(CLIENTS)[0] != data:
        zk.set(CLIENTS, data)


def _published_admins(zk: KazooClient, principals: set[Id]) -> set[Id]:
    """The admin ids ``/clients``' data names, kept only where its ACL agrees."""
    try:
        document = decode(CLIENTS, zk.get(CLIENTS)[0])
    except DecodeError:
        return set()
    listed = document.get("admins")
    if not isinstance(listed, list):
        return set()
    ids = {Id("digest", i) for i in listed if isinstance(i, str) and i.count(":") == 1}
    return {i for i in ids if principal(i) in principals}


def ensure_clients_node(zk: KazooClient, service: str) -> None:
    """Create ``/clients/<service>`` with :func:`clients_service_acl` unless it exists.

    Raises :class:`~sentinel.errors.AccessDenied` naming the node and the rights it takes when
    this session may not create it (kazoo's ``NoAuthError``, translated as everywhere by
    :mod:`sentinel.zk.errors`), or cannot tell who its admins are.
    """
    path = f"{CLIENTS}/{service}"
    if zk.exists(path) is not None:
        return
    try:
        acl = clients_service_acl(zk)
        if acl is None:  # nobody could repair it: leave it to `sentinel init --secure`
            raise AccessDenied(
                f"{path} is missing and this identity cannot tell who administers it: the "
                f"ACL of {CLIENTS} shows its admins only to them and its data lists none; an "
                "admin's `sentinel init --secure` creates it"
            )
        with contextlib.suppress(NodeExistsError):
            zk.create(path, acl=acl)
    except NoAuthError as exc:
        raise translate(
            exc,
            f"creating {path}, which takes the READ and CREATE rights on {CLIENTS} (a "
            "publisher's or an admin's identity has them; `sentinel init --secure` creates "
            "it too)",
        ) from exc
