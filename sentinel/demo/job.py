"""What the demo's Spark job runs on the executors (imported there, so kept importable alone).

The job aggregates orders per tenant, reading each tenant's partition from the replica
:func:`~sentinel.integrations.spark.resolve_partitions` resolved for it. Every read attempt, and the
moment a
worker's cache saw the midway lag change, is appended as one JSON line to a progress file that
the driver follows to print progress and to know when the first half of the job is done.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentinel.auth.backends import FileBackend
from sentinel.demo.world import connect, totals
from sentinel.integrations.spark import ClientConfig, get_client
from sentinel.registry.endpoint import Endpoint
from sentinel.testing.helpers import wait_until

if TYPE_CHECKING:
    from sentinel.strategies import SelectionPolicy

WAIT = 120.0


def record(progress: str, **event: Any) -> None:
    """Append one event to the progress file (small appends are atomic between processes)."""
    line = json.dumps({**event, "pid": os.getpid(), "at": time.time()}) + "\n"
    with open(progress, "a", encoding="utf-8") as file:
        file.write(line)


@dataclass(frozen=True)
class JobReads:
    """What the job's reads need, on the executors: plain values that pickle. It lives here,
    with what the executors run, so that the databases (which hand it to the job) and the
    pooled reads (which use it) both import it and not each other."""

    service: str
    config: ClientConfig  # how the workers reach Sentinel
    policy: SelectionPolicy
    progress: str  # the file every read attempt is appended to


@dataclass(frozen=True)
class Aggregate:
    """``fn`` of resolve_partitions: orders and their total per tenant, from ``endpoint``,
    logging in with ``endpoint.auth`` (the demo's databases accept what ``logins`` holds)."""

    progress: str
    logins: str
    client: str

    def __call__(self, endpoint: Endpoint, rows: Sequence[Any]) -> list[tuple[Any, ...]]:
        tenants = [row[0] for row in rows]
        version = None if endpoint.auth is None else endpoint.auth.version
        base = {"tenants": tenants, "replica": endpoint.name, "auth": version}
        try:
            credential = dict(endpoint.auth or {})
            if not FileBackend(self.logins).accepts(endpoint.service, self.client, credential):
                raise PermissionError(f"{endpoint.name} refused the login (v{version})")
            with connect(endpoint.properties["path"], read_only=True) as db:
                found = totals(db, tenants)
        except Exception as exc:
            record(self.progress, **base, ok=False, error=type(exc).__name__)
            raise
        record(self.progress, **base, ok=True)
        return [(t, *found.get(t, (0, 0)), endpoint.partition, endpoint.label) for t in tenants]


def release(go: str | Path, change: dict[str, Any]) -> None:
    """Write the ``go`` file :class:`Gate` waits for: the change its worker must see, or
    ``{"abort": why}`` when the driver failed (the second half then fails at once, saying why).
    Written aside and renamed: a worker polling for the file must never read it half-written."""
    go = Path(go)
    staged = go.with_suffix(".tmp")
    staged.write_text(json.dumps(change))
    staged.replace(go)


@dataclass(frozen=True)
class Gate:
    """Holds the job's second half until the driver has made its changes (the ``go`` file
    names the replica that must look lagging), then until this worker's cache shows it."""

    config: ClientConfig
    service: str
    first_half: int
    go: str
    progress: str

    def __call__(self, index: int, rows: Iterable[Any]) -> Iterable[Any]:
        if index < self.first_half:
            return rows
        go = Path(self.go)
        if wait_until(go.exists, WAIT) is None:
            raise TimeoutError("the driver never released the second half of the job")
        change = json.loads(go.read_text())
        if "abort" in change:
            raise RuntimeError(f"the driver stopped the job: {change['abort']}")
        client = get_client(self.config)

        def lagging() -> bool:
            cached = {e.name: e for e in client.cached_instances(self.service)}
            endpoint = cached.get(change["replica"])
            # A worker that has not loaded the service yet loads the current state.
            return not cached or (
                endpoint is not None
                and endpoint.metrics.get("replication_lag", 0) > change["cutoff"]
            )

        waited = wait_until(lagging, WAIT, interval=0.001)
        if waited is None:
            raise TimeoutError(f"{change['replica']}'s lag never reached this worker")
        record(self.progress, saw_lag=change["replica"], waited=waited)
        return rows
