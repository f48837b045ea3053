"""The client's side of ``/auth``: the newest credential it can open, decrypted once."""

from __future__ import annotations

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
        self._opened: dict[str, dict[tuple[int, str], Credential]] = {}

    def __repr__(self) -> str:
        return f"CredentialReader(client={self._client!r}, keys={self._keyring.key_ids})"

    @property
    def client(self) -> str:
        """The identity credentials are encrypted to: ``/auth/<service>/<client>``."""
        return self._client

    def newest(
        self, service: str, path: str, data: bytes | None
    ) -> tuple[Credential | None, list[DecodeError | EnvelopeError]]:
        """The newest credential this client can open, and why newer ones could not be.

        Raises :class:`~sentinel.errors.DecodeError` if the node itself is malformed.
        """
        record = AuthRecord.from_bytes(service, self._client, path, data)
        opened = self._opened.get(service, {})
        errors: list[DecodeError | EnvelopeError] = []
        for envelope in record.envelopes:
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
            # Only the live envelopes stay in memory: a rotation's old ones are forgotten.
            self._opened[service] = {memo_key: credential}
            return credential, errors
        return None, errors
