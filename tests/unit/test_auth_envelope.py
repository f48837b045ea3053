"""Sealing and opening credentials: every way an envelope can be wrong fails typed and quiet."""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature

from sentinel.auth.envelope import (
    SIGNATURE_CONTEXT,
    SUITE_NAME,
    Credential,
    info,
    open_envelope,
    seal,
    signed_message,
    validate_credential,
)
from sentinel.auth.keys import ClientKeyring, ManagerKey, b64, unb64, verify_key
from sentinel.auth.reader import CredentialReader
from sentinel.auth.store import AuthRecord
from sentinel.errors import DecodeError, EnvelopeError, KeyFileError, ValidationError

SECRET = "correct-horse-battery-staple"
# Which check refused an envelope (EnvelopeError's message says which).
NOT_AUTHENTIC = "the ciphertext does not authenticate"
KEY_NOT_HELD = "which this client does not hold"
NOT_SIGNED = "not signed by the trusted manager key"
REPLAY = "which this client applied already"
CONTEXT = {"namespace": "/prod", "service": "billing-db", "client": "billing-api"}
PATH = "/auth/billing-db/billing-api"


@pytest.fixture
def ring() -> ClientKeyring:
    return ClientKeyring.generate()


def sealed(ring: ClientKeyring, version: int = 1, **overrides: object) -> dict:
    context = {**CONTEXT, "version": version, **overrides}
    return seal({"user": "billing", "password": SECRET}, ring.published("x").keys[0], **context)


def opened(envelope: dict, ring: ClientKeyring, **overrides: object) -> Credential:
    return open_envelope(envelope, ring, **{**CONTEXT, "path": PATH, **overrides})


def test_round_trip(ring: ClientKeyring) -> None:
    credential = opened(sealed(ring, version=7), ring)
    assert dict(credential) == {"user": "billing", "password": SECRET}
    assert credential.version == 7
    assert SECRET not in repr(credential) and "password" in repr(credential)


def test_tampered_ciphertext_fails(ring: ClientKeyring) -> None:
    envelope = sealed(ring)
    raw = bytearray(unb64(envelope["ct"], "ct"))
    raw[40] ^= 1
    with pytest.raises(EnvelopeError, match=NOT_AUTHENTIC) as caught:
        opened({**envelope, "ct": b64(bytes(raw))}, ring)
    assert SECRET not in str(caught.value)


def test_another_clients_key_cannot_open_it(ring: ClientKeyring) -> None:
    other = ClientKeyring.generate()
    envelope = sealed(ring)
    named = f"{re.escape(repr(envelope['key_id']))}, {KEY_NOT_HELD}"
    with pytest.raises(EnvelopeError, match=named):
        opened(envelope, other)
    # Even claiming the other key's id, the wrong private key fails authentication.
    with pytest.raises(EnvelopeError, match=NOT_AUTHENTIC):
        opened({**envelope, "key_id": other.key_ids[0]}, other)


@pytest.mark.parametrize(
    "moved",
    [{"service": "other-db"}, {"client": "intruder"}, {"namespace": "/staging"}],
    ids=["another-service", "another-client", "another-namespace"],
)
def test_envelope_moved_to_another_node_fails(ring: ClientKeyring, moved: dict) -> None:
    with pytest.raises(EnvelopeError, match=NOT_AUTHENTIC):
        opened(sealed(ring), ring, **moved)


def test_version_is_bound(ring: ClientKeyring) -> None:
    with pytest.raises(EnvelopeError, match=NOT_AUTHENTIC):
        opened({**sealed(ring, version=1), "version": 2}, ring)


@pytest.mark.parametrize("cut", [1, 10, 40])
def test_truncated_json_is_a_decode_error(ring: ClientKeyring, cut: int) -> None:
    data = AuthRecord("billing-db", "billing-api", (sealed(ring),)).to_bytes(PATH)
    with pytest.raises(DecodeError):
        AuthRecord.from_bytes("billing-db", "billing-api", PATH, data[:-cut])


