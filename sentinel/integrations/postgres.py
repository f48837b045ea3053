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
``retries`` more times (:class:`sentinel.integrations.retry.Route`, the retry of every
integration). A failure inside the ``with`` block is the application's: a statement is never
repeated.

Pools follow the cache through ``client.listen``: the pool of an instance that left is
closed, and on :class:`~sentinel.events.AuthChanged` the pools of the old credential are
closed (their idle connections at once, the ones in use when returned) before the client
confirms the new version, so that none is handed out once the manager revokes the old one.
With regions (``docs/regions.md``), a lookup that fails over opens a pool on another region's
instance; the pools follow that region's changes too (``client.listen(..., region=...)``), so
the instance leaving there, or a rotation of that region's credential, closes its pool as a
local one's. Pools are kept per instance address (its URI), so an instance of the same name
in two regions never shares a pool, and per region's credential version.
Requires the ``postgres`` extra (``psycopg[binary]``, ``psycopg-pool``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolClosed

from sentinel.aio import to_loop
from sentinel.errors import ClientClosed
from sentinel.events import AuthChanged, ChangeEvent, InstancesChanged
from sentinel.integrations.retry import Route, first_success
from sentinel.registry.endpoint import Endpoint

if TYPE_CHECKING:
    from sentinel.client import Sentinel
    from sentinel.strategies import Endpoints, SelectionPolicy

log = logging.getLogger(__name__)

Pool = TypeVar("Pool", ConnectionPool[Any], AsyncConnectionPool[Any])

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


async def aconnect(
    client: Sentinel,
    service: str,
    key: object = None,
    policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | None = None,
    *,
    retries: int = DEFAULT_RETRIES,
    **kw: Any,
) -> psycopg.AsyncConnection[Any]:
    """:func:`connect` on ``psycopg.AsyncConnection``. Resolution is a plain call: it does not
    block on a warm cache, but a service's first lookup reads ZooKeeper on the loop (``await
    AsyncSentinel.prefetch(service)`` at start-up avoids it)."""
    route = Route(client, service, key, policy, retries=retries)
    while True:
        try:
            return await psycopg.AsyncConnection.connect(**connection_params(route.endpoint, kw))
        except psycopg.OperationalError as exc:
            if not route.failed("connect", type(exc).__name__):
                raise route.exhausted(exc) from exc


class _PoolSet(Generic[Pool]):
    """The bookkeeping both pool sets share: one pool per (instance, credential version),
    replaced or dropped as the cache's events say; subclasses open and close pools."""

    pool_class: type[Pool]
    open_at_creation: bool  # async pools are opened by an awaited call instead

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
        self._pool_kwargs = {"check": self.pool_class.check_connection, **pool_kwargs}
        self._lock = threading.Lock()  # events arrive on the caches' threads, requests elsewhere
        # instance URI -> (credential version, pool, region): by address, not by name, since
        # two regions may each have an instance of one name
        self._pools: dict[str, tuple[int | None, Pool, str | None]] = {}
        self._closed = False
        self._bind()
        self._router = client.regions_router
        self._local = None if self._router is None else self._router.local
        # Every region alike: this one's changes and those of each region a failover may open.
        regions = [self._local, *([] if self._router is None else self._router.remotes.by_name)]
        self._unlisten = [
            client.listen(service, functools.partial(self._on_event, region), region=region)
            for region in regions
        ]

    def _bind(self) -> None:
        """Set up what :meth:`_drain` needs before the first event can arrive."""

    def __repr__(self) -> str:
        pools = sorted(
            uri if region is None else f"{uri} (region {region})"
            for uri, (_, _, region) in dict(self._pools).items()
        )
        return f"{type(self).__name__}({self.service!r}, pools={pools})"

    def _drain(self, pool: Pool) -> None:
        """Close ``pool`` without waiting: idle connections now, the others when returned."""
        raise NotImplementedError

    def _pool_for(self, endpoint: Endpoint) -> tuple[Pool, bool]:
        """The pool of ``endpoint`` for its current credential, and whether it is new."""
        version = _version(endpoint)
        # Read without the lock first (one dict read is atomic; the lock orders writes): a
        # pool drained meanwhile raises PoolClosed at checkout, which takes the next one.
        held = self._pools.get(endpoint.uri)
        if held is not None and held[0] == version:
            return held[1], False
        # Which region's credential this is, for that region's AuthChanged: once per pool.
        region = self._local if self._router is None else self._router.region_of(endpoint)
        with self._lock:
            if self._closed:
                raise ClientClosed(f"the pools of {self.service} are closed")
            held = self._pools.get(endpoint.uri)
            if held is not None and held[0] == version:
                return held[1], False
            pool = self.pool_class(
                open=self.open_at_creation,
                kwargs=connection_params(endpoint, self._connect_kwargs),
                name=f"{self.service}/{endpoint.name}",
                **self._pool_kwargs,
            )
            self._pools[endpoint.uri] = (version, pool, region)
        if held is not None:
            self._drain(held[1])
        log.debug(
            "%s: pool opened for %s in region %s (credential v%s)",
            self.service,
            endpoint.name,
            region,
            version,
        )
        return pool, True

    def _discard(self, endpoint: Endpoint, pool: Pool) -> None:
        """Forget and drain ``pool`` after a failure: its threads would keep reconnecting."""
        with self._lock:
            held = self._pools.get(endpoint.uri)
            if held is not None and held[1] is pool:
                del self._pools[endpoint.uri]
        self._drain(pool)

    def _take(self, keep: Callable[[str, int | None, str | None], bool]) -> list[Pool]:
        """Remove the pools that ``keep(uri, version, region)`` rejects; return them."""
        with self._lock:
            gone = [uri for uri, (v, _, region) in self._pools.items() if not keep(uri, v, region)]
            return [self._pools.pop(uri)[1] for uri in gone]

    def _on_event(self, region: str | None, event: ChangeEvent) -> None:
        """A change in ``region`` (this client's own: ``_local``). On that region's cache
        worker thread: nothing here waits for a server or a thread."""
        if isinstance(event, InstancesChanged) and event.removed:
            # by address, whatever region's pool it is: the server has left the registry
            left = {endpoint.uri for endpoint in event.removed}
            stale = self._take(lambda uri, _version, _region: uri not in left)
        elif isinstance(event, AuthChanged):
            current = event.new_version  # a version of this region's credential only
            stale = self._take(lambda _uri, version, at: at != region or version == current)
        else:
            return
        for pool in stale:
            self._drain(pool)

    def _close_all(self) -> list[Pool]:
        for unlisten in self._unlisten:
            unlisten()
        with self._lock:
            self._closed = True
            pools = [pool for _, pool, _ in self._pools.values()]
            self._pools.clear()
        return pools


class ReplicaPools(_PoolSet[ConnectionPool[Any]]):
    """One ``psycopg_pool.ConnectionPool`` per live instance of ``service``, created on first
    use; :meth:`connection` hands out a connection of the instance the policy picks.

    ``pool_kwargs`` go to every ``ConnectionPool`` (``min_size``, ``max_size``, ``timeout``,
    ``kwargs={"dbname": ...}`` for the connections, ...); by default each connection is
    checked before it is handed out (``check=ConnectionPool.check_connection``), so that one
    left idle on a server that has since died is replaced, or the endpoint reported down,
    rather than given to the application. Close with :meth:`close` or a ``with`` block.
    """

    pool_class = ConnectionPool
    open_at_creation = True

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
        # The pool's own context is entered and left by hand: an ExitStack around it cost
        # half of this method's own time per checkout (benchmarks.pool_overhead).
        manager, conn = first_success(
            self.client,
            self.service,
            key,
            self.policy,
            lambda endpoint: self._checkout(endpoint, timeout),
            retries=self.retries,
            retry_on=(psycopg.OperationalError,),
        )
        try:
            yield conn
        except BaseException:
            if not manager.__exit__(*sys.exc_info()):
                raise
        else:
            manager.__exit__(None, None, None)

    def _checkout(
        self, endpoint: Endpoint, timeout: float | None
    ) -> tuple[contextlib.AbstractContextManager[psycopg.Connection[Any]], psycopg.Connection[Any]]:
        while True:
            pool = self.pool(endpoint)
            manager = pool.connection(timeout)
            try:
                return manager, manager.__enter__()
            except PoolClosed:
                continue  # drained by a concurrent event: the next pool() makes a new one
            except psycopg.OperationalError:
                self._discard(endpoint, pool)
                raise

    def pool(self, endpoint: Endpoint) -> ConnectionPool[Any]:
        """The pool of ``endpoint`` for its current credential, created (opening its
        connections in the background) when there is none yet."""
        return self._pool_for(endpoint)[0]

    def _drain(self, pool: ConnectionPool[Any]) -> None:
        pool.close(timeout=0)

    def close(self) -> None:
        """Stop following the cache and close every pool (waiting for their threads)."""
        for pool in self._close_all():
            pool.close()


class AsyncReplicaPools(_PoolSet[AsyncConnectionPool[Any]]):
    """:class:`ReplicaPools` on ``psycopg_pool.AsyncConnectionPool``, for one event loop.

    Create it on the loop that will use it (``async with AsyncReplicaPools(...) as pools``):
    the cache's events, which arrive on its worker thread, close pools through that loop.
    """

    pool_class = AsyncConnectionPool
    open_at_creation = False

    def _bind(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._draining: set[asyncio.Future[None]] = set()

    async def __aenter__(self) -> AsyncReplicaPools:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def connection(
        self, key: object = None, timeout: float | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """:meth:`ReplicaPools.connection`, awaited."""
        async with contextlib.AsyncExitStack() as stack:
            route = Route(self.client, self.service, key, self.policy, retries=self.retries)
            while True:
                try:
                    conn = await self._checkout(stack, route.endpoint, timeout)
                    break
                except psycopg.OperationalError as exc:
                    if not route.failed("checkout", type(exc).__name__):
                        raise route.exhausted(exc) from exc
            yield conn

    async def _checkout(
        self, stack: contextlib.AsyncExitStack, endpoint: Endpoint, timeout: float | None
    ) -> psycopg.AsyncConnection[Any]:
        while True:
            pool, new = self._pool_for(endpoint)
            if new:
                await pool.open()  # returns at once: connections open in the background
            try:
                return await stack.enter_async_context(pool.connection(timeout))
            except PoolClosed:
                continue
            except psycopg.OperationalError:
                self._discard(endpoint, pool)
                raise

    def _drain(self, pool: AsyncConnectionPool[Any]) -> None:
        def close() -> None:
            task = self._loop.create_task(pool.close(timeout=0))
            self._draining.add(task)
            task.add_done_callback(self._draining.discard)

        if not to_loop(self._loop, close):  # the loop is closed, and the pool's tasks with it
            log.debug("%s: loop closed; pool %s dropped", self.service, pool.name)

    async def close(self) -> None:
        """Stop following the cache and close every pool."""
        for pool in self._close_all():
            await pool.close()
        await asyncio.gather(*self._draining)


__all__ = ["AsyncReplicaPools", "ReplicaPools", "aconnect", "connect", "connection_params"]
