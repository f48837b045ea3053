"""The local development ZooKeeper's launcher: ``sentinel zk start`` and ``stop``.

Apart from :mod:`sentinel.devserver`, which every client reads to find the running server (its
state files and the connect string): a client never starts one, so what starts it stands with
the other local servers, above the client.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path

from sentinel.devserver import (
    PORT_FILE,
    DevServer,
    bind_error,
    dev_server,
    is_our_process,
    recorded_port,
    state_dir,
    state_path,
)
from sentinel.errors import ValidationError, ZooKeeperStartFailed
from sentinel.testing.zookeeper import (
    DEFAULT_CONFIG,
    ZooKeeperServer,
    find_installation,
    free_ports,
    server_mode,
)


def start_dev_server(timeout: float = 60.0, port: int | None = None) -> tuple[DevServer, bool]:
    """Start the development server unless it runs; return it and whether it was started now.

    It serves on ``port`` if given (0: any free port), else on the port of its last start, so
    that clients and ``sentinel watch`` that outlived a stop find it again, else on a free
    port. Its data directory is the same on every start. Raises ZooKeeperStartFailed when the
    port is taken (by another process: two servers on one port would each answer the other's
    clients), and ValidationError when ``port`` differs from the running server's.
    """
    running = dev_server()
    if running is not None:
        if port and running.connect_string != f"127.0.0.1:{port}":
            raise ValidationError(
                f"the development server already runs on {running.connect_string}: "
                "stop it first (sentinel zk stop) to move it to another port"
            )
        return running, False
    chosen = port if port is not None else recorded_port()
    chosen = chosen or free_ports(1)[0]
    if bind_error(chosen) is not None:
        raise ZooKeeperStartFailed(
            f"port {chosen} on 127.0.0.1 is taken by another process: stop that process, or "
            "start on another port with `sentinel zk start --port PORT` (0: any free port; "
            "running clients of the old port then need the new connect string)"
        )
    directory = state_dir() / "zk"
    member = ZooKeeperServer(
        find_installation(),
        directory / "member-1",  # where earlier versions kept the data too
        1,
        chosen,
        {**DEFAULT_CONFIG, "clientPort": str(chosen), "clientPortAddress": "127.0.0.1"},
    )
    member.launch()
    try:
        member.wait_serving(timeout)
    except ZooKeeperStartFailed:
        member.stop()
        raise
    server = DevServer(
        pid=member.pid or 0,
        connect_string=member.connect_string,
        directory=str(directory),
        started_at=time.time(),
    )
    _write_atomically(state_path(), json.dumps(asdict(server), indent=2))
    _write_atomically(state_dir() / PORT_FILE, f"{chosen}\n")
    return server, True


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f"{path.name}.tmp")
    temporary.write_text(text)
    temporary.replace(path)


def stop_dev_server(timeout: float = 10.0) -> bool:
    """Stop the development server; False if none was running."""
    server = dev_server()
    if server is None:
        return False
    os.kill(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while is_our_process(server.pid, server.directory):
        if time.monotonic() > deadline:
            os.kill(server.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    state_path().unlink(missing_ok=True)
    return True


def dev_server_mode(server: DevServer) -> str | None:
    """What ``srvr`` says of the development server (None when it does not answer)."""
    host, _, port = server.connect_string.rpartition(":")
    return server_mode(host, int(port))
