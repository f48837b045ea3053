"""Sealing one credential to one client, and opening it (HPKE, RFC 9180).

The suite is DHKEM(X25519, HKDF-SHA256), HKDF-SHA256 and ChaCha20-Poly1305, in HPKE's base
mode. Its ``info`` binds the namespace, service, client id and credential version, so a
ciphertext copied to another node, client, namespace or version no longer decrypts. An
envelope is a JSON object::

    {"version": 3, "key_id": "9f2c...", "suite": "...", "ct": "<base64>", "created_at": ...,
     "signer": "41aa...", "sig": "<base64>"}

``signer``/``sig`` are present when the authentication manager signs: Ed25519 over
:func:`signed_message`, which binds every field a client acts on (the ``info`` above, so the
namespace, service, client and version; the key id, suite, ``created_at`` and ciphertext),
behind the context string :data:`SIGNATURE_CONTEXT`. A client that trusts a manager key rejects
envelopes without a valid signature. Errors name the service, client, version and key id,
never secret material.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from sentinel.auth.keys import ClientKeyring, ManagerKey, PublicKey, b64, unb64
from sentinel.errors import DecodeError, EnvelopeError, ValidationError
from sentinel.registry.records import MAX_AUTH_VERSION, parse_json, to_json

SUITE_NAME = "DHKEM-X25519-HKDF-SHA256/HKDF-SHA256/ChaCha20Poly1305"
SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
MAX_FIELDS = 32
MAX_CREDENTIAL_BYTES = 4096
# Versioned: a signature of another format (version 1 signed info, key id and ciphertext only,
# leaving created_at and the suite open to change) does not verify under this one.
SIGNATURE_CONTEXT = b"sentinel-auth-signature/2"


class Credential(Mapping[str, Any]):
    """A decrypted credential: a read-only mapping (``user``, ``password``, ...) and its version.

    Its repr lists the field names only, so logging an :class:`~sentinel.Endpoint` or a
    credential never shows a secret. ``envelope`` is the encrypted form it was opened from (safe
    to store: the last-known-good snapshot keeps it instead of the secret).
    """

    __slots__ = ("_values", "created_at", "envelope", "version")

    def __init__(
        self,
        version: int,
        values: Mapping[str, Any],
        created_at: float = 0.0,
        envelope: Mapping[str, Any] | None = None,
    ) -> None:
        self.version = version
        self.created_at = created_at
        self.envelope = None if envelope is None else MappingProxyType(dict(envelope))
        self._values = MappingProxyType(dict(values))

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Credential):
            return self.version == other.version and self._values == other._values
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.version)

    def __repr__(self) -> str:
        return f"Credential(version={self.version}, fields={sorted(self._values)})"


def validate_credential(values: object) -> dict[str, Any]:
    """A small JSON object of strings, numbers, booleans and nulls, or ValidationError."""
    if not isinstance(values, Mapping) or not values:
        raise ValidationError("a credential must be a non-empty mapping such as {'user': ...}")
    if len(values) > MAX_FIELDS:
        raise ValidationError(f"a credential has at most {MAX_FIELDS} fields, got {len(values)}")
    for name, value in values.items():
        if not isinstance(name, str) or not 0 < len(name) <= 128:
            raise ValidationError("credential field names are strings of 1-128 characters")
        if not (value is None or isinstance(value, str | bool | int | float)):
            # Only the field's name and type: the value may be the secret itself.
            raise ValidationError(
                f"credential field {name!r} must be text, a number, a boolean or null, "
                f"not {type(value).__name__}"
            )
    plain = dict(values)
    # The readers' bounds (no NaN, no float overflow, at most 300 digits): a credential its
    # clients would refuse is refused here, before it is sealed.
    if len(to_json("credential", plain)) > MAX_CREDENTIAL_BYTES:
        raise ValidationError(f"a credential is at most {MAX_CREDENTIAL_BYTES} bytes as JSON")
    return plain


def info(namespace: str, service: str, client: str, version: int) -> bytes:
    """HPKE ``info``: what a ciphertext is bound to."""
    return f"sentinel-auth/1\0{namespace}\0{service}\0{client}\0{version}".encode()


def signed_message(
    context: bytes, key_id: str, suite: str, created_at: float, ciphertext: bytes
) -> bytes:
    """What the manager signs: :data:`SIGNATURE_CONTEXT`, the HPKE ``info`` (``context``), the
    key id, the suite, ``created_at`` (as ``repr(float)``) and the ciphertext, each preceded by
    its length (4 bytes, big-endian), so no field can borrow bytes from its neighbour."""
    fields = (
        SIGNATURE_CONTEXT,
        context,
        key_id.encode(),
        suite.encode(),
        repr(float(created_at)).encode(),
        ciphertext,
    )
    return b"".join(len(field).to_bytes(4, "big") + field for field in fields)


def _created_at(envelope: Mapping[str, Any]) -> float:
    """The envelope's ``created_at``: a finite number (0 when absent), or ValidationError."""
    value = envelope.get("created_at", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError("created_at is not a number")
    created_at = float(value)
    if not math.isfinite(created_at):
        raise ValidationError("created_at is not finite")
    return created_at


def seal(
    values: Mapping[str, Any],
    recipient: PublicKey,
    *,
    namespace: str,
    service: str,
    client: str,
    version: int,
    signer: ManagerKey | None = None,
    created_at: float | None = None,
) -> dict[str, Any]:
    """Encrypt ``values`` to ``recipient`` for (namespace, service, client, version)."""
    plaintext = json.dumps(validate_credential(values), separators=(",", ":")).encode()
    context = info(namespace, service, client, version)
    ciphertext = SUITE.encrypt(plaintext, recipient.key, info=context)
    created_at = time.time() if created_at is None else created_at
    envelope: dict[str, Any] = {
        "version": version,
        "key_id": recipient.id,
        "suite": SUITE_NAME,
        "ct": b64(ciphertext),
        "created_at": created_at,
    }
    if signer is not None:
        message = signed_message(context, recipient.id, SUITE_NAME, created_at, ciphertext)
        envelope["signer"] = signer.id
        envelope["sig"] = b64(signer.sign(message))
    return envelope


def envelope_version(envelope: object, path: str) -> int:
    """The version of an envelope read from ``path``; DecodeError if it has none (or one
    above :data:`~sentinel.registry.records.MAX_AUTH_VERSION`, which no manager issues)."""
    version = envelope.get("version") if isinstance(envelope, dict) else None
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or not 1 <= version <= MAX_AUTH_VERSION
    ):
        raise DecodeError(
            path, f"an envelope without an integer version from 1 to {MAX_AUTH_VERSION}"
        )
    return version


