"""How every command is parsed: option types, shared options, help, exit codes, handlers.

This module is all that ``sentinel`` imports before it knows which command runs, so that
``sentinel --help`` and every command start without loading what the others need: it imports
the standard library and a few light modules only, and a command's implementation is named
(:class:`Handler`) and imported when that command runs. ``tests/unit/test_cli_startup.py``
checks what ``sentinel --help`` imports.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from sentinel.devserver import validate_hosts
from sentinel.errors import (
    AddressInUse,
    DevServerNotRunning,
    LauncherError,
    RegionsFailed,
    SentinelError,
    ValidationError,
    ZooKeeperUnavailable,
)
from sentinel.registry.layout import DEFAULT_NAMESPACE
from sentinel.zk import tls

EXIT_OK = 0
EXIT_NOT_FOUND = 1  # not found, nothing eligible, problems found
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_LAUNCH_FAILED = 4


def exit_code(exc: SentinelError) -> int:
    """The exit code for an error that ended a command (the table in ``docs/cli.md``)."""
    if isinstance(exc, RegionsFailed):  # the worst region's: unreachable (3) before the rest
        return max(map(exit_code, exc.failures.values()), default=EXIT_NOT_FOUND)
    # No ZooKeeper given (no --zk, no $SENTINEL_ZK, no `sentinel zk start` server) is a
    # usage error: nothing failed to start, an option is missing.
    if isinstance(exc, ValidationError | DevServerNotRunning):
        return EXIT_USAGE
    if isinstance(exc, ZooKeeperUnavailable):
        return EXIT_UNREACHABLE
    if isinstance(exc, LauncherError | AddressInUse):  # a server that could not start
        return EXIT_LAUNCH_FAILED
    return EXIT_NOT_FOUND  # not found, nothing eligible, or any other refusal


def fail(message: str, code: int) -> int:
    """Say what went wrong on stderr and return ``code``."""
    print(f"sentinel: error: {message}", file=sys.stderr)
    return code


def zk_hosts(text: str) -> str:
    """``--zk``: a connect string (``host:port,...``), checked while the arguments are parsed
    so that a bad one is a usage error (exit 2)."""
    try:
        return validate_hosts(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seconds(text: str) -> float:
    """A duration option (``--timeout``): a finite number of seconds above zero."""
    value = _seconds(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds above 0")
    return value


def seconds_or_zero(text: str) -> float:
    """An age option (``--older-than``): a finite number of seconds, 0 or more."""
    value = _seconds(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds, 0 or more")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
    return value


def count(text: str) -> int:
    """A count option (``-n``): a whole number of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def port(text: str) -> int:
    """A port option (``--port``, ``--metrics-port``): 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} must be a port from 0 to 65535")
    return value


class HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions as argparse does, but keeps an ``Examples:`` epilog's lines as
    written (RawDescriptionHelpFormatter would leave the long descriptions unwrapped too)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("Examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return str(action.help) if isinstance(action.help, OnDemand) else action.help


class OnDemand:
    """An option's help written only when help is shown (its text needs a module that
    ``sentinel`` does not load to start): argparse asks it for ``strip()`` to see whether
    there is any, and :class:`HelpFormatter` for its text."""

    def __init__(self, text: Callable[[], str]) -> None:
        self._text = text

    def __str__(self) -> str:
        return self._text()

    def strip(self) -> str:
        """The text without surrounding blanks, as ``str.strip``."""
        return str(self).strip()


def add_verbose_option(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """``-v``, accepted before and after the subcommand (see :func:`add_zk_options`)."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0 if top else argparse.SUPPRESS,
        help="log more (-v info, -vv debug)",
    )


