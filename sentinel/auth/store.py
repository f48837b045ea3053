"""The ``/auth`` nodes: a client's live credentials for a service, and its public keys.

``/auth/<service>/<client>`` holds one JSON document whose ``credentials`` list is newest
first; it has one entry normally and two (new, old) while a rotation waits for confirmation.
Every write is a compare-and-set on the node's version, so two managers never lose each
other's changes. Everything read here is checked: a node another program wrote may be
anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
)

from sentinel.auth.envelope import envelope_version
from sentinel.auth.keys import ClientKeyring, PublishedKeys
from sentinel.errors import (
    ClientKeyNotFound,
    ClientNotEnrolled,
    DecodeError,
    RegistryConflict,
    ValidationError,
)
from sentinel.registry.layout import AUTH_KEYS, auth_keys_path, auth_path
from sentinel.registry.records import MAX_AUTH_VERSION, decode, encode, fields_of
from sentinel.suggestions import did_you_mean, likely_typos

MAX_LIVE_CREDENTIALS = 4
_CAS_ATTEMPTS = 5


@dataclass(frozen=True)
class AuthRecord:
    """The decoded ``/auth/<service>/<client>`` node: envelopes, newest first."""

    service: str
    client: str
    envelopes: tuple[dict[str, Any], ...]

    @property
    def versions(self) -> tuple[int, ...]:
        """The live credential versions, newest first."""
        return tuple(e["version"] for e in self.envelopes)

    def to_bytes(self, path: str) -> bytes:
        """The node's value."""
        return encode(
            path,
            {"service": self.service, "client": self.client, "credentials": list(self.envelopes)},
        )

    @classmethod
    def from_bytes(cls, service: str, client: str, path: str, data: bytes | None) -> AuthRecord:
        """Decode and check the node; versions must be distinct and newest first."""
        document = decode(path, data)
        with fields_of(path):
            envelopes = document["credentials"]
            if not isinstance(envelopes, list) or not 0 < len(envelopes) <= MAX_LIVE_CREDENTIALS:
                raise ValidationError(
                    f"credentials must be a list of 1-{MAX_LIVE_CREDENTIALS} envelopes"
                )
            versions = [envelope_version(e, path) for e in envelopes]
            if versions != sorted(set(versions), reverse=True):
                raise ValidationError("credential versions are not distinct and newest first")
            if (document["service"], document["client"]) != (service, client):
                raise ValidationError("written for another service or client (moved node?)")
        return cls(service, client, tuple(envelopes))


def read_auth(zk: KazooClient, service: str, client: str) -> tuple[AuthRecord | None, int]:
    """The node and its version (-1 when it does not exist: create it instead)."""
    path = auth_path(service, client)
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return None, -1
    return AuthRecord.from_bytes(service, client, path, data), stat.version


def write_auth(zk: KazooClient, record: AuthRecord, expected_version: int) -> None:
    """Write the node if it is still at ``expected_version``; BadVersionError otherwise."""
    path = auth_path(record.service, record.client)
    data = record.to_bytes(path)
    if expected_version < 0:
        try:
            zk.create(path, data, makepath=True)
        except NodeExistsError:
            raise BadVersionError() from None
    else:
        zk.set(path, data, version=expected_version)


def change_auth(zk: KazooClient, service: str, client: str, change: Any) -> AuthRecord | None:
    """Apply ``change(record | None) -> record | None`` with compare-and-set retries.

    ``change`` returning None deletes the node. Returns the record written.
    """
    path = auth_path(service, client)
    for _ in range(_CAS_ATTEMPTS):
        try:
            current, version = read_auth(zk, service, client)
        except DecodeError:
            # An unreadable node is replaced, not merged: nothing in it can be used anyway.
            current, version = None, zk.exists(path).version
        new = change(current)
        try:
            if new is None:
                if version >= 0:
                    zk.delete(path, version=version)
            else:
                write_auth(zk, new, version)
        except (BadVersionError, NoNodeError):
            continue
        return new
    raise RegistryConflict(f"{path} kept changing during {_CAS_ATTEMPTS} attempts")


