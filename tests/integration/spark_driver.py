"""A Spark driver in a process of its own, for the standalone cluster test.

A process holds one SparkContext, and the test session's own is the local ``spark`` fixture,
so a job on another master needs another driver process. Run as ``python -m
tests.integration.spark_driver MASTER SETTINGS``: ``SETTINGS`` is JSON with ``conf`` (Spark
settings), ``config`` (a :class:`~sentinel.integrations.spark.ClientConfig`'s fields), ``service``,
``tasks`` and ``out``. One row per task goes through
:func:`~sentinel.integrations.spark.resolve_partitions`;
each task reports its Python worker: pid, parent (the executor's worker daemon), the daemon's
parent (the executor JVM) and the ZooKeeper session of the worker's client. The reports are
written to ``out`` as JSON; the driver then holds its executors, and their sessions, until its
standard input closes, so that the test can look at ZooKeeper meanwhile.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sentinel.integrations.spark import ClientConfig, get_client, resolve_partitions
from sentinel.registry.endpoint import Endpoint


def parent_of(pid: int) -> int:
    """The parent process id of ``pid``, from ``/proc/<pid>/stat`` (after the command name)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def main(master: str, settings: dict) -> None:
    from pyspark.sql import SparkSession

    config = ClientConfig(**settings["config"])

    def who(endpoint: Endpoint, rows: list) -> list[dict]:
        daemon = os.getppid()
        return [
            {
                "pid": os.getpid(),
                "daemon": daemon,
                "executor": parent_of(daemon),
                "session": get_client(config).session_id,
                "partition": endpoint.partition,
            }
        ]

    session = (
        SparkSession.builder.master(master)
        .appName("sentinel-standalone-test")
        .config(map=settings["conf"])
        .getOrCreate()
    )
    try:
        tasks = settings["tasks"]
        rdd = session.sparkContext.parallelize([(f"t{i:02d}",) for i in range(tasks)], tasks)
        reports = resolve_partitions(rdd, settings["service"], who, key=0, config=config).collect()
        out = Path(settings["out"])
        staged = out.with_suffix(".tmp")
        staged.write_text(json.dumps(reports))
        staged.replace(out)  # the test polls for the file: never half-written
        sys.stdin.read()
    finally:
        session.stop()


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
