"""Client key rings and the public keys they publish.

Each client id holds one or more X25519 key pairs, newest first. The private halves stay in a
key file (mode 0600) or an environment variable and never reach ZooKeeper, a log or a repr;
the public halves are published under ``/auth/.keys/<client>`` for the authentication manager,
which encrypts new credentials to the newest one. Holding two keys lets the key itself rotate:
add a key (``sentinel auth keygen --add``), let the manager re-encrypt, then drop the old one.

The authentication manager may sign what it publishes with an Ed25519 :class:`ManagerKey`
(``$SENTINEL_AUTH_SIGNING_KEY_FILE`` names its file for the CLI); clients given its public
half (``AuthConfig(signer=...)`` or ``$SENTINEL_AUTH_SIGNER``) reject credentials it did not
sign. In a secured namespace both are required.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from sentinel.errors import KeyFileError, ValidationError
from sentinel.private_files import read_secret_file, write_secret_file
from sentinel.registry.records import decode, encode, fields_of

KEY_FILE_ENV = "SENTINEL_AUTH_KEY_FILE"
KEY_ENV = "SENTINEL_AUTH_KEY"
SIGNER_ENV = "SENTINEL_AUTH_SIGNER"  # the manager's public key text, for clients
SIGNING_KEY_FILE_ENV = "SENTINEL_AUTH_SIGNING_KEY_FILE"  # the manager's signing key file
MAX_KEYS = 4
_KEY_RING_KIND = "sentinel-client-keys"
_MANAGER_KIND = "sentinel-manager-key"


def b64(raw: bytes) -> str:
    """Unpadded URL-safe base64, as stored in every ``/auth`` document."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def unb64(text: object, what: str) -> bytes:
    """Decode :func:`b64` text; raise ValidationError (a DecodeError in readers) if it is not."""
    if not isinstance(text, str):
        raise ValidationError(f"{what} must be base64 text, got {type(text).__name__}")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        raise ValidationError(f"{what} is not base64") from None


def key_id(public_raw: bytes) -> str:
    """A short, stable name for a public key: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(public_raw).hexdigest()[:16]


def _raw_public(key: X25519PublicKey | Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _raw_private(key: X25519PrivateKey | Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def _read_private(source: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    text = read_secret_file(source, "key file")
    return _parse_private(text, f"key file {os.fspath(source)!r}", kind)


def _parse_private(text: str | bytes, origin: str, kind: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except ValueError:
        raise KeyFileError(f"{origin} is not JSON") from None
    if not isinstance(document, dict) or document.get("kind") != kind:
        raise KeyFileError(f"{origin} is not a {kind} file")
    return document


@dataclass(frozen=True)
class PublicKey:
    """One published X25519 public key and its id."""

    id: str
    key: X25519PublicKey

    @classmethod
    def from_raw(cls, raw: bytes) -> PublicKey:
        """The public key of 32 raw bytes; raise ValidationError if they are not one."""
        try:
            key = X25519PublicKey.from_public_bytes(raw)
        except ValueError:
            raise ValidationError("not a 32-byte X25519 public key") from None
        return cls(key_id(raw), key)


@dataclass(frozen=True)
class PublishedKeys:
    """``/auth/.keys/<client>``: the client's public keys, newest first."""

    client: str
    keys: tuple[PublicKey, ...]

    def to_bytes(self, path: str) -> bytes:
        """The node's value."""
        return encode(
            path,
            {
                "client": self.client,
                "keys": [{"id": k.id, "x25519": b64(_raw_public(k.key))} for k in self.keys],
            },
        )

    @classmethod
    def from_bytes(cls, client: str, path: str, data: bytes | None) -> PublishedKeys:
        """Decode and check a key node; every id must match its key (nothing is trusted)."""
        document = decode(path, data)
        with fields_of(path):
            entries = document["keys"]
            if not isinstance(entries, list) or not 0 < len(entries) <= MAX_KEYS:
                raise ValidationError(f"keys must be a list of 1-{MAX_KEYS} entries")
            keys = []
            for entry in entries:
                key = PublicKey.from_raw(unb64(entry["x25519"], "x25519"))
                if entry["id"] != key.id:
                    raise ValidationError(f"key id {entry['id']!r} does not match its key")
                keys.append(key)
            if document["client"] != client:
                raise ValidationError(f"written for client {document['client']!r}")
        return cls(client, tuple(keys))


