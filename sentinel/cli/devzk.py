"""Commands for a local machine: the development ZooKeeper and the demo."""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from sentinel.cli.common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNREACHABLE,
    add_parser,
    port,
    print_json,
    seconds,
    zk_hosts,
)
from sentinel.cli.output import format_table
from sentinel.client import DEFAULT_NAMESPACE
from sentinel.devserver import (
    dev_server,
    dev_server_mode,
    recorded_port,
    start_dev_server,
    state_dir,
    stop_dev_server,
)

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


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``zk`` and ``demo``."""
    zk = add_parser(
        commands,
        "zk",
        "run a local development ZooKeeper",
        "Start, stop or inspect a local standalone ZooKeeper that other commands "
        "and clients use when neither --zk nor SENTINEL_ZK is given. Its data lives in "
        "$SENTINEL_STATE_DIR (default ~/.local/state/sentinel) and is kept across stops; a "
        "start serves on the port of the last one, so running clients reconnect by themselves.",
        ("sentinel zk start", "sentinel zk status --json", "sentinel zk stop"),
    )
    actions = zk.add_subparsers(dest="zk_command", required=True, metavar="ACTION")
    for name, handler, text, examples in (
        (
            "start",
            _start,
            "start the server in the background (no-op if it runs) on the port of its last "
            "start, else on a free one; exit 4 if that port is taken",
            (
                "sentinel zk start",
                "sentinel zk start --port 2181      # this port from now on",
                "sentinel zk start --port 0         # a new free port",
            ),
        ),
        (
            "status",
            _status,
            "show whether it runs and where (exit 1 if not running)",
            ("sentinel zk status", "sentinel zk status --json | jq -r .connect_string"),
        ),
        ("stop", _stop, "stop it, keeping its data and port (exit 1 if it was not running)", ()),
    ):
        action = add_parser(actions, name, text, text, examples or (f"sentinel zk {name}",))
        action.add_argument("--json", action="store_true", help="print JSON for scripts")
        action.set_defaults(handler=handler)
        if name == "start":
            action.add_argument(
                "--timeout", type=seconds, default=60.0, help="seconds to wait for it to serve"
            )
            action.add_argument(
                "--port",
                type=port,
                help="port to serve on from now on (0: any free port; default: the last "
                "start's, else a free one)",
            )

    demo = add_parser(
        commands,
        "demo",
        "run the end-to-end demonstration against a real ZooKeeper",
        "Starts a throw-away ZooKeeper (unless --zk is given); a shard manager "
        "places tenants on partitions; each partition gets a primary and replica databases "
        "(PostgreSQL servers with streaming replicas when PostgreSQL is installed, else SQLite "
        "files), each replica registered by an publisher process, and a collector publishes "
        "their replication lag. A PySpark job then totals every tenant's orders, reading each "
        "tenant from the least-lagging replica of its partition. Half-way, one replica falls "
        "behind past the cut-off and another is killed; the job must read around both. "
        "Totals are checked against the primaries; exits 1 if a check fails. Its --namespace "
        "is its own (it is removed at the end): give it after `demo`.",
        (
            "sentinel demo",
            "sentinel demo --zk 127.0.0.1:2181 --tenants 24 --partitions 4",
            "sentinel demo --spark standalone   # on a master and 2 workers started here",
            "sentinel demo --master spark://spark-master:7077",
        ),
    )
    demo.add_argument(
        "--zk",
        metavar="HOSTS",
        type=zk_hosts,
        default=argparse.SUPPRESS,
        help="use this ensemble instead of starting one",
    )
    demo.add_argument(
        "--namespace",
        default=f"{DEFAULT_NAMESPACE}-demo",
        help="namespace root to use (removed at the end; default %(default)s)",
    )
    demo.add_argument("--tenants", type=int, default=12, help="tenants (default %(default)s)")
    demo.add_argument(
        "--partitions", type=int, default=3, help="shard partitions (default %(default)s)"
    )
    demo.add_argument(
        "--replicas", type=int, default=2, help="replicas per partition (default %(default)s)"
    )
    spark = demo.add_mutually_exclusive_group()
    spark.add_argument(
        "--master",
        default="local[2]",
        help="Spark master (default %(default)s; a cluster's workers must see this machine's "
        "files and have the package installed, see docs/spark.md)",
    )
    spark.add_argument(
        "--spark",
        choices=("local", "standalone"),
        default="local",
        help="local: run the job on --master (default); standalone: start a Spark standalone "
        "cluster here (a master and 2 workers, each a JVM, on 127.0.0.1) and a host agent "
        "(sentinel agent) whose one ZooKeeper session the executors' Python workers share, run "
        "the job on it and stop it",
    )
    demo.add_argument(
        "--databases",
        choices=("postgresql", "sqlite"),
        help="PostgreSQL servers with streaming replicas, or SQLite files (default: "
        "postgresql when it is installed, else sqlite)",
    )
    demo.set_defaults(handler=_demo)
