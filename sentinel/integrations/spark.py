"""Spark helpers: one client per Python worker process, one resolution per partition group.

PySpark runs Python code in worker processes that its daemon forks, and kazoo is not fork-safe:
a client created before the fork shares a socket and has lost its threads in the child. So
nothing ZooKeeper-related is created on the driver or pickled into a closure. What travels is a
:class:`ClientConfig` of plain values; :func:`get_client` turns it into a started
:class:`~sentinel.Sentinel` inside the task, once per process, and every later task of the same
worker (``spark.python.worker.reuse``, on by default) reuses it with its warm cache::

    config = ClientConfig(hosts="zk1:2181,zk2:2181", namespace="/prod", client_id="billing-etl")

    def total(endpoint, rows):
        with connect(endpoint.uri) as db:   # the least-lagging replica of the rows' partition
            yield from db.totals([row.tenant for row in rows])

    totals = resolve_partitions(tenants_df, "orders-db", total, key="tenant",
                                policy=MinLag(cutoff=5), config=config).collect()

Within one Spark partition, rows are grouped by the shard partition their key maps to, and
each group costs one ``get_service``: ``fn(endpoint, rows)`` runs once per group. When ``fn``
fails (the replica died mid-read), the group is resolved again without the endpoint that failed
and ``fn`` runs again on all its rows, at most ``retries`` more times.
"""

from __future__ import annotations

import atexit
import collections
import logging
import operator
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sentinel.auth.config import AuthConfig
from sentinel.client import Sentinel
from sentinel.devserver import resolve_hosts
from sentinel.errors import EndpointFailed
from sentinel.integrations.retry import Route
from sentinel.regions.config import Regions
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.layout import (
    DEFAULT_NAMESPACE,
    sanitize_name,
    validate_name,
    validate_namespace,
)
from sentinel.settings import default_client_id
from sentinel.zk.tls import TlsConfig

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame

    from sentinel.strategies import Endpoints, SelectionPolicy

log = logging.getLogger(__name__)

Row = TypeVar("Row")
Result = TypeVar("Result")

ENDPOINT_COLUMNS = ("uri", "partition", "label")


@dataclass(frozen=True)
class ClientConfig:
    """How executors reach Sentinel, as plain values that pickle into a Spark closure.

    ``client_id`` names the application (the ``app`` of ``/clients`` entries); each worker
    process registers as ``<client_id>-<host>-<pid>``, so that their entries do not replace
    each other. ``key_file`` is the path, on the executors, of the key ring of ``client_id``
    (a path travels, never the key): every worker then reads the credentials published for
    ``client_id`` (its ``auth_client``) into ``endpoint.auth``, and confirms each version in its
    own entry, so a rotation waits for every worker. ``auth_signer`` is the manager's public
    key text (a plain value, not a secret): workers accept only credentials it signed, as a
    secured namespace requires (see ``docs/auth.md``). ``session_timeout`` is also how long a
    crashed worker's ``/clients`` entries outlive it (PySpark ends workers without running exit
    handlers). ``tls`` holds the paths, on the executors, of the TLS files (a
    :class:`~sentinel.zk.tls.TlsConfig`; None: plain TCP). ``regions``: the executors' region
    and the others (:class:`~sentinel.regions.config.Regions`, plain values too): an executor
    resolves in its own region first and fails over under each service's rule, as any client
    does (None: one region, whatever the executors' environment says).
    """

    hosts: str
    namespace: str = DEFAULT_NAMESPACE
    client_id: str = "spark"
    key_file: str | None = None
    auth_signer: str | None = None
    connect_timeout: float = 10.0
    session_timeout: float = 10.0
    tls: TlsConfig | None = None
    regions: Regions | None = None

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)
        validate_name("client", self.client_id)

    @classmethod
    def from_env(cls, **settings: Any) -> ClientConfig:
        """A config whose hosts are resolved now, on the driver, as ``Sentinel()`` would
        (``$SENTINEL_ZK``, then the development server); ``settings`` set the other fields."""
        return cls(hosts=resolve_hosts(settings.pop("hosts", None)), **settings)


_lock = threading.Lock()
_clients: dict[ClientConfig, Sentinel] = {}
_owner = os.getpid()


def _forget_inherited() -> None:
    # A forked child inherits the parent's clients, whose threads did not survive the fork and
    # whose sockets the parent still uses: closing them would end the parent's sessions, so
    # they are dropped unclosed. The lock is replaced too: another thread may have held it.
    global _lock, _clients, _owner
    _lock = threading.Lock()
    _clients = {}
    _owner = os.getpid()


os.register_at_fork(after_in_child=_forget_inherited)


def get_client(config: ClientConfig) -> Sentinel:
    """This process's started client for ``config``: created on first use, then reused.

    Call it inside a task (``mapPartitions``), never on the driver for executors' use. One
    ZooKeeper session per worker process and config, however many tasks the worker runs.
    """
    if _owner != os.getpid():  # forked by a route that skipped the at-fork hook
        _forget_inherited()
    with _lock:
        client = _clients.get(config)
        if client is None:
            client = Sentinel(
                config.hosts,
                sanitize_name(f"{config.client_id}-{default_client_id()}"),
                config.namespace,
                connect_timeout=config.connect_timeout,
                session_timeout=config.session_timeout,
                app=config.client_id,
                auth=AuthConfig(
                    keys=config.key_file, client=config.client_id, signer=config.auth_signer
                ),
                tls=config.tls,
                regions=config.regions if config.regions is not None else False,
            ).start()
            _clients[config] = client
            log.info("worker %d connected to %s as %s", os.getpid(), config.hosts, client.client_id)
        return client


