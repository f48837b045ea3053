"""PostgreSQL through Sentinel: psycopg connections and pools that resolve by themselves.

:func:`connect` opens one connection to the endpoint ``get_service`` picks, logging in with
the client's credential for the service (``endpoint.auth``); :class:`ReplicaPools` keeps one
``psycopg_pool.ConnectionPool`` per live instance and hands out connections of the instance
the policy picks for a key::

    pools = ReplicaPools(client, "orders-db", policy=MinLag(cutoff=5), kwargs={"dbname": "shop"})
    with pools.connection(key=tenant) as conn:      # the least-lagging replica of its partition
        conn.execute("SELECT ...")

A connection that cannot be opened (a killed replica, a refused login) is reported to
``client.report(endpoint, ok=False)`` and opened on another eligible endpoint, at most
``retries`` more times (:func:`sentinel.retry.first_success`, as the Spark helpers do). A
failure inside the ``with`` block is the application's: a statement is never repeated.

Pools follow the cache through ``client.listen``: the pool of an instance that left is
closed, and on :class:`~sentinel.events.AuthChanged` the pools of the old credential are
closed (their idle connections at once, the ones in use when returned) before the client
confirms the new version, so that none is handed out once the manager revokes the old one.
Requires the ``postgres`` extra (``psycopg[binary]``, ``psycopg-pool``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import ConnectionPool, PoolClosed

from sentinel.endpoint import Endpoint
from sentinel.errors import ClientClosed
from sentinel.events import AuthChanged, ChangeEvent, InstancesChanged
from sentinel.retry import first_success

if TYPE_CHECKING:
    from sentinel.client import Sentinel
    from sentinel.strategies import Endpoints, SelectionPolicy

log = logging.getLogger(__name__)

DEFAULT_RETRIES = 2
# The fields of a credential that are libpq connection parameters (PostgresBackend's).
CREDENTIAL_FIELDS = ("user", "password", "dbname")


def connection_params(endpoint: Endpoint, extra: Mapping[str, Any]) -> dict[str, Any]:
    """psycopg connection parameters for ``endpoint``: ``extra``, then the endpoint's host and
    port and its credential's ``user``, ``password`` and ``dbname``, which take precedence."""
    auth = endpoint.auth or {}
    credential = {name: auth[name] for name in CREDENTIAL_FIELDS if name in auth}
    return {**extra, "host": endpoint.host, "port": endpoint.port, **credential}


def connect(
    client: Sentinel,
    service: str,
    key: object = None,
    policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | None = None,
    *,
    retries: int = DEFAULT_RETRIES,
    **kw: Any,
) -> psycopg.Connection[Any]:
    """A new psycopg connection to the endpoint ``client.get_service(service, key, policy)``
    picks, logged in with its credential; ``kw`` go to ``psycopg.connect`` (``dbname``,
    ``autocommit``, ``connect_timeout``, ...).

    When the connection cannot be opened the endpoint is reported down and another one tried,
    at most ``retries`` more times; then :class:`~sentinel.errors.EndpointFailed` is raised
    from the last ``psycopg.OperationalError``.
    """
    return first_success(
        client,
        service,
        key,
        policy,
        lambda endpoint: psycopg.connect(**connection_params(endpoint, kw)),
        retries=retries,
        retry_on=(psycopg.OperationalError,),
    )


def _version(endpoint: Endpoint) -> int | None:
    return getattr(endpoint.auth, "version", None)


def _drain(pool: ConnectionPool[Any]) -> None:
    # No wait for the pool's threads (we may be on the cache's worker thread): idle
    # connections close now, connections in use when they are returned.
    pool.close(timeout=0)


