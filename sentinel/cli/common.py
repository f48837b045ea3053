"""What every command shares: connection options, output, exit codes."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from sentinel.auth import acl
from sentinel.client import DEFAULT_NAMESPACE, Sentinel
from sentinel.devserver import resolve_hosts
from sentinel.errors import (
    LauncherError,
    NamespaceNotFound,
    SentinelError,
    ValidationError,
    ZooKeeperUnavailable,
)
from sentinel.layout import validate_namespace
from sentinel.output import format_table
from sentinel.transport import PollHandler

EXIT_OK = 0
EXIT_NOT_FOUND = 1  # not found, nothing eligible, problems found
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_LAUNCH_FAILED = 4


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """``--zk``, ``--namespace``, ``--timeout`` and ``--json`` for a command."""
    parser.add_argument(
        "--zk", metavar="HOSTS", help="ensemble to use (default: $SENTINEL_ZK, then `sentinel zk`)"
    )
    parser.add_argument(
        "--namespace", default=DEFAULT_NAMESPACE, help="namespace root (default %(default)s)"
    )
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for ZooKeeper (default 5)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def add_command(
    commands: argparse._SubParsersAction,
    name: str,
    handler: Callable[[argparse.Namespace], int],
    summary: str,
    description: str,
) -> argparse.ArgumentParser:
    """A subcommand that talks to ZooKeeper: its parser, connection options and handler."""
    parser = commands.add_parser(name, help=summary, description=description)
    add_connection_options(parser)
    parser.set_defaults(handler=handler)
    return parser


def print_json(document: Any) -> None:
    """One JSON document on stdout."""
    print(json.dumps(document, indent=2, sort_keys=True, default=str))


def print_table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> None:
    """An aligned table on stdout, or a note when there is nothing to show."""
    print(format_table(rows, headers=headers) if rows else "(none)")


@contextlib.contextmanager
def connect(
    args: argparse.Namespace, *, create: bool = False, identity: str | None = None
) -> Iterator[KazooClient]:
    """A plain kazoo client rooted at the namespace, for operator commands.

    It acts as ``identity`` (``user:password``; default ``$SENTINEL_ZK_IDENTITY``) in a
    secured namespace.

    Raises ZooKeeperUnavailable, or NamespaceNotFound if the namespace does not exist and
    ``create`` is false (reading commands never create it).
    """
    hosts = resolve_hosts(args.zk)
    namespace = validate_namespace(args.namespace)
    zk = KazooClient(
        hosts=f"{hosts}{namespace}",
        timeout=max(args.timeout, 2.0),
        handler=PollHandler(),
        **acl.client_arguments(identity or os.environ.get(acl.IDENTITY_ENV) or None),
    )
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No chroot path exists")
            zk.start(timeout=args.timeout)
    except KazooTimeoutError:
        raise ZooKeeperUnavailable(
            f"no ZooKeeper server at {hosts} answered within {args.timeout:g}s"
        ) from None
    try:
        if create:
            zk.ensure_path("/")
        elif zk.exists("/") is None:
            raise NamespaceNotFound(
                f"namespace {namespace} does not exist on {hosts}: create it with "
                f"`sentinel init --namespace {namespace}`"
            )
        yield zk
    finally:
        zk.stop()
        zk.close()


def client(args: argparse.Namespace) -> Sentinel:
    """A started Sentinel client that does not announce itself under ``/clients``."""
    return Sentinel(
        hosts=args.zk,
        client_id=f"sentinel-cli-{os.getpid()}",
        namespace=args.namespace,
        connect_timeout=args.timeout,
        announce=False,
    ).start()


def exit_code(exc: SentinelError) -> int:
    """The exit code for an error that ended a command."""
    if isinstance(exc, ValidationError):
        return EXIT_USAGE
    if isinstance(exc, ZooKeeperUnavailable):
        return EXIT_UNREACHABLE
    if isinstance(exc, LauncherError):
        return EXIT_LAUNCH_FAILED
    return EXIT_NOT_FOUND  # not found, nothing eligible, or any other refusal


def fail(message: str, code: int) -> int:
    """Say what went wrong on stderr and return ``code``."""
    print(f"sentinel: error: {message}", file=sys.stderr)
    return code


class Progress:
    """A one-line progress counter on stderr, shown only when stderr is a terminal."""

    def __init__(self, total: int, label: str) -> None:
        self.total = total
        self.label = label
        self.done = 0
        self._shown = sys.stderr.isatty() and total > 0

    def advance(self, count: int = 1) -> None:
        """Count ``count`` more items done."""
        self.done += count
        if self._shown:
            width = 30
            filled = width * self.done // self.total
            print(
                f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}",
                end="",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        """End the line."""
        if self._shown:
            print(file=sys.stderr)