def read_issued(zk: KazooClient, service: str, client: str) -> int:
    """The highest version the manager ever issued for (service, client), 0 if none recorded.

    Kept by the manager alone (:func:`record_issued`) in the data of ``/auth/<service>``,
    which only the auth manager and the admin may write, apart from the client's own node:
    rewriting that node with an old credential, or deleting it, does not lower it, and
    nothing a client writes (its ``/clients`` confirmation) moves it. Entries that are not
    integers from 1 to :data:`~sentinel.registry.records.MAX_AUTH_VERSION` are ignored.
    """
    return _version_or_zero(_read_issued(zk, service)[0].get(client))


def record_issued(zk: KazooClient, service: str, client: str, version: int) -> None:
    """Raise the recorded highest version issued for (service, client) to ``version``
    (compare-and-set; never lowers it). ``/auth/<service>`` exists: the client's node was
    just written below it."""
    path = _service_path(service)
    for _ in range(_CAS_ATTEMPTS):
        issued, node_version = _read_issued(zk, service)
        if _version_or_zero(issued.get(client)) >= version:
            return
        issued[client] = version
        try:
            zk.set(path, encode(path, {"issued": issued}), version=node_version)
        except BadVersionError:
            continue
        return
    raise RegistryConflict(f"{path} kept changing during {_CAS_ATTEMPTS} attempts")


def _version_or_zero(value: object) -> int:
    valid = isinstance(value, int) and not isinstance(value, bool)
    return value if valid and 1 <= value <= MAX_AUTH_VERSION else 0  # type: ignore[return-value]


def _service_path(service: str) -> str:
    return auth_path(service, "-").rpartition("/")[0]


def _read_issued(zk: KazooClient, service: str) -> tuple[dict[str, Any], int]:
    """``/auth/<service>``'s ``issued`` map and the node's version; empty when unreadable."""
    path = _service_path(service)
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return {}, -1
    try:
        issued = decode(path, data).get("issued")
    except DecodeError:
        issued = None
    return (dict(issued) if isinstance(issued, dict) else {}), stat.version


def read_public_keys(zk: KazooClient, client: str) -> PublishedKeys:
    """The client's published public keys; ClientKeyNotFound if it has none."""
    path = auth_keys_path(client)
    meant: tuple[str, ...] = ()
    try:
        data, _ = zk.get(path)
    except NoNodeError:
        data = b""
        meant = likely_typos(client, _clients_with_keys(zk))
    if meant:  # a typo of a client that has keys: publishing keys under it would keep it
        raise ClientKeyNotFound(
            f"client {client!r} has published no public key at {path}; {did_you_mean(meant)}"
        )
    if not data:  # an enrolled slot stays empty until its client publishes
        raise ClientKeyNotFound(
            f"client {client!r} has published no public key at {path}: start it with a key "
            "ring (Sentinel(auth=AuthConfig(keys=...))) or run 'sentinel auth keygen --publish'"
        )
    return PublishedKeys.from_bytes(client, path, data)


def _clients_with_keys(zk: KazooClient) -> list[str]:
    """The clients with a key slot (for an error's suggestions); none when unreadable."""
    try:
        return zk.get_children(AUTH_KEYS)
    except KazooException:
        return []


def publish_public_keys(zk: KazooClient, client: str, keyring: ClientKeyring) -> bool:
    """Publish the ring's public keys unless they are there already; True if written.

    In a secured namespace only the identity the admin enrolled for ``client`` may write its
    key slot: anyone else gets :class:`~sentinel.errors.ClientNotEnrolled`.
    """
    try:
        return _publish(zk, client, keyring)
    except NoAuthError:
        raise ClientNotEnrolled(
            f"this identity may not publish keys at {auth_keys_path(client)}: the admin "
            f"enrols the client for it with `sentinel auth enroll {client}`"
        ) from None


def _publish(zk: KazooClient, client: str, keyring: ClientKeyring) -> bool:
    path = auth_keys_path(client)
    published = keyring.published(client)
    data = published.to_bytes(path)
    try:
        current, stat = zk.get(path)
    except NoNodeError:
        try:
            zk.create(path, data, makepath=True)
        except NodeExistsError:
            return _publish(zk, client, keyring)
        return True
    try:
        if current and PublishedKeys.from_bytes(client, path, current) == published:
            return False
    except DecodeError:
        pass  # replaced below
    zk.set(path, data, version=stat.version)
    return True