def open_envelope(
    envelope: Mapping[str, Any],
    keyring: ClientKeyring,
    *,
    namespace: str,
    service: str,
    client: str,
    path: str,
    trusted_signer: Ed25519PublicKey | None = None,
) -> Credential:
    """Decrypt one envelope read from ``path``.

    Raises :class:`~sentinel.errors.DecodeError` (malformed) or
    :class:`~sentinel.errors.EnvelopeError` (encrypted to a key not held, not signed by the
    trusted manager, or tampered, another key, moved: the message says which).
    """
    version = envelope_version(envelope, path)
    what = f"credential v{version} for client {client!r} of service {service!r} at {path}"
    try:
        key_id = envelope["key_id"]
        ciphertext = unb64(envelope["ct"], "ct")
        if not isinstance(key_id, str) or envelope["suite"] != SUITE_NAME:
            raise ValidationError("unsupported suite or key id")
        created_at = _created_at(envelope)
    except (KeyError, ValidationError, TypeError, ValueError, OverflowError) as exc:
        raise DecodeError(path, f"malformed envelope ({type(exc).__name__})") from None
    private = keyring.private_key(key_id)
    if private is None:
        raise EnvelopeError(f"{what}: encrypted to key {key_id!r}, which this client does not hold")
    context = info(namespace, service, client, version)
    if trusted_signer is not None:
        try:
            signature = unb64(envelope["sig"], "sig")
            message = signed_message(context, key_id, SUITE_NAME, created_at, ciphertext)
            trusted_signer.verify(signature, message)
        except (KeyError, ValidationError, InvalidSignature):
            raise EnvelopeError(f"{what}: not signed by the trusted manager key") from None
    try:
        plaintext = SUITE.decrypt(ciphertext, private, info=context)
    except InvalidTag:
        raise EnvelopeError(
            f"{what}: the ciphertext does not authenticate (tampered, another key, or copied "
            "from another node)"
        ) from None
    try:
        values = validate_credential(parse_json(path, plaintext))
    except (DecodeError, ValidationError):
        raise DecodeError(path, "the decrypted credential is not a JSON object of fields") from None
    return Credential(version, values, created_at, envelope)
