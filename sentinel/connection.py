"""How every Sentinel connection to ZooKeeper is made: transport, identity and TLS, in one place.

The client facade, the CLI's plain kazoo clients and (through the facade) the Spark workers
all build their ``KazooClient`` from :func:`client_arguments`, so that a setting such as TLS
or the digest identity cannot be honoured by one of them and forgotten by another, and
:func:`unavailable` says in one way why a connection could not be made.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import AuthFailedError, KazooException
from kazoo.protocol.states import KeeperState

from sentinel.auth import acl
from sentinel.errors import TlsHandshakeFailed, ZooKeeperUnavailable, ZooKeeperUnreachable
from sentinel.zk.errors import translate
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
    identity = acl.effective_identity(identity)
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


class _Reachability:
    """Whether any server of ``zk``'s connect string may still answer: false once each one's
    name does not resolve, or each address it resolves to has refused a connection (the
    handler's :attr:`~sentinel.zk.transport.PollHandler.refused`).

    kazoo skips a name that does not resolve and retries a refusal, with back-off, until the
    timeout; but nothing is listening there, so waiting only delays the error. A server that
    accepts and is slow to answer, or whose name lookup failed for a reason that may pass (no
    DNS server answered), is never counted: the caller waits for it as before. Names are
    resolved as kazoo resolves them (``getaddrinfo`` of each host, TCP), once, on a thread of
    their own, so that a slow resolver holds up nothing (the caller's timeout still holds).
    """

    def __init__(self, zk: KazooClient, wake: Callable[[], None]) -> None:
        """Resolve ``zk``'s hosts, and call ``wake`` (on another thread) once they are and
        after each refusal, until :meth:`close`."""
        self._handler = zk.handler if isinstance(zk.handler, PollHandler) else None
        if self._handler is not None:
            self._handler.refused = frozenset()
            self._handler.on_refused = wake
        self._order = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in zk.hosts]
        self._addresses: dict[str, frozenset[tuple[str, int]]] = {}
        self._unresolved: dict[str, str] = {}
        self._transient = False  # a name lookup failed for a reason that may pass
        self._resolved = threading.Event()  # the three above are written before it is set
        threading.Thread(
            target=self._resolve, args=(list(zk.hosts), wake), name="sentinel-resolve", daemon=True
        ).start()

    def _resolve(self, hosts: list[tuple[str, int]], wake: Callable[[], None]) -> None:
        for where, (host, port) in zip(self._order, hosts, strict=True):
            try:
                found = socket.getaddrinfo(host, port, 0, 0, socket.IPPROTO_TCP)
            except socket.gaierror as exc:
                if exc.errno in _NO_SUCH_NAME:
                    self._unresolved[where] = "the name does not resolve"
                else:
                    self._transient = True
                continue
            self._addresses[where] = frozenset((a[4][0], a[4][1]) for a in found)
        self._resolved.set()
        wake()

    def reasons(self) -> dict[str, str] | None:
        """Why no server can be reached, by ``host:port``; None while one still may be."""
        if not self._resolved.is_set() or self._transient or self._handler is None:
            return None
        refused = self._handler.refused
        if any(not addresses <= refused for addresses in self._addresses.values()):
            return None
        return {
            where: self._unresolved.get(where, "connection refused (nothing listens there)")
            for where in self._order
        }

    def close(self) -> None:
        """Stop waking the caller on a refusal."""
        if self._handler is not None:
            self._handler.on_refused = None


# getaddrinfo's answers that say the name has no address (not that no DNS server answered).
_NO_SUCH_NAME = frozenset(
    code for code in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None)) if code is not None
)


def start_client(zk: KazooClient, hosts: str, timeout: float) -> None:
    """Start ``zk`` and return once its session is open and its identity accepted, within
    ``timeout`` seconds; ``hosts`` names the servers in the error.

    Raises AuthenticationFailed as soon as the server refuses the SASL login,
    ZooKeeperUnreachable as soon as every server has refused the connection or has a name
    that does not resolve (:class:`_Reachability`), and :func:`unavailable`'s error when no
    server answered in time; whichever, ``zk`` is stopped and closed. A connect string
    where one server refuses and another answers connects to the one that answers.
    What it does beyond kazoo's own ``start()``: kazoo reports the session
    CONNECTED before it logs in, and a refused login clears the event that ``start()`` waits
    on and ends in the CLOSED state, so a refusal that came before ``start()`` began to wait,
    or between its wait and its check, was reported as a connection time-out (a wrong
    password as "no ZooKeeper server answered within 5s", after waiting the 5 s or at once).
    Here every state change wakes the wait, and the refusal is recorded as it passes.
    """
    changed = threading.Event()
    refused = threading.Event()

    def heard(state: str) -> None:  # kazoo's connection thread: sets flags, never blocks
        if zk.client_state == KeeperState.AUTH_FAILED:  # the state behind this change
            refused.set()
        changed.set()

    deadline = time.monotonic() + timeout
    reachability = _Reachability(zk, changed.set)
    unreachable = None
    zk.add_listener(heard)
    try:
        zk.start_async()
        while True:
            changed.clear()  # before the check: a change after it wakes the wait below
            if zk.connected or refused.is_set():
                break
            unreachable = reachability.reasons()
            if unreachable is not None:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not changed.wait(remaining):
                break
        if zk.connected:
            # Answered after the login (kazoo logs in before it sends what is queued), so a
            # refused login fails it; the chroot's existence is what kazoo's start() asks.
            zk.exists_async("/").get(timeout=max(deadline - time.monotonic(), 0.0))
            return
    except AuthFailedError:  # the login was refused while the request waited
        refused.set()
    except zk.handler.timeout_exception:
        pass  # connected, but the login did not end in time: said below
    except KazooException:
        if not refused.is_set():  # refused, then closed before the request: said below
            raise  # as from kazoo's start() (the connection lost meanwhile)
    finally:
        zk.remove_listener(heard)
        reachability.close()
    zk.stop()
    zk.close()
    if refused.is_set():
        raise translate(AuthFailedError(), "the login")
    if unreachable is not None:
        why = "; ".join(f"{where}: {why}" for where, why in unreachable.items())
        if len(unreachable) == 1:
            why = next(iter(unreachable.values()))
        raise ZooKeeperUnreachable(
            f"no ZooKeeper server at {hosts} can be reached: {why}", unreachable
        )
    raise unavailable(hosts, timeout, zk.handler)


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
