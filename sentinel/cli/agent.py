"""``sentinel agent``: the host agent daemon (one ZooKeeper session for a host's processes)."""

from __future__ import annotations

import argparse
import signal
import socket

from sentinel.cli.common import (
    EXIT_OK,
    add_command,
    add_curator_option,
    add_metrics_option,
    count,
    event_printer,
    seconds,
    serve_metrics,
    tls_config,
)


def _run(args: argparse.Namespace) -> int:
    from sentinel.agent.protocol import socket_path
    from sentinel.agent.server import AgentServer
    from sentinel.cache.config import CacheConfig
    from sentinel.client import Sentinel
    from sentinel.registry.layout import sanitize_name

    serve_metrics(args)
    with Sentinel(
        args.zk,
        args.client_id or sanitize_name(f"agent-{socket.gethostname()}"),
        args.namespace,
        connect_timeout=args.timeout,
        session_timeout=args.session_timeout,
        announce=False,  # each process is announced under its own id, for as long as it is
        tls=tls_config(args),
        cache=CacheConfig(curator_base_paths=tuple(args.curator_path)),
        agent=False,  # the agent is the session: never an agent's client itself
    ) as sentinel:
        server = AgentServer(
            sentinel,
            socket_path(args.socket),
            allowed_uids=args.allow_uid,
            allowed_gids=args.allow_gid,
            send_timeout=args.send_timeout,
            max_connections=args.max_connections,
            max_connections_per_uid=args.max_connections_per_uid,
            hello_timeout=args.hello_timeout,
            heartbeat=args.heartbeat,
            deltas=not args.whole_state_frames,
        )
        report = event_printer(args, {"serving": lambda details: f"serving {details['socket']}"})
        with server:
            report("serving", {"socket": server.path})
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: server.stop())
            server.run()
    return EXIT_OK


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``agent``."""
    agent = add_command(
        commands,
        "agent",
        _run,
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
        "Runs until SIGINT or SIGTERM; prints 'serving PATH' once listening "
        "(--json: a JSON line). Exit 3 when ZooKeeper is unreachable.",
        (
            "sentinel agent",
            "sentinel agent --socket /run/sentinel/agent.sock --allow-gid 1001 --metrics-port 9466",
        ),
    )
    agent.add_argument(
        "--socket",
        metavar="PATH",
        help="the Unix socket to serve (default $SENTINEL_AGENT, else /run/sentinel/agent.sock)",
    )
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
        help="connections served at once from one user (default 1024)",
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
    agent.add_argument("--client-id", help="the agent's own name (default agent-HOST)")
    agent.add_argument(  # the frames before deltas, for benchmarks.agent to compare
        "--whole-state-frames", action="store_true", help=argparse.SUPPRESS
    )
    add_curator_option(agent)
    add_metrics_option(agent)