class ReplicaPools:
    """One ``psycopg_pool.ConnectionPool`` per live instance of ``service``, created on first
    use; :meth:`connection` hands out a connection of the instance the policy picks.

    ``pool_kwargs`` go to every ``ConnectionPool`` (``min_size``, ``max_size``, ``timeout``,
    ``kwargs={"dbname": ...}`` for the connections, ...); by default each connection is
    checked before it is handed out (``check=ConnectionPool.check_connection``), so that one
    left idle on a server that has since died is replaced, or the endpoint reported down,
    rather than given to the application. Close with :meth:`close` or a ``with`` block.
    """

    def __init__(
        self,
        client: Sentinel,
        service: str,
        policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | None = None,
        *,
        retries: int = DEFAULT_RETRIES,
        **pool_kwargs: Any,
    ) -> None:
        self.client = client
        self.service = service
        self.policy = policy
        self.retries = retries
        self._connect_kwargs: dict[str, Any] = dict(pool_kwargs.pop("kwargs", None) or {})
        self._pool_kwargs = {"check": ConnectionPool.check_connection, **pool_kwargs}
        self._lock = threading.Lock()
        # instance name -> (credential version, pool)
        self._pools: dict[str, tuple[int | None, ConnectionPool[Any]]] = {}
        self._closed = False
        self._unlisten = client.listen(service, self._on_event)

    def __repr__(self) -> str:
        return f"ReplicaPools({self.service!r}, pools={sorted(self._pools)})"

    def __enter__(self) -> ReplicaPools:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def connection(
        self, key: object = None, timeout: float | None = None
    ) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection to the instance the policy picks for ``key``, returned to its
        pool on exit (committed, or rolled back on an exception, as psycopg_pool does).

        ``timeout`` bounds the wait for a connection of one pool (default: the pool's
        ``timeout``); past it, or when the connection fails its check, the endpoint is
        reported down and another one tried, at most ``retries`` more times, then
        :class:`~sentinel.errors.EndpointFailed` is raised.
        """
        with contextlib.ExitStack() as stack:
            conn = first_success(
                self.client,
                self.service,
                key,
                self.policy,
                lambda endpoint: self._checkout(stack, endpoint, timeout),
                retries=self.retries,
                retry_on=(psycopg.OperationalError,),
            )
            yield conn

    def _checkout(
        self, stack: contextlib.ExitStack, endpoint: Endpoint, timeout: float | None
    ) -> psycopg.Connection[Any]:
        while True:
            pool = self.pool(endpoint)
            try:
                return stack.enter_context(pool.connection(timeout))
            except PoolClosed:
                continue  # drained by a concurrent event: the next pool() makes a new one
            except psycopg.OperationalError:
                # Its background threads would keep reconnecting to a dead server.
                self._discard(endpoint.name, pool)
                raise

    def pool(self, endpoint: Endpoint) -> ConnectionPool[Any]:
        """The pool of ``endpoint`` for its current credential, created (opening its
        connections in the background) when there is none yet."""
        version = _version(endpoint)
        with self._lock:
            if self._closed:
                raise ClientClosed(f"the pools of {self.service} are closed")
            held = self._pools.get(endpoint.name)
            if held is not None and held[0] == version:
                return held[1]
            pool: ConnectionPool[Any] = ConnectionPool(
                kwargs=connection_params(endpoint, self._connect_kwargs),
                name=f"{self.service}/{endpoint.name}",
                open=True,
                **self._pool_kwargs,
            )
            self._pools[endpoint.name] = (version, pool)
        if held is not None:
            _drain(held[1])
        log.debug("%s: pool opened for %s (credential v%s)", self.service, endpoint.name, version)
        return pool

    def _discard(self, name: str, pool: ConnectionPool[Any]) -> None:
        with self._lock:
            if self._pools.get(name, (None, None))[1] is pool:
                del self._pools[name]
        _drain(pool)

    def _take(self, keep: Callable[[str, int | None], bool]) -> list[ConnectionPool[Any]]:
        """Remove the pools that ``keep(name, version)`` rejects; return them."""
        with self._lock:
            gone = [name for name, (version, _) in self._pools.items() if not keep(name, version)]
            return [self._pools.pop(name)[1] for name in gone]

    def _on_event(self, event: ChangeEvent) -> None:
        # On the cache's worker thread: nothing here waits for a server or a thread.
        if isinstance(event, InstancesChanged) and event.removed:
            left = {endpoint.name for endpoint in event.removed}
            stale = self._take(lambda name, _version: name not in left)
        elif isinstance(event, AuthChanged):
            current = event.new_version
            stale = self._take(lambda _name, version: version == current)
        else:
            return
        for pool in stale:
            _drain(pool)

    def close(self) -> None:
        """Stop following the cache and close every pool (waiting for their threads)."""
        self._unlisten()
        with self._lock:
            self._closed = True
            pools = [pool for _, pool in self._pools.values()]
            self._pools.clear()
        for pool in pools:
            pool.close()
