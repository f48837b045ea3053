"""The ``postgres`` source: a PostgreSQL replica's replication lag, asked of the replica.

Configuration::

    [services.source]
    type = "postgres"
    user = "monitor"               # default "postgres"
    dbname = "postgres"            # default
    password_env = "PGPASSWORD_MONITOR"   # the variable holding the password (optional)
    port = 5432                    # default: the instance's own port
    metric = "replication_lag"     # the name published (default)

The lag is ``now() - pg_last_xact_replay_timestamp()`` in seconds while the replica has
received WAL it has not replayed yet, and 0 when everything received is replayed (an idle,
caught-up replica whose last transaction is old is not lagging). A server that is not in
recovery (a primary) reports 0. A replica that has received WAL but never replayed a
transaction has no measurable lag: that collection fails rather than publish a guess.
The password is read from the environment at each collection and never logged.
Needs ``psycopg`` (from a checkout: ``pip install -e '.[postgres]'``).
"""

from __future__ import annotations

import math
import os

from sentinel.collector.options import Options
from sentinel.errors import SourceError, SourceTimeout
from sentinel.registry.endpoint import Endpoint

LAG_QUERY = """
SELECT pg_is_in_recovery(),
       pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn(),
       EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())::float8
"""
# libpq refuses connect timeouts under 2 s.
MIN_CONNECT_TIMEOUT = 2


class PostgresSource:
    """Connects to each replica and measures its replay lag."""

    type = "postgres"

    def __init__(
        self,
        user: str = "postgres",
        dbname: str = "postgres",
        password_env: str | None = None,
        port: int | None = None,
        metric: str = "replication_lag",
    ) -> None:
        self.user = user
        self.dbname = dbname
        self.password_env = password_env
        self.port = port
        self.metric = metric

    @classmethod
    def from_options(cls, options: Options) -> PostgresSource:
        """Read the ``[source]`` table."""
        try:
            import psycopg  # noqa: F401  (checked now so that a missing driver fails early)
        except ImportError:
            raise options.error(
                "type",
                "the postgres source needs psycopg: pip install -e '.[postgres]' in a checkout",
            ) from None
        port = options.number("port", None, minimum=1)
        return cls(
            user=options.string("user", "postgres"),
            dbname=options.string("dbname", "postgres"),
            password_env=options.string("password_env", None),
            port=None if port is None else int(port),
            metric=options.string("metric", "replication_lag"),
        )

    def collect(self, endpoint: Endpoint, timeout: float) -> dict[str, float]:
        """Ask the replica for its lag."""
        import psycopg

        where = f"{endpoint.host}:{self.port or endpoint.port}"
        password = os.environ.get(self.password_env) if self.password_env else None
        try:
            with psycopg.connect(
                host=endpoint.host,
                port=self.port or endpoint.port,
                user=self.user,
                dbname=self.dbname,
                password=password,
                connect_timeout=max(MIN_CONNECT_TIMEOUT, math.ceil(timeout)),
                options=f"-c statement_timeout={max(1, int(timeout * 1000))}",
                application_name="sentinel-collector",
                autocommit=True,
            ) as conn:
                row = conn.execute(LAG_QUERY).fetchone()
        except psycopg.errors.QueryCanceled:
            raise SourceTimeout(f"{where}: the lag query ran over {timeout:g}s") from None
        except psycopg.Error as exc:
            raise SourceError(f"{where}: {str(exc).strip()}") from None
        in_recovery, caught_up, since_replay = row
        if not in_recovery or caught_up:
            return {self.metric: 0.0}
        if since_replay is None:
            raise SourceError(f"{where}: the replica has not replayed a transaction yet")
        return {self.metric: max(since_replay, 0.0)}
