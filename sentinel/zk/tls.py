"""TLS to ZooKeeper: which CA to trust and which certificate to present, as plain values.

Secrets must not cross the wire in clear (docs/decisions/tls-verifies-everything.md), so a
client can talk to ZooKeeper's ``secureClientPort`` instead of its plain port.
:class:`TlsConfig` holds three file paths and no key material, so it pickles into a Spark
closure like any other setting; the files are read where the client runs. The server certificate
is always verified (against ``ca``, or the system's trusted CAs when ``ca`` is None) and so is
its host name, as ZooKeeper's Java client does; ``certfile`` and ``keyfile`` give the client
certificate a server with ``ssl.clientAuth=need`` asks for.

Environment: ``SENTINEL_ZK_TLS_CA``, ``SENTINEL_ZK_TLS_CERT``, ``SENTINEL_ZK_TLS_KEY``
(read by :meth:`TlsConfig.from_env`; they do not turn TLS on by themselves)::

    Sentinel(hosts="zk1:2281", tls=TlsConfig(ca="/etc/zk/ca.pem"))
    Sentinel(hosts="zk1:2281", tls=True)     # TlsConfig.from_env()
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sentinel.errors import TlsConfigError

CA_ENV = "SENTINEL_ZK_TLS_CA"
CERT_ENV = "SENTINEL_ZK_TLS_CERT"
KEY_ENV = "SENTINEL_ZK_TLS_KEY"


@dataclass(frozen=True)
class TlsConfig:
    """How a client reaches ZooKeeper over TLS: paths of PEM files on the machine it runs on.

    ``ca``: the CA certificate(s) the server's certificate must chain to (None: the system's
    trusted CAs). ``certfile`` and ``keyfile``: the client certificate and its unencrypted
    private key, both or neither. ``check_hostname``: whether the server certificate must name
    the host of the connect string (an IP address must be in its subjectAltName).
    """

    ca: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        if (self.certfile is None) != (self.keyfile is None):
            raise TlsConfigError(
                "a TLS client certificate needs both a certificate file and a key file "
                f"(${CERT_ENV} and ${KEY_ENV}, or --zk-tls-cert and --zk-tls-key)"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: str | None) -> TlsConfig:
        """A config from ``$SENTINEL_ZK_TLS_CA``, ``_CERT`` and ``_KEY``; a non-None override
        (``ca=``, ``certfile=``, ``keyfile=``) wins over its variable."""
        env = os.environ if env is None else env
        values = {
            "ca": env.get(CA_ENV) or None,
            "certfile": env.get(CERT_ENV) or None,
            "keyfile": env.get(KEY_ENV) or None,
        }
        values.update({name: value for name, value in overrides.items() if value is not None})
        return cls(**values)

    @classmethod
    def resolve(cls, tls: TlsConfig | bool | None) -> TlsConfig | None:
        """``tls`` as clients accept it: a config, True (:meth:`from_env`), or None/False
        (plain TCP)."""
        if tls is True:
            return cls.from_env()
        if tls is None or tls is False:
            return None
        if not isinstance(tls, TlsConfig):
            raise TlsConfigError(f"tls must be a TlsConfig, True or None, not {type(tls).__name__}")
        return tls

    def ssl_context(self) -> ssl.SSLContext:
        """A client context with these files loaded; TlsConfigError names a file that cannot
        be read or used (never its content)."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = self.check_hostname
        try:
            if self.ca is not None:
                context.load_verify_locations(cafile=self.ca)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"cannot use TLS CA file {self.ca!r}: {_reason(exc)}") from None
        try:
            if self.certfile is not None:
                context.load_cert_chain(self.certfile, self.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(
                f"cannot use TLS client certificate {self.certfile!r} with key {self.keyfile!r}: "
                f"{_reason(exc)}"
            ) from None
        return context

    def kazoo_arguments(self) -> dict[str, Any]:
        """``KazooClient`` arguments for this config (after checking the files load)."""
        self.ssl_context()
        return {
            "use_ssl": True,
            "ca": self.ca,
            "certfile": self.certfile,
            "keyfile": self.keyfile,
            "verify_certs": True,
            "check_hostname": self.check_hostname,
        }


def _reason(exc: OSError | ssl.SSLError) -> str:
    return exc.strerror or getattr(exc, "reason", None) or type(exc).__name__