class ClientKeyring:
    """A client's X25519 private keys, newest first. Never shows them.

    Create one with :meth:`generate`, keep it with :meth:`save` (mode 0600), and give it to a
    client as ``Sentinel(auth=AuthConfig(keys=path))``, or through ``$SENTINEL_AUTH_KEY_FILE``
    (a path) or ``$SENTINEL_AUTH_KEY`` (the file's contents, for containers and Spark
    executors).
    """

    def __init__(self, private_keys: Sequence[X25519PrivateKey]) -> None:
        if not 0 < len(private_keys) <= MAX_KEYS:
            raise ValidationError(f"a key ring holds 1-{MAX_KEYS} keys, got {len(private_keys)}")
        self._keys: dict[str, X25519PrivateKey] = {}
        for private in private_keys:
            self._keys[key_id(_raw_public(private.public_key()))] = private

    def __repr__(self) -> str:
        return f"ClientKeyring(key_ids={self.key_ids})"

    @classmethod
    def generate(cls) -> ClientKeyring:
        """A new key ring with one fresh key."""
        return cls([X25519PrivateKey.generate()])

    def with_new_key(self) -> ClientKeyring:
        """This ring with a fresh key in front (the oldest dropped past the limit)."""
        return ClientKeyring([X25519PrivateKey.generate(), *self._keys.values()][:MAX_KEYS])

    def without(self, key_id_: str) -> ClientKeyring:
        """This ring without one key (after the manager has re-encrypted to the others)."""
        if key_id_ not in self._keys:
            raise ValidationError(f"key ring has no key {key_id_!r}")
        return ClientKeyring([k for i, k in self._keys.items() if i != key_id_])

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Ids of the keys held, newest first."""
        return tuple(self._keys)

    def private_key(self, key_id_: str) -> X25519PrivateKey | None:
        """The private key with this id, None if this ring does not hold it."""
        return self._keys.get(key_id_)

    def published(self, client: str) -> PublishedKeys:
        """The public halves, as published under ``/auth/.keys/<client>``."""
        return PublishedKeys(
            client,
            tuple(PublicKey(i, k.public_key()) for i, k in self._keys.items()),
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ring to ``path`` atomically, readable by its owner only."""
        write_secret_file(Path(path), self._document())

    def _document(self) -> dict[str, Any]:
        return {
            "kind": _KEY_RING_KIND,
            "v": 1,
            "x25519": [b64(_raw_private(k)) for k in self._keys.values()],
        }

    def dumps(self) -> str:
        """The ring as text, for ``$SENTINEL_AUTH_KEY`` (treat it like the key file)."""
        return json.dumps(self._document())

    @classmethod
    def _from_document(cls, document: Mapping[str, Any], origin: str) -> ClientKeyring:
        try:
            raws = [unb64(text, "private key") for text in document["x25519"]]
            return cls([X25519PrivateKey.from_private_bytes(raw) for raw in raws])
        except (KeyError, TypeError, ValueError) as exc:
            # The reason names the field, never its value.
            raise KeyFileError(
                f"{origin} holds no valid X25519 private keys ({type(exc).__name__})"
            ) from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ClientKeyring:
        """Read a ring written by :meth:`save`; raise KeyFileError if it cannot be used."""
        document = _read_private(path, _KEY_RING_KIND)
        return cls._from_document(document, f"key file {os.fspath(path)!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientKeyring | None:
        """The ring named by ``$SENTINEL_AUTH_KEY_FILE`` or held in ``$SENTINEL_AUTH_KEY``."""
        env = os.environ if env is None else env
        if env.get(KEY_FILE_ENV):
            return cls.load(env[KEY_FILE_ENV])
        if env.get(KEY_ENV):
            document = _parse_private(env[KEY_ENV], f"${KEY_ENV}", _KEY_RING_KIND)
            return cls._from_document(document, f"${KEY_ENV}")
        return None


class ManagerKey:
    """The authentication manager's Ed25519 signing key. Never shows it.

    Clients trust its :attr:`public_text` (``AuthConfig(signer=...)``) and then reject
    credentials it did not sign.
    """

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public_raw = _raw_public(private.public_key())
        self.id = key_id(self.public_raw)

    def __repr__(self) -> str:
        return f"ManagerKey(id={self.id!r})"

    @classmethod
    def generate(cls) -> ManagerKey:
        """A fresh signing key."""
        return cls(Ed25519PrivateKey.generate())

    @property
    def public_text(self) -> str:
        """The public half as base64 text, to hand to clients."""
        return b64(self.public_raw)

    def sign(self, message: bytes) -> bytes:
        """An Ed25519 signature of ``message``."""
        return self._private.sign(message)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key to ``path`` atomically, readable by its owner only."""
        write_secret_file(
            Path(path), {"kind": _MANAGER_KIND, "v": 1, "ed25519": b64(_raw_private(self._private))}
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ManagerKey:
        """Read a key written by :meth:`save`; raise KeyFileError if it cannot be used."""
        document = _read_private(path, _MANAGER_KIND)
        try:
            return cls(Ed25519PrivateKey.from_private_bytes(unb64(document["ed25519"], "key")))
        except (KeyError, ValueError):
            raise KeyFileError(f"key file {os.fspath(path)!r} holds no Ed25519 key") from None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ManagerKey | None:
        """The key in the file ``$SENTINEL_AUTH_SIGNING_KEY_FILE`` names, None when unset."""
        env = os.environ if env is None else env
        return cls.load(env[SIGNING_KEY_FILE_ENV]) if env.get(SIGNING_KEY_FILE_ENV) else None


def verify_key(public_text: str) -> Ed25519PublicKey:
    """The manager's public key from :attr:`ManagerKey.public_text`."""
    try:
        return Ed25519PublicKey.from_public_bytes(unb64(public_text, "manager public key"))
    except ValueError:
        raise ValidationError("the manager public key is not a base64 Ed25519 public key") from None


def signer_missing(client_id: str, because: str) -> str:
    """The message of :class:`~sentinel.errors.SigningRequired` for a client that has no
    manager's public key to verify signatures with."""
    return (
        f"{because}, so client {client_id!r} accepts only signed credentials and needs "
        f"the manager's public key: Sentinel(auth=AuthConfig(signer=...)) or ${SIGNER_ENV} "
        "(the text 'sentinel auth keygen --manager' printed)"
    )


__all__ = ["ClientKeyring"]
