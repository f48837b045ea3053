"""The local development ZooKeeper as a client finds it, and how a client finds the ensemble.

``sentinel zk start`` (:mod:`sentinel.testing.devserver`) runs one standalone server in the
background and records its connect string in a state file. A stop keeps the data directory and
the port, so the next start serves the same data at the same address and clients that outlived
the stop reconnect by themselves.
Every client and command picks its ensemble in this order: an explicit ``hosts`` / ``--zk``,
the ``SENTINEL_ZK`` environment variable, the running development server. The state lives in
``$SENTINEL_STATE_DIR`` (default ``$XDG_STATE_HOME/sentinel``, i.e. ``~/.local/state/sentinel``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from sentinel.errors import (
    DevServerNotRunning,
    InvalidConnectString,
)

log = logging.getLogger(__name__)

STATE_FILE = "zk.json"
PORT_FILE = "zk.port"  # the port of the last start, kept across stops
# What start_dev_server writes there: the port's decimal digits and a newline.
_PORT_TEXT = re.compile(rb"\s*([0-9]{1,5})\s*")
_PORT_FILE_MAX = 16  # bytes read at most: a longer file is not one start_dev_server wrote
_STATE_FILE_MAX = 4096  # the same for the state file (a pid, two paths and a time)
_FREE_PORT = "the next start takes a free port"
_NO_SERVER = "no development server is taken as running"
# One ``host[:port]`` of a connect string: the host, then the port if any.
_HOST_PORT = re.compile(r"(\[[^\]]*\]|\[.*|[^:]*)(?::(.*))?\Z", re.S)
# A host name or an IPv4 address (RFC 1123 labels; '_' as resolvers accept it), or a
# bracketed IPv6 address.
_HOST_NAME = re.compile(
    r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?\Z"
)
_IPV6 = re.compile(r"\[[0-9A-Fa-f:.]+\]\Z")
_HOSTS_EXAMPLE = "'zk1:2181,zk2:2181'"


def state_dir() -> Path:
    """Where the development server keeps its data and state file."""
    explicit = os.environ.get("SENTINEL_STATE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "sentinel"


@dataclass(frozen=True)
class DevServer:
    """A running development server, as recorded in the state file."""

    pid: int
    connect_string: str
    directory: str
    started_at: float


# What the state file's fields must be: it is read back by every `sentinel zk` call.
_STATE_TYPES = (
    ("pid", int),
    ("connect_string", str),
    ("directory", str),
    ("started_at", (int, float)),
)


def state_path() -> Path:
    return state_dir() / STATE_FILE


def is_our_process(pid: int, directory: str) -> bool:
    """Whether ``pid`` is still the server we started (pids are recycled)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return directory.encode() in cmdline


def dev_server() -> DevServer | None:
    """The running development server, or None (a stale state file is removed).

    A state file that is not what a start writes (a JSON object of :class:`DevServer`'s fields
    with their types, in a regular file of at most a few KB) is ignored with a warning that
    names it, and left in place for whoever wrote it.
    """
    path = state_path()
    text = _read_small_file(path, _STATE_FILE_MAX, _NO_SERVER)
    if text is None:
        return None
    try:
        server = DevServer(**json.loads(text))
        types_ok = all(isinstance(getattr(server, name), kind) for name, kind in _STATE_TYPES)
    except (ValueError, TypeError, RecursionError):
        types_ok = False
    if not types_ok:
        log.warning("ignoring %s: not the state a start writes; %s", path, _NO_SERVER)
        return None
    if is_our_process(server.pid, server.directory):
        return server
    path.unlink(missing_ok=True)
    return None


def _read_small_file(path: Path, limit: int, ignored: str) -> bytes | None:
    """At most ``limit`` bytes of ``path``, or None with a warning naming it and saying what
    ignoring it means (``ignored``) when it is not a regular file of at most that size; None
    with no warning when it does not exist.

    A symlink is followed; what it leads to must be a regular file: a FIFO or a device such as
    /dev/zero there would block the read or never end it.
    """
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is then refused.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("ignoring %s: %s; %s", path, exc.strerror, ignored)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            log.warning("ignoring %s: not a regular file; %s", path, ignored)
            return None
        text = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(text) > limit:
        log.warning("ignoring %s: longer than a start writes; %s", path, ignored)
        return None
    return text


