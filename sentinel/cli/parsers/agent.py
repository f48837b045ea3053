"""``sentinel agent``: its parser (implementation: :mod:`sentinel.cli.agent`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import (
    add_command,
    add_curator_option,
    add_metrics_option,
    count,
    seconds,
)
from sentinel.cli.parsers.ui import add_ui_options

SOCKET_HELP = "the agent's Unix socket (default $SENTINEL_AGENT, else /run/sentinel/agent.sock)"


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``agent``."""
    agent = add_command(
        commands,
        "agent",
        "agent:_run",
        "the host agent: one ZooKeeper session shared by the host's processes",
        "Hold one ZooKeeper session for this host and serve the registry to the processes "
        "that connect to the Unix socket (Sentinel(agent=...) or $SENTINEL_AGENT): each gets "
        "the services it follows and their changes, and keeps its own lookups in process. "
        "Root, the agent's user and the --allow-uid/--allow-gid peers may connect (checked "
        "with SO_PEERCRED and SO_PEERGROUPS, supplementary groups included; the socket is made "
        "0600, or 0666 when others are allowed, and its directory must be writable by root or "
        "the agent's user alone). Processes trust the agent when it runs as root, as their "
        "own user or as $SENTINEL_AGENT_USER. Needs no identity of its own: a process's "
        "/clients entries are written as the identity it gives. Never creates the namespace. "
        "With --regions (or $SENTINEL_REGIONS), it also holds one session per other region "
        "for the processes that fail over there, each opened when the first of them needs it "
        "(a process names a region, never where it is). "
        "Runs until SIGINT or SIGTERM; prints 'serving PATH' once listening "
        "(--json: a JSON line). Exit 3 when ZooKeeper is unreachable.",
        (
            "sentinel agent",
            "sentinel agent --socket /run/sentinel/agent.sock --allow-gid 1001 --metrics-port 9466",
            "sentinel agent --region east --regions /etc/sentinel/regions.json  # and the others",
            "sentinel agent --xds unix:/run/sentinel/xds.sock   # gRPC clients too",
            "sentinel agent --xds unix:/run/sentinel/xds.sock --print-xds-bootstrap",
            "sentinel agent --ui 8470       # and its read-only dashboard on 127.0.0.1:8470",
            "sentinel agent status          # what a running agent serves, and to whom",
        ),
    )
    actions = agent.add_subparsers(dest="agent_command", metavar="ACTION")
    status = add_command(
        actions,
        "status",
        "agent:_status",
        "what a running agent serves: its session, its staleness, the processes connected",
        "Ask the agent on the socket for its ZooKeeper session's state, how stale its cache "
        "may be (seconds since the session was lost; 0 while connected), and each process "
        "connected to it (pid, client id) with the services it follows. Root and the agent's "
        "own user see every process; another user sees only the services its identity "
        "($SENTINEL_ZK_IDENTITY) may read, and the processes following them. Then each other "
        "region the agent is configured with: unopened until a process needs it, else its "
        "session's state, staleness and processes (counted for root and the agent's user). "
        "Exit 3 when no agent answers on the socket.",
        (
            "sentinel agent status",
            "sentinel agent status --socket /run/sentinel/agent.sock --json",
        ),
    )
    status.add_argument("--socket", metavar="PATH", help=SOCKET_HELP)
    agent.add_argument("--socket", metavar="PATH", help=SOCKET_HELP)
    agent.add_argument(
        "--allow-uid",
        type=int,
        action="append",
        default=[],
        metavar="UID",
        help="a user whose processes may connect besides root and the agent's own; repeat",
    )
    agent.add_argument(
        "--allow-gid",
        type=int,
        action="append",
        default=[],
        metavar="GID",
        help="a group whose processes may connect, as their primary or a supplementary group; "
        "repeat",
    )
    agent.add_argument(
        "--session-timeout",
        type=seconds,
        default=10.0,
        help="the agent's ZooKeeper session timeout in seconds (default 10)",
    )
    agent.add_argument(
        "--send-timeout",
        type=seconds,
        default=30.0,
        help="seconds a process may leave a frame unread before it is dropped (default 30)",
    )
    agent.add_argument(
        "--max-connections",
        type=count,
        default=4096,
        help="connections served at once; more are refused, each told why (default 4096)",
    )
    agent.add_argument(
        "--max-connections-per-uid",
        type=count,
        default=1024,
        help="connections (and xDS streams) served at once from one user (default 1024)",
    )
    agent.add_argument(
        "--hello-timeout",
        type=seconds,
        default=10.0,
        help="seconds a new connection has to say who it is before it is dropped (default 10)",
    )
    agent.add_argument(
        "--heartbeat",
        type=seconds,
        default=5.0,
        help="seconds of silence after which the agent and its processes send a heartbeat; "
        "either end silent for three is dropped, and the process is stale (default 5)",
    )
    agent.add_argument(
        "--xds",
        metavar="ADDRESS",
        help="also serve the cache as xDS (the Aggregated Discovery Service) to gRPC clients "
        "resolving xds:///SERVICE, on unix:PATH (or an absolute PATH) or on loopback "
        "(127.0.0.1:PORT); needs the xds extra (docs/grpc.md)",
    )
    agent.add_argument(
        "--print-xds-bootstrap",
        action="store_true",
        help="print the gRPC xDS bootstrap (JSON) of a process on this host for the agent at "
        "--xds, and exit without connecting: write it to the file $GRPC_XDS_BOOTSTRAP names, "
        "or put it in $GRPC_XDS_BOOTSTRAP_CONFIG",
    )
    agent.add_argument("--client-id", help="the agent's own name (default agent-HOST)")
    agent.add_argument(  # the frames before deltas, for benchmarks.agent to compare
        "--whole-state-frames", action="store_true", help=argparse.SUPPRESS
    )
    add_ui_options(agent, prefix="ui-")
    add_curator_option(agent)
    add_metrics_option(agent)
