"""Credential distribution: the paper's ``/auth`` section and its Procedure 2 (rotation).

An authentication manager owns each (service, client) credential, encrypts it to the client's
public key with HPKE (RFC 9180) and publishes it under ``/auth/<service>/<client>``; the client
decrypts it in its cache and hands it out in :attr:`Endpoint.auth <sentinel.Endpoint.auth>`.

- :mod:`sentinel.auth.keys`: the client's key ring (private keys stay with the client) and the
  public keys it publishes under ``/auth/.keys/<client>``;
- :mod:`sentinel.auth.envelope`: sealing and opening one credential;
- :mod:`sentinel.auth.store`: the ``/auth`` nodes, read and written defensively;
- :mod:`sentinel.auth.reader`: the client's side: the newest credential it may apply, never an
  older version than one it applied (a replay);
- :mod:`sentinel.auth.manager`: ``update_auth`` and rotation with confirmed propagation;
- :mod:`sentinel.auth.backends`: where credentials are created and revoked (a file, PostgreSQL);
- :mod:`sentinel.auth.acl`: ZooKeeper ACLs that keep each role to its own section.
- :mod:`sentinel.auth.enrolment`: client key slots, granted by the admin, written by the client.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sentinel.auth.envelope import Credential
    from sentinel.auth.keys import ClientKeyring

# Loaded on first use (PEP 562), as sentinel's own exports: a command that only needs
# sentinel.auth.acl (every ZooKeeper connection does) does not load cryptography.
_EXPORTS = {
    "ClientKeyring": "sentinel.auth.keys",
    "ManagerKey": "sentinel.auth.keys",
    "Credential": "sentinel.auth.envelope",
}

# What docs/auth.md shows a client; ManagerKey (the manager's signing key) stays importable
# for the manager's own code.
__all__ = ["ClientKeyring", "Credential"]

if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        """Import an exported name's module the first time the name is used."""
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(import_module(module), name)
