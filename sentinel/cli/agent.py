"""``sentinel agent``: the host agent daemon (one ZooKeeper session for a host's processes)."""

from __future__ import annotations

import argparse
import signal
import socket

from sentinel.cli.common import (
    event_printer,
    serve_metrics,
    tls_config,
)
from sentinel.cli.options import (
    EXIT_OK,
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
        )
        report = event_printer(args, {"serving": lambda details: f"serving {details['socket']}"})
        with server:
            report("serving", {"socket": server.path})
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: server.stop())
            server.run()
    return EXIT_OK
