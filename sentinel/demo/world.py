"""The demo's databases: per partition a primary and replicas that replay it, as SQLite files.

Each replica is a copy of its primary that replays the primary's new orders (the log is the
``seq`` column) unless it is paused; its lag is measured as PostgreSQL's
``now() - pg_last_xact_replay_timestamp()`` would be: how long ago the oldest order it has not
replayed was committed (0 when caught up), by the metric collector sidecar (``sentinel
collector run`` with :func:`replica_lag` as its ``python`` source). Each replica is registered
by its own publisher process (:mod:`sentinel.demo.replica`), whose ZooKeeper session is the
replica's liveness.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from subprocess import Popen

from sentinel.registry.endpoint import Endpoint

log = logging.getLogger(__name__)

SCHEMA = (
    "CREATE TABLE orders (seq INTEGER PRIMARY KEY, tenant TEXT NOT NULL, "
    "amount INTEGER NOT NULL, committed_at REAL NOT NULL)"
)
Totals = dict[str, tuple[int, int]]  # tenant -> (orders, sum of amounts)


@contextlib.contextmanager
def connect(path: Path | str, *, read_only: bool = False) -> Iterator[sqlite3.Connection]:
    """A connection to one database file; read-only ones fail if the file is gone."""
    uri = f"file:{path}?mode={'ro' if read_only else 'rwc'}"
    db = sqlite3.connect(uri, uri=True, timeout=10)
    try:
        with db:
            yield db
    finally:
        db.close()


def totals(db: sqlite3.Connection, tenants: Sequence[str]) -> Totals:
    """Orders and their sum per tenant (tenants without orders are left out)."""
    marks = ",".join("?" * len(tenants))
    query = f"SELECT tenant, count(*), sum(amount) FROM orders WHERE tenant IN ({marks}) GROUP BY 1"
    return {tenant: (count, total) for tenant, count, total in db.execute(query, tuple(tenants))}


class Partition:
    """One shard partition's primary database and its replicas, in ``directory``."""

    def __init__(self, directory: Path, name: str, labels: Sequence[str]) -> None:
        self.name = name
        self.primary = directory / f"{name}-primary.sqlite"
        self.replicas = {label: directory / f"{name}-{label}.sqlite" for label in labels}
        self.paused: set[str] = set()
        self._gone: set[str] = set()
        self._lock = threading.Lock()
        for path in (self.primary, *self.replicas.values()):
            with connect(path) as db:
                db.execute(SCHEMA)

    def write(self, orders: Sequence[tuple[str, int]]) -> None:
        """Commit ``orders`` (tenant, amount) on the primary."""
        now = time.time()
        with connect(self.primary) as db:
            db.executemany(
                "INSERT INTO orders (tenant, amount, committed_at) VALUES (?, ?, ?)",
                [(tenant, amount, now) for tenant, amount in orders],
            )

    def replay(self) -> None:
        """Bring every running replica up to the primary (a paused or removed one stays)."""
        with self._lock:
            for label, path in self.replicas.items():
                if label in self.paused or label in self._gone:
                    continue
                with connect(path) as db:
                    db.execute("ATTACH DATABASE ? AS primary_db", (str(self.primary),))
                    db.execute(
                        "INSERT INTO orders SELECT * FROM primary_db.orders "
                        "WHERE seq > (SELECT coalesce(max(seq), 0) FROM main.orders)"
                    )

    def destroy(self, label: str) -> None:
        """Remove a replica's database, as a dead host takes its disk with it."""
        with self._lock:
            self._gone.add(label)
            self.replicas[label].unlink()

    def primary_totals(self, tenants: Sequence[str]) -> Totals:
        """The primary's answer: what every replica should say once caught up."""
        with connect(self.primary, read_only=True) as db:
            return totals(db, tenants)


def replication_lag(replica: Path | str, primary: Path | str) -> float:
    """Seconds since the oldest order ``replica`` has not replayed was committed on
    ``primary`` (0 when caught up); sqlite3.Error when the replica cannot be read."""
    with connect(replica, read_only=True) as db:
        (applied,) = db.execute("SELECT coalesce(max(seq), 0) FROM orders").fetchone()
    with connect(primary, read_only=True) as db:
        row = db.execute(
            "SELECT min(committed_at) FROM orders WHERE seq > ?", (applied,)
        ).fetchone()
    return 0.0 if row[0] is None else max(time.time() - row[0], 0.0)


def replica_lag(endpoint: Endpoint, timeout: float) -> dict[str, float]:
    """The collector sidecar's ``python`` source for the demo's replicas: each instance names
    its database and its primary's in its properties. A replica whose database is gone raises,
    so the collector publishes nothing and its last value ages."""
    lag = replication_lag(endpoint.properties["path"], endpoint.properties["primary"])
    return {"replication_lag": round(lag, 3)}


COLLECTOR_CONFIG = """\
cluster = "demo"
[[services]]
service = "{service}"
interval = "{every}"
jitter = "20ms"
timeout = "{every}"
[services.source]
{source}"""


def collector_sidecar(
    hosts: str,
    namespace: str,
    service: str,
    workdir: Path,
    source: tuple[str, dict[str, str]],
    every: str,
) -> Popen[str]:
    """Start ``sentinel collector run`` for the demo's replicas, collecting ``every`` (a
    duration; also the timeout), stop it with SIGTERM; ``source`` is the
    ``[services.source]`` table and the environment it needs."""
    table, env = source
    config = workdir / "collector.toml"
    config.write_text(COLLECTOR_CONFIG.format(service=service, source=table, every=every))
    command = ["collector", "run", "--config", str(config), "--zk", hosts, "--namespace", namespace]
    return subprocess.Popen(
        [sys.executable, "-m", "sentinel.cli", *command],
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **env},
    )


class Ticker:
    """Calls ``action`` every ``interval`` seconds on a thread of its own until stopped."""

    def __init__(self, action: Callable[[], None], interval: float) -> None:
        self._action = action
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-ticker", daemon=True)

    def start(self) -> None:
        """Call ``action`` once now, then every ``interval`` seconds."""
        self._action()
        self._thread.start()

    def stop(self) -> None:
        """Stop calling; waits for a call under way."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._action()
            except Exception:  # the next round tries again, as a daemon would
                log.exception("demo background round failed")


class ReplicaPublishers:
    """One publisher process per replica, each registering its replica with its own session."""

    def __init__(self) -> None:
        self._processes: dict[str, subprocess.Popen[str]] = {}

    def start(self, name: str, *args: str) -> None:
        """Start the publisher ``name`` (``python -m sentinel.demo.replica ARGS``), no wait."""
        self._processes[name] = subprocess.Popen(
            [sys.executable, "-m", "sentinel.demo.replica", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def wait_ready(self, timeout: float) -> None:
        """Wait until every publisher has said it registered; raise RuntimeError if one did not."""
        deadline = time.monotonic() + timeout
        for name, process in self._processes.items():
            assert process.stdout is not None
            ready = threading.Timer(max(deadline - time.monotonic(), 0.0), process.kill)
            ready.start()
            line = process.stdout.readline()
            ready.cancel()
            if line.strip() != "registered":
                raise RuntimeError(
                    f"replica publisher {name} did not register (exit {process.poll()})"
                )

    def kill(self, name: str) -> None:
        """SIGKILL a publisher, as a crash would: its session ends only when it times out."""
        process = self._processes[name]
        process.send_signal(signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        """End every publisher that still runs (closing stdin asks it to leave)."""
        for process in self._processes.values():
            if process.poll() is None and process.stdin is not None:
                process.stdin.close()
        for process in self._processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