@atexit.register
def _close_clients() -> None:
    """End this process's sessions at a normal exit, so its ``/clients`` entries go at once."""
    if _owner == os.getpid():
        for client in list(_clients.values()):
            client.close()


def _key_function(key: str | Callable[[Any], object]) -> Callable[[Any], object]:
    return key if callable(key) else operator.itemgetter(key)


def resolve_groups(
    client: Sentinel,
    service: str,
    rows: Iterable[Row],
    fn: Callable[[Endpoint, list[Row]], Iterable[Result]],
    *,
    key: str | Callable[[Row], object],
    policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | None = None,
    retries: int = 2,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
) -> Iterator[Result]:
    """Group ``rows`` by the partition of their ``key`` and yield ``fn(endpoint, group)``'s
    results, one ``get_service`` per group: the work of one Spark partition, on any client.

    ``key`` is a field name (``row[key]``) or a function of the row. A group whose ``fn``
    raises one of ``retry_on`` is resolved again without the endpoints that failed it (all of
    them again if none is left) and re-run whole, since the results of a failed attempt are
    discarded; ``fn`` must therefore be safe to repeat, as Spark already requires of tasks.
    After ``retries`` repeats :class:`~sentinel.errors.EndpointFailed` is raised from the last
    failure. The rows of the Spark partition are held in memory while they are grouped.
    """
    key_of = _key_function(key)
    # (partition, rows, attempts spent on them in groupings whose keys moved)
    pending: collections.deque[tuple[str | None, list[Row], int]] = collections.deque(
        (p, group, 0) for p, group in _group(client, service, rows, key_of)
    )
    while pending:
        partition, group, spent = pending.popleft()
        route = Route(client, service, key_of(group[0]), policy, retries=retries - spent)
        while True:
            endpoint = route.endpoint
            if partition is not None and endpoint.partition != partition:
                # The shard map changed between grouping and resolving: group these rows again.
                spent += route.attempts
                if spent > retries:
                    raise EndpointFailed(
                        f"{service}: the partition of {len(group)} row(s) kept changing "
                        f"({partition} -> {endpoint.partition})"
                    )
                regrouped = _group(client, service, group, key_of)
                pending.extendleft((p, g, spent) for p, g in reversed(regrouped))
                break
            try:
                results = list(fn(endpoint, group))
            except retry_on as exc:
                if route.failed(f"{len(group)} row(s) of {partition}", type(exc).__name__):
                    continue
                raise route.exhausted(exc) from exc
            yield from results
            break


def _group(
    client: Sentinel, service: str, rows: Iterable[Row], key_of: Callable[[Row], object]
) -> list[tuple[str | None, list[Row]]]:
    groups: dict[str | None, list[Row]] = {}
    for row in rows:
        groups.setdefault(client.partition_of(service, key_of(row)), []).append(row)
    return list(groups.items())


def resolve_partitions(
    data: RDD | DataFrame,
    service: str,
    fn: Callable[[Endpoint, list[Any]], Iterable[Result]],
    *,
    key: str | Callable[[Any], object],
    policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | None = None,
    config: ClientConfig | None = None,
    retries: int = 2,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
) -> RDD:
    """An RDD of ``fn(endpoint, rows)``'s results over every (Spark partition, shard
    partition) group of ``data`` (an RDD, or a DataFrame whose ``Row`` objects are passed).

    Resolution happens on the executors, through :func:`get_client`, with one
    ``get_service(service, key, policy)`` per group; see :func:`resolve_groups` for ``key``,
    retries and ``retry_on``. ``config`` defaults to :meth:`ClientConfig.from_env` evaluated
    here, on the driver. ``policy`` and ``fn`` are pickled to the executors.
    """
    config = config or ClientConfig.from_env()
    rdd = getattr(data, "rdd", data)

    def run(rows: Iterable[Any]) -> Iterator[Result]:
        return resolve_groups(
            get_client(config),
            service,
            rows,
            fn,
            key=key,
            policy=policy,
            retries=retries,
            retry_on=retry_on,
        )

    return rdd.mapPartitions(run)


def _append_endpoint(endpoint: Endpoint, rows: Sequence[Any]) -> list[tuple[Any, ...]]:
    return [(*row, endpoint.uri, endpoint.partition, endpoint.label) for row in rows]


def with_endpoint(
    df: DataFrame,
    service: str,
    *,
    key: str,
    policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | None = None,
    config: ClientConfig | None = None,
    prefix: str = "sentinel_",
) -> DataFrame:
    """``df`` with the endpoint each row resolves to as three string columns:
    ``<prefix>uri``, ``<prefix>partition`` and ``<prefix>label``.

    ``key`` is the column holding the shard key. Rows are resolved per (Spark partition,
    shard partition) group as in :func:`resolve_partitions`; within a Spark partition they
    come back grouped by shard partition.
    """
    from pyspark.sql.types import StringType, StructField, StructType

    added = [StructField(f"{prefix}{name}", StringType(), True) for name in ENDPOINT_COLUMNS]
    schema = StructType([*df.schema.fields, *added])
    rows = resolve_partitions(df, service, _append_endpoint, key=key, policy=policy, config=config)
    return df.sparkSession.createDataFrame(rows, schema)


__all__ = ["ClientConfig", "get_client", "resolve_groups", "resolve_partitions", "with_endpoint"]
