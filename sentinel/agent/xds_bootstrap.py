"""Where the agent serves xDS, and the bootstrap a gRPC process on its host copies.

No gRPC here: ``sentinel agent --print-xds-bootstrap`` runs without the ``xds`` extra.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
from typing import Any

from sentinel.devserver import bind_error
from sentinel.errors import AddressInUse, SentinelError, ValidationError


def parse_address(address: str) -> tuple[str, str | None]:
    """``(gRPC bind address, Unix socket path or None)`` of ``--xds ADDRESS``: ``unix:PATH``
    or an absolute path, or ``HOST:PORT`` with a loopback host (``127.0.0.1``, ``[::1]``,
    ``localhost``; port 0: any free one). :class:`ValidationError` for anything else: the
    agent never serves xDS beyond its host."""
    path = address.removeprefix("unix:")
    if path != address or address.startswith("/"):
        path = "/" + path.lstrip("/")
        return f"unix:{path}", path
    host, _, port = address.rpartition(":")
    loopback = host == "localhost"
    with contextlib.suppress(ValueError):
        loopback = loopback or ipaddress.ip_address(host.strip("[]")).is_loopback
    if not (loopback and port.isdigit() and int(port) <= 65535):
        raise ValidationError(
            f"--xds {address!r} must be unix:PATH, an absolute path, or HOST:PORT on loopback "
            "(127.0.0.1:PORT, [::1]:PORT, localhost:PORT): the agent serves its own host only"
        )
    return address, None


def check_free(address: str) -> None:
    """Refuse a loopback ``HOST:PORT`` of ``--xds`` that cannot be listened on, before
    anything starts: :class:`AddressInUse` when another process listens there, else
    :class:`SentinelError` with the system's reason (gRPC's own bind failure names no cause).
    A Unix socket is checked where it is prepared, and port 0 is any free one."""
    bind, path = parse_address(address)
    host, _, port = bind.rpartition(":")
    if path is not None or int(port) == 0:
        return
    host = "127.0.0.1" if host == "localhost" else host.strip("[]")
    failure = bind_error(int(port), host)
    if failure is None:
        return
    if failure.errno == errno.EADDRINUSE:
        raise AddressInUse(
            f"xDS: {address} is taken by another process: stop it, or give --xds another "
            "address (a Unix socket, unix:PATH, cannot be taken by another user)"
        )
    raise SentinelError(f"xDS: cannot listen on {address}: {failure.strerror}")


def bootstrap(address: str, node: str) -> dict[str, Any]:
    """The gRPC xDS bootstrap of a process on this host: its xDS server is the agent at
    ``address`` (``--xds``'s), plain text (a Unix socket or loopback), protocol v3; ``node``
    names the process to the agent (which serves every node alike). Write it to a file named
    by ``GRPC_XDS_BOOTSTRAP``, or put it in ``GRPC_XDS_BOOTSTRAP_CONFIG``.

    ``node.locality`` is empty but present: gRPC's Node client (``@grpc/grpc-js-xds``)
    refuses a bootstrap without it, and the C core, Java and Go accept it."""
    target, path = parse_address(address)
    return {
        "xds_servers": [
            {
                "server_uri": f"unix://{path}" if path else target,
                "channel_creds": [{"type": "insecure"}],
                "server_features": ["xds_v3"],
            }
        ],
        "node": {"id": node, "locality": {}},
    }


def bootstrap_json(address: str, node: str) -> str:
    """:func:`bootstrap` as the JSON text gRPC reads."""
    return json.dumps(bootstrap(address, node), indent=2)
