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

from sentinel.auth.envelope import Credential
from sentinel.auth.keys import ClientKeyring, ManagerKey

__all__ = ["ClientKeyring", "Credential", "ManagerKey"]
