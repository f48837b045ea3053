"""The client facade: one ZooKeeper session per :class:`Sentinel`, shared by every role."""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from sentinel.devserver import resolve_hosts
from sentinel.ephemeral import EphemeralNodes
from sentinel.errors import (
    ClientClosed,
    ConnectionInterrupted,
    RegistryError,
    ZooKeeperUnavailable,
)
from sentinel.layout import SECTIONS, sanitize_name, validate_name, validate_namespace
from sentinel.publisher import Publisher, Registration
from sentinel.records import InstanceRecord, ServiceSpec
from sentinel.registry import ServiceListing, read_service

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "/sentinel"
DEFAULT_DRAIN_WAIT = 1.0


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _translate_zk_errors(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Raise kazoo's exceptions as Sentinel's, so callers catch one hierarchy."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except (
            ConnectionLoss,
            SessionExpiredError,
            ConnectionClosedError,
            KazooTimeoutError,
        ) as exc:
            raise ConnectionInterrupted(
                f"connection to ZooKeeper lost during {method.__name__}() "
                f"({type(exc).__name__}); retry once the client has reconnected"
            ) from exc
        except KazooException as exc:
            raise RegistryError(
                f"ZooKeeper refused {method.__name__}(): {type(exc).__name__} {exc}"
            ) from exc

    return wrapper


def default_client_id() -> str:
    """``<hostname>-<pid>``, made a valid name: unique per process on a host."""
    return sanitize_name(f"{socket.gethostname()}-{os.getpid()}")


class Sentinel:
    """A Sentinel client: publishes instances and (with the cache) resolves services.

    Use it as a context manager, or call :meth:`start` and :meth:`close`::

        with Sentinel(hosts="127.0.0.1:2181", client_id="billing-api") as sentinel:
            registration = sentinel.register_service("billing-db", "p1", "10.0.0.5", 5432,
                                                     scheme="postgresql", label="replica-a")
            ...
            sentinel.drain(registration)

    ``hosts`` defaults to ``$SENTINEL_ZK``, then to the development server (``sentinel zk
    start``). ``namespace`` is the root every path lives under, so that several environments
    can share one ensemble. ``session_timeout`` is how long ZooKeeper keeps this client's
    ephemeral nodes after it stops answering.
    """

    def __init__(
        self,
        hosts: str | None = None,
        client_id: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        *,
        connect_timeout: float = 10.0,
        session_timeout: float = 10.0,
        drain_wait: float = DEFAULT_DRAIN_WAIT,
    ) -> None:
        self.namespace = validate_namespace(namespace)
        self.hosts = resolve_hosts(hosts)
        self.client_id = validate_name("client", client_id or default_client_id())
        self.connect_timeout = connect_timeout
        self.drain_wait = drain_wait
        self._zk = KazooClient(hosts=f"{self.hosts}{self.namespace}", timeout=session_timeout)
        self._nodes = EphemeralNodes(self._zk)
        self._publisher = Publisher(self._zk, self._nodes)
        self._started = False

    def __repr__(self) -> str:
        state = self._zk.state if self._started else "not started"
        return (
            f"<Sentinel client_id={self.client_id!r} hosts={self.hosts!r} "
            f"namespace={self.namespace!r} {state}>"
        )

    def __enter__(self) -> Sentinel:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @_translate_zk_errors
    def start(self) -> Sentinel:
        """Connect and make sure the namespace and its sections exist.

        Raises :class:`ZooKeeperUnavailable` if no server answers within ``connect_timeout``.
        """
        if self._started:
            return self
        try:
            with warnings.catch_warnings():
                # The namespace is created just below; kazoo warns about it beforehand.
                warnings.filterwarnings("ignore", message="No chroot path exists")
                self._zk.start(timeout=self.connect_timeout)
        except self._zk.handler.timeout_exception:
            raise ZooKeeperUnavailable(
                f"no ZooKeeper server at {self.hosts} answered within {self.connect_timeout:g}s"
            ) from None
        try:
            for section in SECTIONS:
                self._zk.ensure_path(section)
        except BaseException:
            self._zk.stop()
            self._zk.close()
            raise
        self._nodes.start()
        self._started = True
        log.info("connected to %s%s as %s", self.hosts, self.namespace, self.client_id)
        return self

    def close(self) -> None:
        """End the session; ZooKeeper removes this client's ephemeral nodes at once."""
        if not self._started:
            return
        self._started = False
        self._nodes.close()
        self._zk.stop()
        self._zk.close()

    def _require_started(self) -> None:
        if not self._started:
            raise ClientClosed("the client is not started: call start() or use 'with Sentinel()'")

    @property
    def session_id(self) -> int | None:
        """The current ZooKeeper session id, None while not connected."""
        return self._zk.client_id[0] if self._started and self._zk.client_id else None

    @property
    def registrations(self) -> tuple[Registration, ...]:
        """The registrations this client holds."""
        return self._publisher.registrations

    @_translate_zk_errors
    def ensure_service(
        self,
        service: str,
        scheme: str = "http",
        shard_policy: str | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> ServiceSpec:
        """Create the spec of ``service`` unless it exists; return the stored spec.

        Raises :class:`~sentinel.errors.ServiceConflict` if it exists with other settings.
        """
        self._require_started()
        spec = ServiceSpec(service, scheme=scheme, shard_policy=shard_policy, defaults=defaults)
        return self._publisher.ensure_service(spec)

    @_translate_zk_errors
    def register_service(
        self,
        service: str,
        partition: str,
        host: str,
        port: int,
        scheme: str = "http",
        label: str | None = None,
        weight: float = 1,
        zone: str | None = None,
        status: str = "up",
        properties: Mapping[str, Any] | None = None,
    ) -> Registration:
        """Publish a live instance of ``service`` serving ``partition`` at ``host:port``.

        The node is ephemeral and is re-created after a session expiry. ``label`` names the
        instance within its partition (default: ``<host>_<port>``); registering the same
        identity again replaces the earlier node. The service spec is created if missing.
        Invalid input raises :class:`~sentinel.errors.ValidationError` before anything is
        written.
        """
        self._require_started()
        instance = InstanceRecord(
            service=service,
            partition=partition,
            label=label if label is not None else sanitize_name(f"{host}_{port}"),
            host=host,
            port=port,
            scheme=scheme,
            status=status,
            weight=weight,
            zone=zone,
            properties=properties,
        )
        return self._publisher.register(instance)

    @_translate_zk_errors
    def deregister_service(self, registration: Registration) -> bool:
        """Remove the instance; returns False if this client no longer held it."""
        self._require_started()
        return self._publisher.deregister(registration)

    def drain(self, registration: Registration, wait: float | None = None) -> None:
        """Deregister, then wait ``wait`` seconds (default ``drain_wait``) for clients to see it.

        Call it before a server stops serving, so that no client still picks it.
        """
        self.deregister_service(registration)
        time.sleep(self.drain_wait if wait is None else wait)

    @_translate_zk_errors
    def read_service(self, service: str) -> ServiceListing:
        """Read ``service``'s spec and live instances straight from ZooKeeper (no cache).

        For operators and tests; the request path uses the watch-driven cache instead.
        Undecodable nodes are skipped and counted. Raises
        :class:`~sentinel.errors.ServiceNotFound` if the service has no spec.
        """
        self._require_started()
        return read_service(self._zk, validate_name("service", service))
