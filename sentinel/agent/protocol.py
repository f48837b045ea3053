"""The host agent's wire format: length-prefixed JSON frames on a Unix stream socket.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON, one object with an
``op``. Both ends read the other as untrusted: a frame longer than the reader accepts, or
that is not a JSON object of a known ``op`` with fields of the right types, is a
:class:`ProtocolError`, and the connection that sent it is dropped (the agent logs and
counts it and serves the rest).

A process says who it is, then asks for what it follows::

    -> {"op": "hello", "version": 1, "namespace": "/sentinel", "client": "billing-api",
        "auth_client": "billing-api"}          # auth_client: null without a key ring
    <- {"op": "welcome", "version": 1, "state": "connected", "since": null}
    -> {"op": "follow", "id": 1, "service": "orders-db"}
    <- {"op": "service", "id": 1, "service": "orders-db", "entry": {...}, "policies": {...},
        "auth": "<the /auth node's JSON, encrypted to the process's key ring>"}

``entry`` is a service in the snapshot file's form (:mod:`sentinel.cache.snapshot_file`):
every node as ZooKeeper holds it, so the process decodes it with the registry's own codecs.
Later frames carry changes: ``service`` again (the service's whole state, latest wins),
``gone`` (the service's spec was deleted), ``buckets`` (a shard policy's changed buckets),
``policy`` (a policy's whole map), ``connection`` (the agent's session: ``connected``,
``suspended``, ``lost``). A process's other requests: ``partition`` (a key its map does not
hold, read through by the agent), ``announce`` (its ``/clients`` record for a service, kept
by the agent on its session until the process disconnects).
"""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Mapping
from typing import Any

from sentinel.errors import AgentProtocolError as ProtocolError
from sentinel.errors import SentinelError
from sentinel.registry.records import parse_json

VERSION = 1
# What a process may send in one frame: a request names a service, a key or a /clients
# record, each well under a KB; anything near this is not a request.
MAX_REQUEST_BYTES = 64 * 1024
# What the agent may send in one frame: a whole service (20,000 instances of a KB at most,
# and their metrics) with its shard map; ZooKeeper's own reads are bounded alike.
MAX_REPLY_BYTES = 128 * 1024 * 1024
ENV = "SENTINEL_AGENT"
DEFAULT_SOCKET = "/run/sentinel/agent.sock"

_LENGTH = struct.Struct(">I")

REQUESTS = frozenset({"hello", "follow", "partition", "announce"})
REPLIES = frozenset(
    {
        "welcome",
        "service",
        "delta",
        "gone",
        "buckets",
        "policy",
        "auth",
        "connection",
        "partition",
        "error",
    }
)


def socket_path(explicit: str | None = None) -> str:
    """The agent's socket: ``explicit`` (``--socket``, ``Sentinel(agent=...)``), else
    ``$SENTINEL_AGENT``, else :data:`DEFAULT_SOCKET`."""
    return explicit or os.environ.get(ENV) or DEFAULT_SOCKET


def encode(message: Mapping[str, Any], encoded: Mapping[str, str] | None = None) -> bytes:
    """One frame holding ``message`` (not empty) and ``encoded``'s fields, whose values are
    JSON text already (a service's state, encoded once for every connection it goes to)."""
    body = json_text(message)
    if encoded:
        fields = "".join(f",{json.dumps(name)}:{text}" for name, text in encoded.items())
        body = f"{body[:-1]}{fields}}}"
    data = body.encode()
    return _LENGTH.pack(len(data)) + data


def json_text(value: Any) -> str:
    """``value`` as the frames hold it: compact JSON, no NaN."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def send_frame(sock: socket.socket, frame: bytes) -> int:
    """Write one frame made by :func:`encode`; the bytes written."""
    sock.sendall(frame)
    return len(frame)


def send(sock: socket.socket, message: Mapping[str, Any]) -> int:
    """Write one frame; the bytes written."""
    return send_frame(sock, encode(message))


def receive(sock: socket.socket, max_bytes: int, ops: frozenset[str]) -> dict[str, Any] | None:
    """Read one frame of at most ``max_bytes`` holding a message whose ``op`` is one of
    ``ops``; None when the peer closed the connection between frames.
    :class:`ProtocolError` for anything else (the caller drops the connection)."""
    header = _read_exactly(sock, _LENGTH.size, at_start=True)
    if header is None:
        return None
    (length,) = _LENGTH.unpack(header)
    if length > max_bytes:
        raise ProtocolError(f"a frame of {length} bytes; at most {max_bytes} are accepted")
    body = _read_exactly(sock, length)
    assert body is not None
    try:
        message = parse_json("agent frame", body, max_bytes=None)
    except SentinelError as exc:
        raise ProtocolError(f"a frame that is not JSON: {exc}") from None
    if not isinstance(message, dict) or message.get("op") not in ops:
        op = message.get("op") if isinstance(message, dict) else None
        raise ProtocolError(f"an unknown message (op {op!r})")
    return message


def field(message: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """``message[name]`` if it is of ``kind`` (bool is no int); ProtocolError otherwise."""
    value = message.get(name)
    wrong_bool = isinstance(value, bool) and kind in (int, (int, type(None)))
    if not isinstance(value, kind) or wrong_bool:
        raise ProtocolError(f"{message.get('op')!r} needs {name!r} of another type")
    return value


def _read_exactly(sock: socket.socket, count: int, *, at_start: bool = False) -> bytes | None:
    chunks, missing = [], count
    while missing:
        chunk = sock.recv(min(missing, 1 << 20))
        if not chunk:
            if at_start and missing == count:
                return None
            raise ProtocolError("the connection closed in the middle of a frame")
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)
