"""Shared by the benchmarks: percentiles, tables, results files and a world to measure."""

from __future__ import annotations

import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sentinel import Sentinel
from sentinel.auth import ClientKeyring
from sentinel.auth.config import AuthConfig
from sentinel.tables import format_table
from sentinel.testing.zookeeper import LocalZooKeeper

RESULTS = Path(__file__).resolve().parent / "results"


@contextmanager
def server_process(script: str, *args: str) -> Iterator[int]:
    """Run ``script`` (Python source that prints its server's port, then serves until its
    input ends) in a process of its own, so that the server's threads do not share the
    benchmark's interpreter lock; yields the port and stops the server on exit."""
    with subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdin is not None and process.stdout is not None
        try:
            yield int(process.stdout.readline())
        finally:
            process.stdin.close()  # end of input: the server returns and exits
            process.wait(timeout=10)


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50, p95, p99, max and the 101 percentiles of ``samples`` (nearest-rank)."""
    ordered = sorted(samples)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    return {
        "p50": rank(0.50),
        "p95": rank(0.95),
        "p99": rank(0.99),
        "max": ordered[-1],
        "n": len(ordered),
        "quantiles": [rank(max(q, 1) / 100) for q in range(101)],
    }


def median_of(rounds: Sequence[dict[str, float]], field: str) -> float:
    """The median over rounds of one figure."""
    return statistics.median(r[field] for r in rounds)


def report(
    name: str, title: str, headers: Sequence[str], rows: Sequence[Sequence[object]], data: dict
) -> None:
    """Print a table and write ``benchmarks/results/<name>.json``."""
    print(f"\n{title}")
    print(format_table(rows, headers=headers))
    RESULTS.mkdir(exist_ok=True)
    document = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "python": platform.python_version(),
            "cpus": _cpus(),
            "platform": platform.platform(),
        },
        **data,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(document, indent=2))
    print(f"(written to {path.relative_to(RESULTS.parent.parent)})")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def build_world(
    client: Sentinel,
    *,
    service: str,
    instances: int,
    partitions: int,
    keys: int,
    policy: str = "tenants",
    create_policy: bool = True,
) -> list[str]:
    """A sharded service: ``instances`` spread over ``partitions``, ``keys`` tenant keys.

    Returns the keys. Instances are registered by ``client``; keep it open while measuring.
    """
    names = [f"p{i}" for i in range(partitions)]
    if create_policy:
        client.shard_maps.create(policy, "directory", partitions=names)
    client.ensure_service(service, scheme="postgresql", shard_policy=policy)
    for i in range(instances):
        client.register(
            service,
            names[i % partitions],
            f"10.{i // 250}.{i % 250}.1",
            5432,
            scheme="postgresql",
            label=f"r{i}",
        )
    tenant_keys = [f"tenant-{i:07d}" for i in range(keys)]
    batch = 100_000
    for start in range(0, keys, batch):
        client.shard_maps.assign_many(
            policy,
            {
                k: names[(start + j) % partitions]
                for j, k in enumerate(tenant_keys[start : start + batch])
            },
        )
    return tenant_keys


@contextmanager
def writer_and_reader() -> Iterator[tuple[LocalZooKeeper, Sentinel, Sentinel]]:
    """A fresh ZooKeeper with two clients: one builds the world, the other is measured."""
    with (
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "bench-writer") as writer,
        Sentinel(
            zk.connect_string, "bench-reader", auth=AuthConfig(keys=ClientKeyring.generate())
        ) as reader,
    ):
        yield zk, writer, reader


def compile_peer(
    build: Path, source: Path, jars: tuple[str, ...], main: str, install: str
) -> tuple[list[str] | None, str]:
    """Compile a Java peer against Debian's ``jars`` into ``build``: the java command prefix
    that runs its ``main`` class, or None and why it cannot run (``install`` says what to
    install)."""
    if not (shutil.which("java") and shutil.which("javac")):
        return None, f"no java/javac: {install}"
    paths = [Path("/usr/share/java") / f"{name}.jar" for name in jars]
    missing = [j.name for j in paths if not j.is_file()]
    if missing:
        return None, f"missing {', '.join(missing)}: {install}"
    classpath = ":".join(map(str, paths))
    compiled = subprocess.run(
        # Classes beside the source (a stand-in for a framework's) are compiled with it.
        [
            "javac",
            "-d",
            str(build),
            "-cp",
            classpath,
            "-sourcepath",
            str(source.parent),
            str(source),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if compiled.returncode != 0:
        return None, f"javac failed: {compiled.stderr.strip()[:300]}"
    return ["java", "-Xmx512m", "-cp", f"{build}:{classpath}", main], ""