@pytest.mark.parametrize(
    "broken",
    [
        {"ct": 42},
        {"ct": "not base64 !!"},
        {"suite": "RSA-OAEP"},
        {"version": "1"},
        {"version": 0},
        {"key_id": None},
    ],
)
def test_malformed_envelopes_are_decode_errors(ring: ClientKeyring, broken: dict) -> None:
    with pytest.raises(DecodeError):
        opened({**sealed(ring), **broken}, ring)


def test_record_refuses_a_node_written_for_another_client(ring: ClientKeyring) -> None:
    data = AuthRecord("billing-db", "intruder", (sealed(ring),)).to_bytes(PATH)
    with pytest.raises(DecodeError, match="another service or client"):
        AuthRecord.from_bytes("billing-db", "billing-api", PATH, data)


def test_record_requires_newest_first(ring: ClientKeyring) -> None:
    data = AuthRecord("billing-db", "billing-api", (sealed(ring, 1), sealed(ring, 2))).to_bytes(
        PATH
    )
    with pytest.raises(DecodeError, match="newest first"):
        AuthRecord.from_bytes("billing-db", "billing-api", PATH, data)


def test_signed_envelopes(ring: ClientKeyring) -> None:
    manager, impostor = ManagerKey.generate(), ManagerKey.generate()
    trusted = verify_key(manager.public_text)
    good = sealed(ring, signer=manager)
    assert opened(good, ring, trusted_signer=trusted)["password"] == SECRET
    with pytest.raises(EnvelopeError, match=NOT_SIGNED):
        opened(sealed(ring), ring, trusted_signer=trusted)  # unsigned
    with pytest.raises(EnvelopeError, match=NOT_SIGNED):
        opened(sealed(ring, signer=impostor), ring, trusted_signer=trusted)
    with pytest.raises(EnvelopeError, match=NOT_SIGNED):
        opened(
            {**good, "key_id": good["key_id"], "version": 1, "ct": sealed(ring)["ct"]},
            ring,
            trusted_signer=trusted,
        )  # a signature moved onto another ciphertext


@pytest.mark.parametrize(
    "changed",
    [{"created_at": 1795326002.5}, {"created_at": 0}, {"key_id": "newer"}],
    ids=["created_at", "created_at-zero", "key_id"],
)
def test_a_signature_does_not_survive_a_changed_field(ring: ClientKeyring, changed: dict) -> None:
    manager = ManagerKey.generate()
    ring = ring.with_new_key()  # two keys: the envelope can claim the other one
    recipient = ring.published("x").keys[1]
    good = seal(
        {"password": SECRET}, recipient, **CONTEXT, version=1, signer=manager, created_at=10.0
    )
    trusted = verify_key(manager.public_text)
    assert opened(good, ring, trusted_signer=trusted)["password"] == SECRET
    if changed.get("key_id") == "newer":
        changed = {"key_id": ring.key_ids[0]}
    with pytest.raises(EnvelopeError, match=NOT_SIGNED) as caught:
        opened({**good, **changed}, ring, trusted_signer=trusted)
    assert SECRET not in str(caught.value)
    # A changed suite is refused before the signature is even looked at.
    with pytest.raises(DecodeError):
        opened({**good, "suite": "DHKEM-P256/HKDF-SHA256/AES128GCM"}, ring, trusted_signer=trusted)


