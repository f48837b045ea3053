"""The ``sentinel`` command line.

Exit codes: 0 success; 1 not found / not running; 2 usage or bad input; 3 ZooKeeper
unreachable; 4 ZooKeeper could not be started (not installed, or it failed).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from sentinel.client import DEFAULT_NAMESPACE
from sentinel.devserver import (
    dev_server,
    dev_server_mode,
    start_dev_server,
    state_dir,
    stop_dev_server,
)
from sentinel.errors import LauncherError, SentinelError, ValidationError, ZooKeeperUnavailable
from sentinel.output import format_table
from sentinel.version import __version__

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_LAUNCH_FAILED = 4


def _emit(
    args: argparse.Namespace, document: dict[str, Any], rows: Sequence[tuple[str, Any]]
) -> None:
    """Print ``document`` as JSON with ``--json``, else ``rows`` as an aligned table."""
    if args.json:
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        print(format_table(rows))


def _zk_start(args: argparse.Namespace) -> int:
    server, started = start_dev_server(timeout=args.timeout)
    _emit(
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


def _zk_status(args: argparse.Namespace) -> int:
    server = dev_server()
    if server is None:
        _emit(args, {"running": False, "state_dir": str(state_dir())}, [("status", "not running")])
        return EXIT_NOT_FOUND
    mode = dev_server_mode(server)
    uptime = time.time() - server.started_at
    _emit(
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


def _zk_stop(args: argparse.Namespace) -> int:
    stopped = stop_dev_server()
    _emit(args, {"stopped": stopped}, [("status", "stopped" if stopped else "was not running")])
    return EXIT_OK if stopped else EXIT_NOT_FOUND


def _demo(args: argparse.Namespace) -> int:
    from sentinel.demo import run_demo

    return EXIT_OK if run_demo(print, hosts=args.zk, namespace=args.namespace) else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``sentinel`` command."""
    parser = argparse.ArgumentParser(
        prog="sentinel",
        description="Service discovery on ZooKeeper for partitioned, multi-tenant services.",
        epilog="Exit codes: 0 ok, 1 not found, 2 bad input, 3 ZooKeeper unreachable, "
        "4 ZooKeeper could not be started.",
    )
    parser.add_argument("--version", action="version", version=f"sentinel {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    zk = commands.add_parser(
        "zk",
        help="run a local development ZooKeeper",
        description="Start, stop or inspect a local standalone ZooKeeper that other commands "
        "and clients use when neither --zk nor SENTINEL_ZK is given. Its data lives in "
        "$SENTINEL_STATE_DIR (default ~/.local/state/sentinel).",
    )
    zk_commands = zk.add_subparsers(dest="zk_command", required=True, metavar="ACTION")
    for name, handler, text in (
        ("start", _zk_start, "start the server in the background (no-op if it runs)"),
        ("status", _zk_status, "show whether it runs and where (exit 1 if not running)"),
        ("stop", _zk_stop, "stop it (exit 1 if it was not running)"),
    ):
        action = zk_commands.add_parser(name, help=text, description=text)
        action.add_argument("--json", action="store_true", help="print JSON for scripts")
        action.set_defaults(handler=handler)
        if name == "start":
            action.add_argument(
                "--timeout", type=float, default=60.0, help="seconds to wait for it to serve"
            )

    demo = commands.add_parser(
        "demo",
        help="run the end-to-end demonstration against a real ZooKeeper",
        description="Starts a throw-away ZooKeeper (unless --zk is given), maps tenants to "
        "partitions with a shard policy, registers replicas, resolves every tenant from a "
        "second client's cache, then moves a tenant, expires the publisher's session, drains "
        "a replica and closes the publisher, timing how fast each change reaches the cache. "
        "Exits 1 if a check fails.",
    )
    demo.add_argument("--zk", metavar="HOSTS", help="use this ensemble instead of starting one")
    demo.add_argument(
        "--namespace",
        default=f"{DEFAULT_NAMESPACE}-demo",
        help="namespace root to use (removed at the end; default %(default)s)",
    )
    demo.set_defaults(handler=_demo)
    return parser


def _exit_code(exc: SentinelError) -> int:
    if isinstance(exc, ValidationError):
        return EXIT_USAGE
    if isinstance(exc, ZooKeeperUnavailable):
        return EXIT_UNREACHABLE
    if isinstance(exc, LauncherError):
        return EXIT_LAUNCH_FAILED
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except SentinelError as exc:
        print(f"sentinel: error: {exc}", file=sys.stderr)
        return _exit_code(exc)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
