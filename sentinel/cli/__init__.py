"""The ``sentinel`` command line: one module per group of commands.

Exit codes: 0 success; 1 not found, nothing eligible or problems found; 2 usage or bad input;
3 ZooKeeper unreachable; 4 ZooKeeper could not be started (not installed, or it failed).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from sentinel.cli import auth, backup, deps, devzk, doctor, inspect, shard, watch
from sentinel.cli.common import exit_code, fail
from sentinel.errors import SentinelError
from sentinel.version import __version__
from sentinel.zkerrors import translate

COMMAND_GROUPS = (devzk, inspect, watch, deps, doctor, shard, backup, auth)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``sentinel`` command."""
    parser = argparse.ArgumentParser(
        prog="sentinel",
        description="Service discovery on ZooKeeper for partitioned, multi-tenant services.",
        epilog="Exit codes: 0 ok, 1 not found / nothing eligible / problems found, 2 bad "
        "input, 3 ZooKeeper unreachable, 4 ZooKeeper could not be started.",
    )
    parser.add_argument("--version", action="version", version=f"sentinel {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.verbose == 0:
        # kazoo logs every dropped connection as a warning; a command reports what matters.
        logging.getLogger("kazoo").setLevel(logging.ERROR)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except SentinelError as exc:
        return fail(str(exc), exit_code(exc))
    except (KazooException, KazooTimeoutError) as exc:
        error = translate(exc, f"sentinel {args.command}")
        return fail(str(error), exit_code(error))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
