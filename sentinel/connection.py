"""How every Sentinel connection to ZooKeeper is made: transport, identity and TLS, in one place.

The client facade, the CLI's plain kazoo clients and (through the facade) the Spark workers
all build their ``KazooClient`` from :func:`client_arguments`, so that a setting such as TLS
or the digest identity cannot be honoured by one of them and forgotten by another, and
:func:`unavailable` says in one way why a connection could not be made.
"""

from __future__ import annotations

import os
from typing import Any

from sentinel.auth import acl
from sentinel.errors import TlsHandshakeFailed, ZooKeeperUnavailable
from sentinel.redaction import install_kazoo_redaction
from sentinel.tls import TlsConfig
from sentinel.transport import PollHandler


def client_arguments(identity: str | None = None, tls: TlsConfig | None = None) -> dict[str, Any]:
    """``KazooClient`` arguments: a :class:`~sentinel.transport.PollHandler` (``handler``),
    the digest ``identity`` (``user:password``; default ``$SENTINEL_ZK_IDENTITY``; none:
    anonymous) and TLS (none: plain TCP).

    Raises TlsConfigError when a TLS file cannot be loaded. Also makes sure kazoo's log
    records never carry the identity's password (:mod:`sentinel.redaction`).
    """
    install_kazoo_redaction()
    identity = identity or os.environ.get(acl.IDENTITY_ENV) or None
    return {
        "handler": PollHandler(),
        **acl.client_arguments(identity),
        **(tls.kazoo_arguments() if tls is not None else {}),
    }


def unavailable(hosts: str, timeout: float, handler: Any) -> ZooKeeperUnavailable:
    """The error for a connection that did not come up within ``timeout`` seconds:
    TlsHandshakeFailed with the reason when the last attempt failed in its TLS handshake."""
    failure = getattr(handler, "tls_failure", None)
    if failure:
        return TlsHandshakeFailed(
            f"no TLS session with ZooKeeper at {hosts} within {timeout:g}s: the TLS handshake "
            f"failed ({failure}); check the CA certificate (--zk-tls-ca, $SENTINEL_ZK_TLS_CA), "
            "the client certificate and that the port is ZooKeeper's secureClientPort"
        )
    return ZooKeeperUnavailable(f"no ZooKeeper server at {hosts} answered within {timeout:g}s")
