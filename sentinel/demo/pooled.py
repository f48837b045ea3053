"""What the demo's Spark job runs on the executors when its databases are PostgreSQL.

Each worker process keeps one :class:`~sentinel.integrations.postgres.ReplicaPools` on its
Sentinel client (:func:`~sentinel.integrations.spark.get_client`), created on first use and reused
by every
later task of the worker, and reads each tenant with ``pools.connection(key=tenant)``: the
least-lagging replica of the tenant's partition, another one when a connection cannot be had,
the credential of the moment. Which server answered and which role logged in are PostgreSQL's
own answers (``inet_server_port()``, ``current_user``), recorded in the progress file.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sentinel.demo.job import JobReads, record
from sentinel.integrations.postgres import ReplicaPools
from sentinel.integrations.spark import ClientConfig, get_client

if TYPE_CHECKING:
    from sentinel.strategies import SelectionPolicy

# Small pools, and a dead replica given up on quickly: the pools then try another one.
POOL_SETTINGS: dict[str, Any] = {
    "min_size": 1,
    "max_size": 2,
    "timeout": 2.0,
    "kwargs": {"connect_timeout": 2},
}
TOTALS = (
    "SELECT inet_server_port(), current_user, count(*), coalesce(sum(amount), 0) "
    "FROM orders WHERE tenant = %s"
)

_lock = threading.Lock()
_pools: dict[tuple[ClientConfig, str], ReplicaPools] = {}


def worker_pools(config: ClientConfig, service: str, policy: SelectionPolicy) -> ReplicaPools:
    """This worker process's pools for ``service``, created on first use."""
    with _lock:
        pools = _pools.get((config, service))
        if pools is None:
            # Pools of a departed replica or an old credential are closed without waiting for
            # their threads, on purpose; psycopg_pool warns about each one.
            logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
            client = get_client(config)
            pools = ReplicaPools(client, service, policy=policy, **POOL_SETTINGS)
            _pools[config, service] = pools
        return pools


def role_version(role: str) -> int:
    """The credential version of a role PostgresBackend made (``..._v<version>``)."""
    return int(role.rpartition("_v")[2])


@dataclass(frozen=True)
class PooledTotals:
    """``mapPartitions`` function: ``(tenant, orders, total, partition, label)`` per
    ``(tenant,)`` row, each tenant read through this worker's pools."""

    job: JobReads

    def __call__(self, rows: Iterable[Any]) -> list[tuple[Any, ...]]:
        pools = worker_pools(self.job.config, self.job.service, self.job.policy)
        return [self._read(pools, row[0]) for row in rows]

    def _read(self, pools: ReplicaPools, tenant: str) -> tuple[Any, ...]:
        try:
            with pools.connection(key=tenant) as conn:
                row = conn.execute(TOTALS, (tenant,)).fetchone()
            assert row is not None  # an aggregate without GROUP BY returns one row
            port, role, count, total = row
        except Exception as exc:
            error = type(exc).__name__
            record(
                self.job.progress, tenants=[tenant], replica="-", auth=None, ok=False, error=error
            )
            raise
        # The server that answered is alive, so its registration is in the cache.
        served = next(e for e in pools.client.cached_instances(self.job.service) if e.port == port)
        version = role_version(role)
        record(self.job.progress, tenants=[tenant], replica=served.name, auth=version, ok=True)
        return (tenant, count, int(total), served.partition, served.label)
