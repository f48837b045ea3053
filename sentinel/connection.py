"""How every Sentinel connection to ZooKeeper is made: transport, identity and TLS, in one place.

The client facade, the CLI's plain kazoo clients and (through the facade) the Spark workers
all build their ``KazooClient`` from :func:`client_arguments`, so that a setting such as TLS
or the digest identity cannot be honoured by one of them and forgotten by another, and
:func:`unavailable` says in one way why a connection could not be made.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from sentinel.auth import acl
from sentinel.errors import TlsHandshakeFailed, ZooKeeperUnavailable
from sentinel.zk.redaction import install_kazoo_redaction
from sentinel.zk.tls import TlsConfig
from sentinel.zk.transport import PollHandler


def client_arguments(identity: str | None = None, tls: TlsConfig | None = None) -> dict[str, Any]:
    """``KazooClient`` arguments: a :class:`~sentinel.zk.transport.PollHandler` (``handler``),
    the digest ``identity`` (``user:password``; default ``$SENTINEL_ZK_IDENTITY``; none:
    anonymous), TLS (none: plain TCP) and a :class:`QuietRetries` logger of its own.

    Raises TlsConfigError when a TLS file cannot be loaded. Also makes sure kazoo's log
    records never carry the identity's password (:mod:`sentinel.zk.redaction`).
    """
    install_kazoo_redaction()
    identity = identity or os.environ.get(acl.IDENTITY_ENV) or None
    return {
        "handler": PollHandler(),
        "logger": QuietRetries(KAZOO_LOGGER),
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


KAZOO_LOGGER = logging.getLogger("kazoo.client")

# kazoo's connection loop logs each failed attempt at WARNING; these are their format strings
# (kazoo.protocol.connection), matched as written so that nothing else is ever demoted.
_TRANSITION = "Transition to CONNECTING"
_RETRY_LINES = ("Connection dropped: %s", "Connection time-out: %s", _TRANSITION)
# Its line when the loop ends unconnected (stopped, or out of tries): the caller says so.
_GAVE_UP_LINE = "Failed connecting to Zookeeper within the connection retry policy."
# kazoo.client's line for a connection (re)established: the outage is over.
_CONNECTED_LINE = "Zookeeper connection established, state: %s"


class QuietRetries(logging.LoggerAdapter[logging.Logger]):
    """One kazoo client's logger: one warning per outage, not one per retry.

    While ZooKeeper cannot be reached, kazoo logs every attempt ("Connection dropped:
    [Errno 111] Connection refused", eight of them before a 10 s start gives up). This adapter
    passes the first of an outage on as a warning saying that retries follow, and logs the
    rest at DEBUG (``-vv`` and ``logging.DEBUG`` still show each); the next established
    connection ends the outage, said at INFO with how many attempts failed. Everything else
    goes through unchanged, on the same ``kazoo.client`` logger (its filters, such as
    :mod:`sentinel.zk.redaction`'s, still apply). One adapter per client: each has its outages.
    """

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})
        self._lock = threading.Lock()
        self._failures = 0  # attempts failed in the current outage; 0: connected or never tried

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log as kazoo asked, except that a retry after the first of an outage is DEBUG."""
        if msg in _RETRY_LINES:
            attempt = msg != _TRANSITION  # the transition follows an attempt's line
            with self._lock:
                self._failures += attempt
                first = attempt and self._failures == 1
            if first:
                msg = f"{msg} (retrying; further attempts are logged at DEBUG until it connects)"
            else:
                level = min(level, logging.DEBUG)
        elif msg == _GAVE_UP_LINE and self._failures:
            level = min(level, logging.DEBUG)  # the outage's warning said it; the caller raises
        elif msg == _CONNECTED_LINE:
            with self._lock:
                failures, self._failures = self._failures, 0
            if failures:
                msg = f"{msg} after {failures} failed attempt(s)"
        if self.logger.isEnabledFor(level):
            self.logger.log(level, msg, *args, **kwargs)