def test_the_signed_message_binds_each_field_behind_a_versioned_context() -> None:
    manager = ManagerKey.generate()
    trusted = verify_key(manager.public_text)
    fields = {
        "context": info("/prod", "billing-db", "billing-api", 2),
        "key_id": "9f2c51d0e8a1b7c4",
        "suite": SUITE_NAME,
        "created_at": 1795326002.68,
        "ciphertext": b"\x01" * 48,
    }
    signature = manager.sign(signed_message(**fields))
    trusted.verify(signature, signed_message(**fields))
    for name, other in (
        ("context", info("/prod", "billing-db", "billing-api", 1)),
        ("key_id", "9f2c51d0e8a1b7c5"),
        ("suite", "another suite"),
        ("created_at", 1795326002.69),
        ("ciphertext", b"\x01" * 47),
    ):
        with pytest.raises(InvalidSignature):
            trusted.verify(signature, signed_message(**{**fields, name: other}))
    assert signed_message(**fields).startswith(len(SIGNATURE_CONTEXT).to_bytes(4, "big"))
    assert SIGNATURE_CONTEXT.endswith(b"/2")


def test_a_signature_of_the_old_format_does_not_verify(ring: ClientKeyring) -> None:
    manager = ManagerKey.generate()
    envelope = sealed(ring)
    context = info(CONTEXT["namespace"], CONTEXT["service"], CONTEXT["client"], 1)
    # Format 1 signed info, the key id and the ciphertext, joined by NUL bytes.
    old = b"\0".join((context, envelope["key_id"].encode(), unb64(envelope["ct"], "ct")))
    forged = {**envelope, "signer": manager.id, "sig": b64(manager.sign(old))}
    with pytest.raises(EnvelopeError, match=NOT_SIGNED):
        opened(forged, ring, trusted_signer=verify_key(manager.public_text))


def test_the_reader_never_goes_back_to_an_older_version(ring: ClientKeyring) -> None:
    reader = CredentialReader(ring, "/prod", "billing-api")

    def node(*versions: int) -> bytes:
        envelopes = tuple(sealed(ring, version=v) for v in versions)
        return AuthRecord("billing-db", "billing-api", envelopes).to_bytes(PATH)

    v1_only = node(1)
    credential, errors = reader.newest("billing-db", PATH, node(2, 1))  # a rotation: both live
    assert (credential.version, errors) == (2, [])
    kept, errors = reader.newest("billing-db", PATH, v1_only)  # v1 written back: a replay
    assert kept is credential
    assert [type(e) for e in errors] == [EnvelopeError] and REPLAY in str(errors[0])
    assert "keeping v2" in str(errors[0]) and SECRET not in str(errors[0])
    newer, errors = reader.newest("billing-db", PATH, node(3))
    assert (newer.version, errors) == (3, [])
    assert reader.highest_versions() == {"billing-db": 3}

    # The floor outlives the node (and comes back from the last-known-good snapshot).
    restarted = CredentialReader(ring, "/prod", "billing-api")
    restarted.restore_highest({"billing-db": 2})
    nothing, errors = restarted.newest("billing-db", PATH, v1_only)
    assert nothing is None and [type(e) for e in errors] == [EnvelopeError]
    assert REPLAY in str(errors[0])
    reader.forget("billing-db")
    nothing, errors = reader.newest("billing-db", PATH, node(2))
    assert nothing is None and [type(e) for e in errors] == [EnvelopeError]
    assert REPLAY in str(errors[0])


def test_a_reader_told_to_refuse_everything_refuses_everything(ring: ClientKeyring) -> None:
    reader = CredentialReader(ring, "/prod", "billing-api")
    reader.refuse_all("refused: the namespace requires signed credentials")
    data = AuthRecord("billing-db", "billing-api", (sealed(ring),)).to_bytes(PATH)
    credential, errors = reader.newest("billing-db", PATH, data)
    assert credential is None and [type(e) for e in errors] == [EnvelopeError]
    assert "refused: the namespace requires signed credentials" in str(errors[0])


