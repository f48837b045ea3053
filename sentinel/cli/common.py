"""What every command shares: connection options, output, exit codes."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from prometheus_client import start_http_server

from sentinel.cache.config import CacheConfig
from sentinel.cli.output import format_table
from sentinel.client import DEFAULT_NAMESPACE, Sentinel
from sentinel.connection import client_arguments, unavailable
from sentinel.devserver import resolve_hosts, validate_hosts
from sentinel.errors import (
    DevServerNotRunning,
    LauncherError,
    NamespaceNotFound,
    RegistryError,
    SentinelError,
    ValidationError,
    ZooKeeperUnavailable,
)
from sentinel.plugins import available
from sentinel.registry.layout import validate_namespace
from sentinel.zk import tls
from sentinel.zk.errors import translate

EXIT_OK = 0
EXIT_NOT_FOUND = 1  # not found, nothing eligible, problems found
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_LAUNCH_FAILED = 4


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


def add_verbose_option(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """``-v``, accepted before and after the subcommand (see :func:`add_zk_options`)."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0 if top else argparse.SUPPRESS,
        help="log more (-v info, -vv debug)",
    )


def add_zk_options(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """``--zk``, the ``--zk-tls`` options and ``--namespace``, accepted before and after the
    subcommand.

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
        help=f"namespace root (default {DEFAULT_NAMESPACE})",
        **({"default": DEFAULT_NAMESPACE} if top else default),
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
    handler: Callable[[argparse.Namespace], int],
    summary: str,
    description: str,
    examples: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """A subcommand that talks to ZooKeeper: its parser, connection options and handler."""
    parser = add_parser(commands, name, summary, description, examples)
    add_connection_options(parser)
    parser.set_defaults(handler=handler)
    return parser


SERVICE_HELP = "a service's name, as registered (`sentinel ls` lists them)"
KEY_HELP = (
    "a shard key (tenant, customer id...) of a sharded service: its shard policy maps it to "
    "a partition; ignored by an unsharded service"
)


def plugin_help(group: str, what: str, example: str) -> str:
    """The help of ``--policy`` or ``--balancer``: the syntax and the names registered now
    (entry points of ``group``: this package's and any installed plug-in's)."""
    return (
        f"{what}: an entry-point name, with arguments as k=v,k=v (values read as JSON when "
        f"they parse), e.g. {example}; registered: {', '.join(available(group))}"
    )


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


def serve_metrics(args: argparse.Namespace) -> None:
    """Serve the default registry's metrics if ``--metrics-port`` was given, and say where.

    The line goes to stderr (stdout is the daemon's event stream) before anything else runs,
    so that a supervisor started with port 0 can learn the port.
    """
    if args.metrics_port is None:
        return
    server, _ = start_http_server(args.metrics_port, args.metrics_addr)
    print(
        f"serving metrics on http://{args.metrics_addr}:{server.server_port}/metrics",
        file=sys.stderr,
        flush=True,
    )


class Daemon(Protocol):
    """A long-running role: ``run()`` until ``stop()``."""

    def run(self) -> None: ...

    def stop(self) -> None: ...


def event_printer(
    args: argparse.Namespace, formats: Mapping[str, Callable[[dict[str, Any]], str]]
) -> Callable[[str, dict[str, Any]], None]:
    """A daemon's ``report(kind, details)``: JSON lines with ``--json``, else one line per
    event, written by ``formats[kind]`` (default ``kind key=value ...``)."""

    def report(kind: str, details: dict[str, Any]) -> None:
        if args.json:
            print(json.dumps({"event": kind, **details}), flush=True)
        elif kind in formats:
            print(formats[kind](details), flush=True)
        else:
            print(" ".join([kind, *(f"{k}={v}" for k, v in details.items())]), flush=True)

    return report


def run_daemon(
    args: argparse.Namespace, client_id: str, start: Callable[[Sentinel], Daemon]
) -> int:
    """Serve metrics (``--metrics-port``), connect as ``client_id``, start the role, and run
    it until SIGINT or SIGTERM."""
    serve_metrics(args)
    with Sentinel(
        args.zk,
        client_id,
        args.namespace,
        connect_timeout=args.timeout,
        session_timeout=args.session_timeout,
        announce=False,
        tls=tls_config(args),
    ) as sentinel:
        sentinel.ensure_namespace()  # a role daemon may create it, as a publisher does
        daemon = start(sentinel)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: daemon.stop())
        daemon.run()
    return EXIT_OK


def print_json(document: Any) -> None:
    """One JSON document on stdout."""
    print(json.dumps(document, indent=2, sort_keys=True, default=str))


def colour_enabled(stream: TextIO) -> bool:
    """Whether text for ``stream`` may be coloured: only on a terminal, and never when
    ``NO_COLOR`` is set to anything (https://no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


def paint(text: str, colour: str | None) -> str:
    """``text`` in an ANSI colour (``"31"``: red, ``"33"``: yellow); as it is for None."""
    return f"\x1b[{colour}m{text}\x1b[0m" if colour else text


def print_table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> None:
    """An aligned table on stdout, or a note when there is nothing to show."""
    print(format_table(rows, headers=headers) if rows else "(none)")


def tls_config(args: argparse.Namespace) -> tls.TlsConfig | None:
    """The TLS settings of ``--zk-tls`` and its file options (each file defaulting to its
    environment variable), or None for plain TCP."""
    files = {"ca": args.zk_tls_ca, "certfile": args.zk_tls_cert, "keyfile": args.zk_tls_key}
    if not args.zk_tls and all(value is None for value in files.values()):
        return None
    return tls.TlsConfig.from_env(**files)


@contextlib.contextmanager
def connect(
    args: argparse.Namespace,
    *,
    create: bool = False,
    identity: str | None = None,
    chroot: bool = True,
) -> Iterator[KazooClient]:
    """A plain kazoo client rooted at the namespace, for operator commands.

    It acts as ``identity`` (``user:password``; default ``$SENTINEL_ZK_IDENTITY``) in a
    secured namespace, and uses TLS as ``--zk-tls`` says. With ``chroot`` false it is rooted at
    the ensemble's root instead, and the namespace is neither checked nor created (``import``
    creates it in its first write, so that a failed import leaves nothing behind).

    Raises ZooKeeperUnavailable, or NamespaceNotFound if the namespace does not exist and
    ``create`` is false (reading commands never create it).
    """
    hosts = resolve_hosts(args.zk)
    namespace = validate_namespace(args.namespace)
    zk = KazooClient(
        hosts=f"{hosts}{namespace if chroot else ''}",
        timeout=max(args.timeout, 2.0),
        **client_arguments(identity, tls_config(args)),
    )
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No chroot path exists")
            zk.start(timeout=args.timeout)
    except KazooTimeoutError:  # kazoo has stopped and closed the client
        raise unavailable(hosts, args.timeout, zk.handler) from None
    try:
        if not chroot:
            pass
        elif create:
            zk.ensure_path("/")
        elif zk.exists("/") is None:
            raise NamespaceNotFound(namespace, hosts)
        yield zk
    finally:
        zk.stop()
        zk.close()


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


def client(args: argparse.Namespace) -> Sentinel:
    """A started Sentinel client that does not announce itself under ``/clients``."""
    curator_paths = tuple(getattr(args, "curator_path", ()))
    return Sentinel(
        hosts=args.zk,
        client_id=f"sentinel-cli-{os.getpid()}",
        namespace=args.namespace,
        connect_timeout=args.timeout,
        announce=False,
        tls=tls_config(args),
        cache=CacheConfig(curator_base_paths=curator_paths),
    ).start()


def exit_code(exc: SentinelError) -> int:
    """The exit code for an error that ended a command (the table in ``docs/cli.md``)."""
    # No ZooKeeper given (no --zk, no $SENTINEL_ZK, no `sentinel zk start` server) is a
    # usage error: nothing failed to start, an option is missing.
    if isinstance(exc, ValidationError | DevServerNotRunning):
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


def read_input(file: str) -> str:
    """The text of an input file (``-``: stdin), which must be UTF-8.

    Raises ValidationError naming the file, and the line of the first byte that is not UTF-8.
    """
    try:
        raw = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    except OSError as exc:
        raise ValidationError(f"cannot read {file}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValidationError(
            f"{file}: line {line} is not UTF-8 (byte {raw[exc.start]:#04x})"
        ) from None


def parse_json(text: str, file: str) -> Any:
    """An input file's JSON document, every part of it storable in ZooKeeper as UTF-8 JSON.

    Raises ValidationError with the line of a syntax error, or the path inside the document
    (``nodes[3].json.lag``) of a NaN or infinite number or of a string holding a lone
    surrogate (``"\\ud800"``: no UTF-8 for it); a document nested deeper than Python's
    parser goes is refused too.
    """
    try:
        document = json.loads(text)
    except RecursionError:
        raise ValidationError(f"{file}: JSON nested too deeply to read") from None
    except ValueError as exc:
        raise ValidationError(f"{file} is not JSON: {exc}") from None
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:  # no recursion: the document may be as deep as the parser allowed
        where, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise ValidationError(
                f"{file}: {where or 'the document'} is {value}: not a number JSON has"
            )
        if isinstance(value, str):
            _check_encodable(value, file, where)
        elif isinstance(value, dict):
            for key, child in value.items():
                _check_encodable(key, file, f"{where} key {key!r}".lstrip())
                stack.append((f"{where}.{key}" if where else key, child))
        elif isinstance(value, list):
            stack.extend((f"{where}[{index}]", child) for index, child in enumerate(value))
    return document


def _check_encodable(text: str, file: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(
            f"{file}: {where or 'the document'}: {text!r} holds a lone surrogate (not UTF-8)"
        ) from None


def interrupted(
    exc: BaseException,
    operation: str,
    batch: int,
    batches: int,
    done: int,
    total: int,
    *,
    atomic: bool = True,
) -> BaseException:
    """The error that ends a batched write which failed in batch ``batch`` (1-based) of
    ``batches``: of the same kind as ``exc`` (so the exit code still says why), saying which
    batches were committed and how to resume (run the same command again: it writes only what
    still differs). A batch that is not ``atomic`` may have been committed in part."""
    error = (
        translate(exc, operation) if isinstance(exc, KazooException | KazooTimeoutError) else exc
    )
    if not isinstance(error, SentinelError):
        return exc
    committed = f"batches 1-{batch - 1} of {batches}" if batch > 1 else f"none of {batches} batches"
    message = (
        f"{error}; stopped in batch {batch}: {committed} are committed ({done} of {total} "
        f"changes), the rest is not{'' if atomic else f' (or batch {batch} in part)'}; "
        "run the same command again to resume"
    )
    try:
        return type(error)(message)
    except TypeError:  # an error class built from other arguments (DecodeError)
        return RegistryError(message)
