"""Commands for a local machine: the development ZooKeeper and the demo."""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from sentinel.cli.common import (
    print_json,
)
from sentinel.cli.options import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNREACHABLE,
)
from sentinel.devserver import dev_server, recorded_port, state_dir
from sentinel.tables import format_table
from sentinel.testing.devserver import dev_server_mode, start_dev_server, stop_dev_server

if TYPE_CHECKING:
    from sentinel.testing.spark import LocalSparkCluster


def _show(args: argparse.Namespace, document: dict, rows: list[tuple[str, object]]) -> None:
    if args.json:
        print_json(document)
    else:
        print(format_table(rows))


def _start(args: argparse.Namespace) -> int:
    server, started = start_dev_server(timeout=args.timeout, port=args.port)
    _show(
        args,
        {**asdict(server), "started": started},
        [
            ("status", "started" if started else "already running"),
            ("connect", server.connect_string),
            ("pid", server.pid),
            ("data", server.directory),
        ],
    )
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    server = dev_server()
    if server is None:
        next_port = recorded_port()
        _show(
            args,
            {"running": False, "state_dir": str(state_dir()), "port": next_port},
            [("status", "not running"), ("next start", f"port {next_port or 'any free'}")],
        )
        return EXIT_NOT_FOUND
    mode = dev_server_mode(server)
    uptime = time.time() - server.started_at
    _show(
        args,
        {**asdict(server), "running": True, "mode": mode, "uptime_seconds": round(uptime, 1)},
        [
            ("status", "running" if mode else "running, not answering"),
            ("connect", server.connect_string),
            ("mode", mode),
            ("pid", server.pid),
            ("uptime", f"{uptime:.0f}s"),
            ("data", server.directory),
        ],
    )
    return EXIT_OK if mode else EXIT_UNREACHABLE


def _stop(args: argparse.Namespace) -> int:
    stopped = stop_dev_server()
    _show(args, {"stopped": stopped}, [("status", "stopped" if stopped else "was not running")])
    return EXIT_OK if stopped else EXIT_NOT_FOUND


def _demo(args: argparse.Namespace) -> int:
    from sentinel.demo import run_demo

    with contextlib.ExitStack() as stack:
        master, conf = args.master, {}
        if args.spark == "standalone":
            cluster = _standalone_cluster(stack)
            master, conf = cluster.master_url, cluster.driver_conf
        passed = run_demo(
            print,
            hosts=args.zk,
            namespace=args.namespace,
            tenants=args.tenants,
            partitions=args.partitions,
            replicas=args.replicas,
            master=master,
            spark_conf=conf,
            databases=args.databases,
            agent=args.spark == "standalone",  # one agent for the cluster's one host
        )
    return EXIT_OK if passed else 1


def _standalone_cluster(stack: contextlib.ExitStack) -> LocalSparkCluster:
    """``--spark standalone``: a master and two workers on loopback for the demo's job,
    stopped (with their executors) when ``stack`` closes."""
    from sentinel.testing.spark import LocalSparkCluster

    print("starting a Spark standalone cluster: a master and 2 workers on 127.0.0.1 ...")
    started = time.monotonic()
    stack.callback(print, "Spark cluster stopped: its master, workers and executors")
    cluster = stack.enter_context(LocalSparkCluster(workers=2))
    took = time.monotonic() - started
    print(f"  master {cluster.master_url}, {cluster.workers} workers alive after {took:.1f}s")
    return cluster