def test_reader_takes_the_newest_it_can_open_and_reports_the_rest(
    ring: ClientKeyring, caplog: pytest.LogCaptureFixture
) -> None:
    stranger = ClientKeyring.generate()
    record = AuthRecord(
        "billing-db",
        "billing-api",
        (
            seal({"password": "unreadable"}, stranger.published("x").keys[0], **CONTEXT, version=3),
            sealed(ring, version=2),
        ),
    )
    reader = CredentialReader(ring, "/prod", "billing-api")
    credential, errors = reader.newest("billing-db", PATH, record.to_bytes(PATH))
    assert credential is not None and credential.version == 2
    assert [type(e) for e in errors] == [EnvelopeError] and KEY_NOT_HELD in str(errors[0])
    # Opened once per version: a second read of the same node decrypts nothing new.
    again, _ = reader.newest("billing-db", PATH, record.to_bytes(PATH))
    assert again is credential


def test_invalid_credentials_are_refused_without_echoing_values(ring: ClientKeyring) -> None:
    recipient = ring.published("x").keys[0]
    for bad in ({}, {"password": [SECRET]}, {"password": float("nan")}, {"x": SECRET * 500}):
        with pytest.raises(ValidationError) as caught:
            seal(bad, recipient, **CONTEXT, version=1)
        assert SECRET not in str(caught.value)


def test_no_secret_in_logs_or_reprs(ring: ClientKeyring, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    private_texts = ring.dumps()
    envelope = sealed(ring)
    for attempt in ({**envelope, "client": "x"}, envelope):
        try:
            opened(attempt, ring, client="intruder")
        except EnvelopeError as exc:
            assert NOT_AUTHENTIC in str(exc)
            logging.getLogger("test").warning("%s", exc)
    assert SECRET not in caplog.text
    for held in (repr(ring), repr(opened(envelope, ring)), str(ManagerKey.generate())):
        assert SECRET not in held and "x25519" not in held
    assert all(part not in repr(ring) for part in private_texts.split('"') if len(part) > 20)


def test_key_ring_file_is_private_and_round_trips(tmp_path: Path, ring: ClientKeyring) -> None:
    path = tmp_path / "client.keys"
    ring.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    loaded = ClientKeyring.load(path)
    assert loaded.key_ids == ring.key_ids
    assert opened(sealed(ring), loaded)["password"] == SECRET
    assert ClientKeyring.from_env({"SENTINEL_AUTH_KEY": ring.dumps()}).key_ids == ring.key_ids
    assert ClientKeyring.from_env({"SENTINEL_AUTH_KEY_FILE": str(path)}).key_ids == ring.key_ids
    assert ClientKeyring.from_env({}) is None


def test_key_rotation_keeps_old_envelopes_readable(ring: ClientKeyring) -> None:
    old_envelope = sealed(ring)
    rotated = ring.with_new_key()
    assert rotated.key_ids[1:] == ring.key_ids
    assert opened(old_envelope, rotated)["password"] == SECRET
    new_envelope = sealed(rotated)  # encrypted to the newest key
    assert new_envelope["key_id"] == rotated.key_ids[0]
    trimmed = rotated.without(ring.key_ids[0])
    with pytest.raises(EnvelopeError, match=KEY_NOT_HELD):
        opened(old_envelope, trimmed)


@pytest.mark.parametrize(
    "content", ["", "{", '{"kind": "other"}', '{"kind": "sentinel-client-keys", "x25519": ["AA"]}']
)
def test_bad_key_files_are_key_file_errors(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.keys"
    path.write_text(content)
    with pytest.raises(KeyFileError):
        ClientKeyring.load(path)


def test_missing_key_file(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read"):
        ClientKeyring.load(tmp_path / "absent")


def test_credential_is_immutable() -> None:
    credential = Credential(1, {"user": "u"})
    with pytest.raises(TypeError):
        credential._values["user"] = "x"  # type: ignore[index]


@pytest.mark.parametrize(
    "credential",
    [{"password": 10**400}, {"password": 10**5000}, {"password": float("nan")}, {"n": 1e308 * 10}],
)
def test_credentials_readers_would_refuse_are_validation_errors(credential: dict) -> None:
    """Issue 16: nothing a client cannot decode is sealed; the error names no value."""
    with pytest.raises(ValidationError) as caught:
        validate_credential(credential)
    assert "10000" not in str(caught.value)
