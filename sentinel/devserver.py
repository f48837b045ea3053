"""The local development ZooKeeper, and how a client finds the ensemble to talk to.

``sentinel zk start`` runs one standalone server in the background and records its connect
string in a state file. Every client and command then picks its ensemble in this order:
an explicit ``hosts`` / ``--zk``, the ``SENTINEL_ZK`` environment variable, the running
development server. The state lives in ``$SENTINEL_STATE_DIR`` (default
``$XDG_STATE_HOME/sentinel``, i.e. ``~/.local/state/sentinel``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sentinel.errors import DevServerNotRunning, ValidationError

STATE_FILE = "zk.json"
_HOSTS = re.compile(r"[^,/\s]+(,[^,/\s]+)*\Z")
# One ``host[:port]`` of a connect string: a name or IPv4 address, or a bracketed IPv6 one.
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[^:\[\]]+)(?::(\d{1,5}))?\Z")


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


def _state_path() -> Path:
    return state_dir() / STATE_FILE


def _is_our_process(pid: int, directory: str) -> bool:
    """Whether ``pid`` is still the server we started (pids are recycled)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return directory.encode() in cmdline


def dev_server() -> DevServer | None:
    """The running development server, or None (a stale state file is removed)."""
    try:
        server = DevServer(**json.loads(_state_path().read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if _is_our_process(server.pid, server.directory):
        return server
    _state_path().unlink(missing_ok=True)
    return None


def start_dev_server(timeout: float = 60.0) -> tuple[DevServer, bool]:
    """Start the development server unless it runs; return it and whether it was started now."""
    from sentinel.testing.zookeeper import LocalZooKeeper  # the client never starts one

    running = dev_server()
    if running is not None:
        return running, False
    directory = state_dir() / "zk"
    directory.mkdir(parents=True, exist_ok=True)
    zk = LocalZooKeeper(directory=directory, detach=True).start(timeout)
    member = zk.members[0]
    server = DevServer(
        pid=member.pid or 0,
        connect_string=zk.connect_string,
        directory=str(directory),
        started_at=time.time(),
    )
    temporary = _state_path().with_suffix(".tmp")
    temporary.write_text(json.dumps(asdict(server), indent=2))
    temporary.replace(_state_path())
    return server, True


def stop_dev_server(timeout: float = 10.0) -> bool:
    """Stop the development server; False if none was running."""
    server = dev_server()
    if server is None:
        return False
    os.kill(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _is_our_process(server.pid, server.directory):
        if time.monotonic() > deadline:
            os.kill(server.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    _state_path().unlink(missing_ok=True)
    return True


def dev_server_mode(server: DevServer) -> str | None:
    """What ``srvr`` says of the development server (None when it does not answer)."""
    from sentinel.testing.zookeeper import server_mode  # the client never asks

    host, _, port = server.connect_string.rpartition(":")
    return server_mode(host, int(port))


def validate_hosts(hosts: object) -> str:
    """Return a kazoo connect string (``host:port,host:port``) or raise ValidationError.

    Each entry is ``host`` or ``host:port`` with a port from 1 to 65535 (an IPv6 address in
    brackets), so that kazoo never meets a connect string it cannot parse.
    """
    entries = hosts.split(",") if isinstance(hosts, str) and _HOSTS.match(hosts) else [None]
    for entry in entries:
        match = None if entry is None else _HOST_PORT.match(entry)
        if match is None or (match.group(1) is not None and not 0 < int(match.group(1)) < 65536):
            raise ValidationError(
                f"hosts {hosts!r} must look like 'zk1:2181,zk2:2181' (ports 1-65535, no spaces; "
                "give the chroot as namespace=, not in the connect string)"
            )
    return hosts  # type: ignore[return-value]  # a str: checked above


def resolve_hosts(hosts: str | None = None) -> str:
    """The connect string to use: ``hosts``, else ``$SENTINEL_ZK``, else the dev server's."""
    if hosts is not None:
        return validate_hosts(hosts)
    from_env = os.environ.get("SENTINEL_ZK")
    if from_env:
        return validate_hosts(from_env)
    server = dev_server()
    if server is None:
        raise DevServerNotRunning(
            "no ZooKeeper given: pass hosts= (or --zk), set SENTINEL_ZK, "
            "or start the local development server with 'sentinel zk start'"
        )
    return server.connect_string
