"""``sentinel zk`` and ``sentinel demo``: their parsers
(implementation: :mod:`sentinel.cli.devzk`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import Handler, add_parser, port, seconds, zk_hosts
from sentinel.registry.layout import DEFAULT_NAMESPACE


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
            "devzk:_start",
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
            "devzk:_status",
            "show whether it runs and where (exit 1 if not running)",
            ("sentinel zk status", "sentinel zk status --json | jq -r .connect_string"),
        ),
        (
            "stop",
            "devzk:_stop",
            "stop it, keeping its data and port (exit 1 if it was not running)",
            (),
        ),
    ):
        action = add_parser(actions, name, text, text, examples or (f"sentinel zk {name}",))
        action.add_argument("--json", action="store_true", help="print JSON for scripts")
        action.set_defaults(handler=Handler(handler))
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
    demo.set_defaults(handler=Handler("devzk:_demo"))