def recorded_port() -> int | None:
    """The port the development server served on last (kept across stops), or None.

    None too, with a warning that names the file, when the file is not what a start writes (1
    to 5 decimal digits of a port from 1 to 65535, and a newline): the next start then takes a
    free port. A symlink is followed; what it leads to must be a regular file (a FIFO or a
    device such as /dev/zero there would block or never end the read), of which no more than
    a port's few bytes are read.
    """
    path = state_dir() / PORT_FILE
    text = _read_small_file(path, _PORT_FILE_MAX, _FREE_PORT)
    if text is None:
        return None
    match = _PORT_TEXT.fullmatch(text)
    port = int(match.group(1)) if match else 0
    if 0 < port < 65536:
        return port
    log.warning(
        "ignoring %s: it holds %r..., not a port from 1 to 65535; %s", path, text[:8], _FREE_PORT
    )
    return None


def bind_error(port: int, host: str = "127.0.0.1") -> OSError | None:
    """Why ``host``'s ``port`` cannot be listened on (``EADDRINUSE``: something listens
    there), or None; a socket in TIME_WAIT does not count: ZooKeeper and gRPC bind with
    SO_REUSEADDR too. The development server's port, and the agent's xDS port
    (:func:`sentinel.agent.xds_bootstrap.check_free`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None


def validate_hosts(hosts: object, source: str = "hosts") -> str:
    """Return a kazoo connect string (``host:port,host:port``) or raise InvalidConnectString.

    Each entry is ``host`` or ``host:port``: a host name or IPv4 address, or an IPv6 address in
    brackets, and a port from 1 to 65535, so that kazoo never meets a connect string it cannot
    parse or resolve (``127.0.0.1;2181`` would otherwise be tried as a host name until the
    connection timeout). ``source`` says where the value came from, first in the message
    (``hosts``, ``$SENTINEL_ZK``...); the message then names the part that is wrong.
    """
    problem = _hosts_problem(hosts)
    if problem is not None:
        part, why = problem
        raise InvalidConnectString(
            f"{source} {hosts!r} must look like {_HOSTS_EXAMPLE}: {why}", part=part
        )
    return hosts  # type: ignore[return-value]  # a str: checked above


def _hosts_problem(hosts: object) -> tuple[str | None, str] | None:
    """``(the bad part, why)`` for a connect string that is not one, else None."""
    if not isinstance(hosts, str) or not hosts:
        return None, "no server given"
    space = re.search(r"\s", hosts)
    if space:
        return space.group(), "no spaces"
    if "/" in hosts:
        chroot = hosts[hosts.index("/") :]
        return chroot, (
            f"the chroot {chroot!r} goes in namespace= or --namespace, not in the connect string"
        )
    for number, entry in enumerate(hosts.split(","), 1):
        if not entry:
            return entry, f"server {number} is empty (two commas, or one at an end)"
        host, port = _HOST_PORT.match(entry).groups()  # type: ignore[union-attr]  # matches all
        if not host:
            return host, f"server {number} ({entry!r}) has no host"
        if not (_IPV6.match(host) or _HOST_NAME.match(host)):
            bad = re.search(r"[^A-Za-z0-9_.\-]", host)
            why = f" ({bad.group()!r} cannot be in one)" if bad and not host.startswith("[") else ""
            return host, (
                f"{host!r} is not a host name, an IPv4 address or a bracketed IPv6 address{why}"
            )
        if port is not None and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            return port, f"the port {port!r} of {entry!r} is not one of the ports 1-65535"
    return None


HOSTS_ENV = "SENTINEL_ZK"


def resolve_hosts(hosts: str | None = None) -> str:
    """The connect string to use: ``hosts``, else ``$SENTINEL_ZK``, else the dev server's."""
    if hosts is not None:
        return validate_hosts(hosts)
    from_env = os.environ.get(HOSTS_ENV)
    if from_env:
        return validate_hosts(from_env, f"${HOSTS_ENV} (the environment variable)")
    server = dev_server()
    if server is None:
        raise DevServerNotRunning(
            "no ZooKeeper given: pass hosts= (or --zk), set SENTINEL_ZK, "
            "or start the local development server with 'sentinel zk start'"
        )
    return server.connect_string