class GivenNamespace(argparse.Action):
    """``--namespace``: stored, and marked given (``namespace_given``) so that a
    ``--region``'s namespace fills only a namespace nobody gave."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.namespace_given = True


def add_zk_options(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """``--zk``, the ``--zk-tls`` options, ``--namespace``, ``--region`` and ``--regions``,
    accepted before and after the subcommand (:func:`sentinel.cli.regions.apply` fills the
    connection settings a region supplies).

    The top-level parser (``top``) holds the defaults; each subcommand's copy has
    ``default=SUPPRESS``, because argparse copies a subparser's defaults over the values the
    top-level parser already read (``sentinel --zk H ls`` would lose its ``--zk``).
    """
    default: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    parser.add_argument(
        "--zk",
        metavar="HOSTS",
        type=zk_hosts,
        help="ensemble to use, host:port,... (default: $SENTINEL_ZK, then `sentinel zk`)",
        **default,
    )
    parser.add_argument(
        "--zk-tls",
        action="store_true",
        help=f"connect over TLS (to secureClientPort); files from ${tls.CA_ENV}, "
        f"${tls.CERT_ENV} and ${tls.KEY_ENV} unless given below",
        **default,
    )
    for flag, dest, env, what in (
        ("--zk-tls-ca", "zk_tls_ca", tls.CA_ENV, "CA certificate(s) to verify the server with"),
        ("--zk-tls-cert", "zk_tls_cert", tls.CERT_ENV, "client certificate"),
        ("--zk-tls-key", "zk_tls_key", tls.KEY_ENV, "client certificate's private key"),
    ):
        parser.add_argument(
            flag,
            dest=dest,
            metavar="PEM",
            help=f"{what} (implies --zk-tls; default ${env})",
            **default,
        )
    parser.add_argument(
        "--namespace",
        action=GivenNamespace,
        help=f"namespace root (default {DEFAULT_NAMESPACE}, or the --region's)",
        **({"default": DEFAULT_NAMESPACE} if top else default),
    )
    parser.add_argument(
        "--region",
        metavar="NAME",
        help="the region to act in: its ensemble, namespace, TLS and identity from --regions "
        "unless given (default $SENTINEL_REGION)",
        **default,
    )
    parser.add_argument(
        "--regions",
        metavar="JSON|FILE",
        help="the regions: a JSON document or its file (default $SENTINEL_REGIONS; "
        "docs/regions.md)",
        **default,
    )


def add_parser(
    commands: argparse._SubParsersAction,
    name: str,
    summary: str,
    description: str,
    examples: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """A subcommand's parser: its one-line summary, its description, ``-v``, and the
    ``examples`` (command lines, ``# comment`` lines allowed) that end its ``--help``."""
    parser = commands.add_parser(
        name,
        help=summary,
        description=description,
        epilog="Examples:\n" + "".join(f"  {line}\n" for line in examples) if examples else None,
        formatter_class=HelpFormatter,
    )
    add_verbose_option(parser)
    return parser


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """The ZooKeeper options (:func:`add_zk_options`), ``--timeout`` and ``--json``."""
    add_zk_options(parser)
    parser.add_argument(
        "--timeout", type=seconds, default=5.0, help="seconds to wait for ZooKeeper (default 5)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def add_command(
    commands: argparse._SubParsersAction,
    name: str,
    handler: str,
    summary: str,
    description: str,
    examples: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """A subcommand that talks to ZooKeeper: its parser, connection options and ``handler``
    (``"module:function"``, see :class:`Handler`)."""
    parser = add_parser(commands, name, summary, description, examples)
    add_connection_options(parser)
    parser.set_defaults(handler=Handler(handler))
    return parser


SERVICE_HELP = "a service's name, as registered (`sentinel ls` lists them)"
KEY_HELP = (
    "a shard key (tenant, customer id...) of a sharded service: its shard policy maps it to "
    "a partition; ignored by an unsharded service"
)


def plugin_help(group: str, what: str, example: str) -> OnDemand:
    """The help of ``--policy`` or ``--balancer``: the syntax and the names registered now
    (entry points of ``group``: this package's and any installed plug-in's). The entry points
    are read only when the help is shown (:class:`HelpFormatter`), not on every start."""

    def text() -> str:
        from sentinel.plugins import available

        return (
            f"{what}: an entry-point name, with arguments as k=v,k=v (values read as JSON when "
            f"they parse), e.g. {example}; registered: {', '.join(available(group))}"
        )

    return OnDemand(text)


def add_metrics_option(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-addr`` for a daemon that serves Prometheus metrics."""
    parser.add_argument(
        "--metrics-port",
        type=port,
        metavar="PORT",
        help="serve Prometheus metrics on http://ADDR:PORT/metrics (0: any free port; "
        "default: not served)",
    )
    parser.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        help="address to serve metrics on (default %(default)s)",
    )


def add_curator_option(parser: argparse.ArgumentParser) -> None:
    """``--curator-path``: Curator x-discovery base paths a command's client also follows."""
    parser.add_argument(
        "--curator-path",
        action="append",
        default=[],
        metavar="PATH",
        help="also look a service up under this Apache Curator x-discovery base path (Curator, "
        "Spring Cloud Zookeeper, Dubbo), after the namespace; repeat for several",
    )


@dataclass(frozen=True)
class Handler:
    """A command's handler named as ``"module:function"`` under ``sentinel.cli``: the module
    is imported when the command runs (``handler(args)``), not while the parser is built."""

    target: str

    def resolve(self) -> Callable[[argparse.Namespace], int]:
        """The function itself (importing its module)."""
        module, _, function = self.target.partition(":")
        implementation: Callable[[argparse.Namespace], int] = getattr(
            import_module(f"sentinel.cli.{module}"), function
        )
        return implementation

    def __call__(self, args: argparse.Namespace) -> int:
        return self.resolve()(args)
