"""The client's side of ``/auth``: the newest credential it can open, decrypted once.

Credentials only move forward: the reader remembers, per service, the highest version it has
handed out, and never hands out a lower one. When the newest envelope it can open is older
(an old credential written back over a newer one: a replay), it keeps serving the credential
it applied, which stays valid until the manager revokes it, and the manager revokes a version
only after every live client confirmed a newer one. The refusal is reported as a
:class:`~sentinel.errors.EnvelopeError` saying so (the cache logs and counts it).
"""

from __future__ import annotations

from collections.abc import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from sentinel.auth.envelope import Credential, open_envelope
from sentinel.auth.keys import ClientKeyring
from sentinel.auth.store import AuthRecord
from sentinel.errors import DecodeError, EnvelopeError


class CredentialReader:
    """Opens ``/auth/<service>/<client>`` nodes with the client's key ring.

    Decryption happens once per (service, envelope): the cache calls :meth:`newest` on every
    change of the node, and an envelope already opened is served from memory.
    """

    def __init__(
        self,
        keyring: ClientKeyring,
        namespace: str,
        client: str,
        trusted_signer: Ed25519PublicKey | None = None,
    ) -> None:
        self._keyring = keyring
        self._namespace = namespace
        self._client = client
        self._trusted_signer = trusted_signer
        self._refusal: str | None = None
        self._opened: dict[str, dict[tuple[int, str], Credential]] = {}
        # The credential handed out last per service, and the highest version ever handed out
        # (kept when the node goes, and in the last-known-good snapshot).
        self._applied: dict[str, Credential] = {}
        self._highest: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"CredentialReader(client={self._client!r}, keys={self._keyring.key_ids})"

    @property
    def client(self) -> str:
        """The identity credentials are encrypted to: ``/auth/<service>/<client>``."""
        return self._client

    @property
    def verifies_signatures(self) -> bool:
        """Whether envelopes must carry the trusted manager's signature."""
        return self._trusted_signer is not None

    def refuse_all(self, reason: str) -> None:
        """From now on refuse every envelope, giving ``reason`` (no secrets): for a client that
        must verify signatures and has no manager key to verify them with."""
        self._refusal = reason

    def highest_versions(self) -> dict[str, int]:
        """The highest credential version handed out, per service (a copy)."""
        return dict(self._highest)

    def restore_highest(self, versions: Mapping[str, int]) -> None:
        """Raise the per-service floors to ``versions`` (from a last-known-good snapshot)."""
        for service, version in versions.items():
            self._highest[service] = max(version, self._highest.get(service, 0))

    def forget(self, service: str) -> None:
        """The node is gone: nothing is served for ``service``, its floor stays."""
        self._applied.pop(service, None)
        self._opened.pop(service, None)

    def newest(
        self, service: str, path: str, data: bytes | None
    ) -> tuple[Credential | None, list[DecodeError | EnvelopeError]]:
        """The newest credential this client can open, and why newer ones could not be.

        A credential older than one handed out before is not handed out: the one handed out
        is, with an :class:`~sentinel.errors.EnvelopeError` saying so among the errors. Raises
        :class:`~sentinel.errors.DecodeError` if the node itself is malformed.
        """
        record = AuthRecord.from_bytes(service, self._client, path, data)
        opened = self._opened.get(service, {})
        errors: list[DecodeError | EnvelopeError] = []
        highest = self._highest.get(service, 0)
        for envelope in record.envelopes:
            if self._refusal is not None:
                errors.append(EnvelopeError(f"{path} v{envelope['version']}: {self._refusal}"))
                continue
            memo_key = (envelope["version"], str(envelope.get("ct")))
            credential = opened.get(memo_key)
            if credential is None:
                try:
                    credential = open_envelope(
                        envelope,
                        self._keyring,
                        namespace=self._namespace,
                        service=service,
                        client=self._client,
                        path=path,
                        trusted_signer=self._trusted_signer,
                    )
                except (DecodeError, EnvelopeError) as exc:
                    errors.append(exc)
                    continue
            if credential.version < highest:
                kept = self._applied.get(service)
                if kept is not None and kept.version < highest:
                    kept = None  # a floor restored from a snapshot above what is held
                errors.append(
                    EnvelopeError(
                        f"credential v{credential.version} for client {self._client!r} of "
                        f"service {service!r} at {path} is older than v{highest}, which this "
                        f"client applied already (a replay?); "
                        + ("serving nothing" if kept is None else f"keeping v{kept.version}")
                    )
                )
                return kept, errors
            # Only the live envelopes stay in memory: a rotation's old ones are forgotten.
            self._opened[service] = {memo_key: credential}
            self._applied[service] = credential
            self._highest[service] = credential.version
            return credential, errors
        self._applied.pop(service, None)
        return None, errors
