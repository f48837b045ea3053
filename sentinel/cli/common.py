"""What the commands' implementations share: connecting, output, errors and exit codes.

How commands are parsed is :mod:`sentinel.cli.options`; this module is imported only when a
command runs, and it loads the client (and the cache) only for the commands that use one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from sentinel.cli.options import (
    EXIT_OK,
)
from sentinel.connection import client_arguments, start_client
from sentinel.devserver import resolve_hosts
from sentinel.errors import (
    NamespaceNotFound,
    RegistryError,
    SentinelError,
    ValidationError,
)
from sentinel.registry.layout import SERVICES, validate_namespace
from sentinel.tables import format_table
from sentinel.zk import tls
from sentinel.zk.errors import translate

if TYPE_CHECKING:
    from sentinel.client import Sentinel


def serve_metrics(args: argparse.Namespace) -> None:
    """Serve the default registry's metrics if ``--metrics-port`` was given, and say where.

    The line goes to stderr (stdout is the daemon's event stream) before anything else runs,
    so that a supervisor started with port 0 can learn the port.
    """
    if args.metrics_port is None:
        return
    from prometheus_client import start_http_server

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
    from sentinel.client import Sentinel

    serve_metrics(args)
    with Sentinel(
        args.zk,
        client_id,
        args.namespace,
        connect_timeout=args.timeout,
        session_timeout=args.session_timeout,
        announce=False,
        tls=tls_config(args),
        identity=getattr(args, "region_identity", None),
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
        return getattr(args, "region_tls", None)  # the --region's, when it has TLS
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
    identity = identity or getattr(args, "region_identity", None)
    zk = KazooClient(
        hosts=f"{hosts}{namespace if chroot else ''}",
        timeout=max(args.timeout, 2.0),
        **client_arguments(identity, tls_config(args)),
    )
    start_client(zk, hosts, args.timeout)
    try:
        if not chroot:
            pass
        elif create:
            zk.ensure_path("/")
        elif zk.exists("/") is None:
            existing = _namespaces_beside(
                namespace, hosts, args.timeout, identity, tls_config(args)
            )
            raise NamespaceNotFound(namespace, hosts, existing)
        yield zk
    finally:
        zk.stop()
        zk.close()


#: At most this many nodes beside a missing namespace are looked at for the namespaces there.
NAMESPACES_LOOKED_AT = 256


def _namespaces_beside(
    namespace: str, hosts: str, timeout: float, identity: str | None, zk_tls: tls.TlsConfig | None
) -> tuple[str, ...] | None:
    """The Sentinel namespaces (nodes holding ``/services``) beside the missing ``namespace``,
    so that its error can point at the one meant rather than at creating a typo; None when
    they cannot be listed. A session of its own, rooted at the ensemble's root: the command's
    is rooted at the namespace, and sees nothing beside it."""
    parent = namespace.rsplit("/", 1)[0]
    zk = KazooClient(hosts=hosts, timeout=max(timeout, 2.0), **client_arguments(identity, zk_tls))
    try:
        start_client(zk, hosts, timeout)
    except SentinelError:
        return None
    try:
        children = sorted(zk.get_children(parent or "/"))[:NAMESPACES_LOOKED_AT]
        held = {f"{parent}/{c}": zk.exists_async(f"{parent}/{c}{SERVICES}") for c in children}
        return tuple(path for path, found in held.items() if found.get(timeout=timeout))
    except (KazooException, KazooTimeoutError):
        return None
    finally:
        zk.stop()
        zk.close()


def client(args: argparse.Namespace) -> Sentinel:
    """A started Sentinel client that does not announce itself under ``/clients``."""
    from sentinel.cache.config import CacheConfig
    from sentinel.client import Sentinel

    curator_paths = tuple(getattr(args, "curator_path", ()))
    return Sentinel(
        hosts=args.zk,
        client_id=f"sentinel-cli-{os.getpid()}",
        namespace=args.namespace,
        connect_timeout=args.timeout,
        announce=False,
        tls=tls_config(args),
        identity=getattr(args, "region_identity", None),
        cache=CacheConfig(curator_base_paths=curator_paths),
        regions=getattr(args, "regions_config", None) or False,
    ).start()


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
