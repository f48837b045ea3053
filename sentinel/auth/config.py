"""Which key ring a client opens its credentials with, and whose signature they must carry.

:class:`AuthConfig` groups the settings of a client's end of the authentication manager
(``docs/auth.md``) as one validated, frozen value::

    Sentinel(hosts, "billing-api-7", auth=AuthConfig(keys="/etc/billing/keys.json",
                                                     client="billing-api"))

It holds the key ring's path (or the loaded :class:`~sentinel.auth.keys.ClientKeyring`, whose
repr names key ids only), never a decrypted credential.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sentinel import validation as check
from sentinel.auth.keys import ClientKeyring, verify_key
from sentinel.registry.layout import validate_name


@dataclass(frozen=True)
class AuthConfig:
    """A client's credential settings; each is checked here, a wrong one raising
    :class:`~sentinel.errors.ValidationError` naming it.

    Attributes
    ----------
    keys : ClientKeyring or path or None, default ``$SENTINEL_AUTH_KEY_FILE`` or ``_KEY``
        This client's key ring (:class:`~sentinel.auth.keys.ClientKeyring` or its file). With
        one, the client publishes its public keys and every endpoint carries its decrypted
        credential in ``auth``.
    client : str or None, default None (the client id)
        The identity credentials are encrypted to: the processes of one application share it
        and its key ring, each with a client id of its own, and a rotation waits for all.
    signer : str or None, default ``$SENTINEL_AUTH_SIGNER``
        The manager's public key text: credentials it did not sign are rejected.
    require_signed : bool or None, default None
        Whether a client with a key ring must have ``signer``: None when the namespace is
        secured (checked at start), True always, False never. One that must and has none
        fails at start with :class:`~sentinel.errors.SigningRequired`.
    """

    keys: ClientKeyring | str | os.PathLike[str] | None = None
    client: str | None = None
    signer: str | None = None
    require_signed: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.keys, ClientKeyring):
            check.path("keys", self.keys)
        if self.client is not None:
            validate_name("auth client", self.client)
        check.instance("signer", self.signer, str)
        if self.signer:  # given, it must be a key even while no key ring uses it
            verify_key(self.signer)
        check.flag("require_signed", self.require_signed, optional=True)
