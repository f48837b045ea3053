"""The host agent's wire format: length-prefixed JSON frames on a Unix stream socket.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON, one object with an
``op``. Both ends read the other as untrusted: a frame longer than the reader accepts, or
that is not a JSON object of a known ``op`` with fields of the right types, is a
:class:`ProtocolError`, and the connection that sent it is dropped (the agent logs and
counts it and serves the rest).

A process says who it is, then asks for what it follows::

    -> {"op": "hello", "version": 2, "namespace": "/sentinel", "client": "billing-api",
        "auth_client": "billing-api", "deltas": true}  # auth_client: null without a key ring
    <- {"op": "welcome", "version": 2, "state": "connected", "since": null, ...}
    -> {"op": "follow", "id": 1, "service": "orders-db"}
    <- {"op": "service", "id": 1, "service": "orders-db", "seq": 41, "entry": {...},
        "policies": {...}, "auth": "<the /auth node's JSON, encrypted to the process's key ring>"}

``entry`` is a service in the snapshot file's form (:mod:`sentinel.cache.snapshot_file`):
every node as ZooKeeper holds it, so the process decodes it with the registry's own codecs.
Later frames carry changes. A process whose hello says ``"deltas": true`` is sent a change of
a service as what changed (:mod:`sentinel.agent.changes`), numbered in the service's sequence::

    <- {"op": "delta", "service": "orders-db", "seq": 42,
        "instances": {"p1:a": [<joined zxid>, "<the node's JSON>"], "p1:b": null},
        "metrics": {"p1:a": "<the node's JSON>"},
        "invalid": ["/services/orders-db/p9:x"], "valid": []}

(each field only when it has something: ``null`` is a node removed; ``invalid`` and
``valid`` the paths that became unreadable, and readable or gone again), and a change of its
credential node as ``auth`` (``{"op": "auth", "service": ..., "auth": <the node's text>}``).
A whole state (``service``) carries the ``seq`` of the last change it holds: the next delta is
``seq + 1``. The process applies a delta only when it follows the state it holds; one whose
``seq`` skips, or that does not decode, is skipped and the whole state asked again with a
``follow`` of its own (a negative ``id``: its answer comes in order with the service's other
frames). A delta sets nodes to values, so one the state holds already changes nothing.

The whole state is sent on a first ``follow`` (and each re-``follow``: every reconnection),
after a spec change (with a shard map the process may not hold), when a connection's pending
deltas of a service pass :data:`~sentinel.agent.changes.MAX_PENDING_DELTAS` or
:data:`~sentinel.agent.changes.MAX_PENDING_DELTA_BYTES` (a process reading slower than the
service changes), when a delta would be larger than a frame may be, and for every change to a
process that did not say ``deltas`` (an earlier release, which reads whole states only). A
delta's frame is encoded once and the same bytes sent to every connection following the
service; a whole state's nodes are encoded once per snapshot whatever the connections.

Other changes: ``gone`` (the service's spec was deleted), ``buckets`` (a shard policy's
changed buckets), ``policy`` (a policy's whole map), ``connection`` (the agent's session:
``connected``, ``suspended``, ``lost``). A process's other requests: ``partition`` (a key its
map does not hold, read through by the agent), ``announce`` (its ``/clients`` record for a
service, kept by the agent on its session until the process disconnects).

Both ends hear each other at least every ``heartbeat`` seconds (the agent's ``welcome`` says
how often, protocol version 2): each sends a ``heartbeat`` frame when it has sent nothing else
for that long, and takes :data:`HEARTBEAT_MISSES` intervals without a frame from the other as
a dead link. A service the agent cannot send (its frame over the agent's bound, or a node it
cannot encode) is an ``error`` frame naming the service (``AgentServiceUnavailable``), not a
dropped link; a connection the agent refuses (its caps) gets an ``error`` frame saying why
before it is closed.

A process may read another region through the agent: its hello names the region
(``"region": "west"``, by name only: the agent connects where its own configuration says, and
nowhere a process names), and the agent serves the connection from its session to that
region, opened when the first process asks for it (:mod:`sentinel.agent.regions`); the
``welcome`` says the region back (an agent that does not is one before regions, and the
process does not take its home registry for another region's). A region the agent is not
configured with is an ``error`` answer (``RegionNotServed``) and the connection's end. On such
a connection ``ping`` times a round trip to the region's ensemble from this host: the agent
answers once one request on its session there has come back::

    -> {"op": "ping", "id": 3}
    <- {"op": "ping", "id": 3}

``status`` (for ``sentinel agent status``) asks for the agent's session, its staleness and the
other processes connected with the services each follows (all of them for root and the
agent's own user; for another peer, only the services its identity may read)::

    -> {"op": "status", "id": 2}
    <- {"op": "status", "id": 2, "state": "connected", "staleness": 0.0,
        "processes": [{"pid": 4242, "client": "billing-api", "services": ["orders-db"]}],
        "regions": [{"region": "west", "state": "connected", "staleness": 0.0,
                     "processes": 2}]}

(``regions``: every other region the agent is configured with; ``state`` ``unopened`` until
a process needs it, ``processes`` null for a peer that is not root or the agent's user).
"""

from __future__ import annotations

import os
import pwd
import socket
import struct
from collections.abc import Mapping
from typing import Any

from sentinel.errors import AgentProtocolError as ProtocolError
from sentinel.errors import SentinelError, ValidationError
from sentinel.registry.records import parse_json, utf8_json

VERSION = 2
# The versions an agent serves: a version 1 process (no heartbeats) is served without them,
# so that an agent upgraded before its host's processes does not cut them off.
VERSIONS = frozenset({1, 2})
# A link is dead after this many heartbeat intervals without a frame.
HEARTBEAT_MISSES = 3
# What a process may send in one frame: a request names a service, a key or a /clients
# record, each well under a KB; anything near this is not a request.
MAX_REQUEST_BYTES = 64 * 1024
# What the agent may send in one frame: a whole service (20,000 instances of a KB at most,
# and their metrics) with its shard map; ZooKeeper's own reads are bounded alike.
MAX_REPLY_BYTES = 128 * 1024 * 1024
ENV = "SENTINEL_AGENT"
DEFAULT_SOCKET = "/run/sentinel/agent.sock"
# The user the agent runs as (a name or a uid), when it is neither root nor the process's own.
USER_ENV = "SENTINEL_AGENT_USER"

_LENGTH = struct.Struct(">I")
_PEERCRED = struct.Struct("3i")  # SO_PEERCRED's struct ucred: pid, uid, gid

REQUESTS = frozenset({"hello", "follow", "partition", "announce", "heartbeat", "status", "ping"})
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
        "status",
        "error",
        "heartbeat",
        "ping",
    }
)
HEARTBEAT = {"op": "heartbeat"}


def socket_path(explicit: str | None = None) -> str:
    """The agent's socket: ``explicit`` (``--socket``, ``Sentinel(agent=...)``), else
    ``$SENTINEL_AGENT``, else :data:`DEFAULT_SOCKET`."""
    return explicit or os.environ.get(ENV) or DEFAULT_SOCKET


def trusted_uids(agent_user: str | int | None = None) -> frozenset[int]:
    """The users whose agent a process trusts: root, its own, and ``agent_user`` (else
    ``$SENTINEL_AGENT_USER``), a user name or a uid. ValidationError for a user that does
    not exist."""
    user = agent_user if agent_user is not None else os.environ.get(USER_ENV) or None
    uids = {0, os.geteuid()}
    if isinstance(user, int) and not isinstance(user, bool):
        uids.add(user)
    elif isinstance(user, str):
        if user.isdigit():
            uids.add(int(user))
        else:
            try:
                uids.add(pwd.getpwnam(user).pw_uid)
            except KeyError:
                raise ValidationError(
                    f"agent user {user!r} (${USER_ENV}): no such user; give its uid"
                ) from None
    elif user is not None:
        raise ValidationError(f"agent user: a name or a uid, not {type(user).__name__}")
    return frozenset(uids)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """The (pid, uid, gid) of the process at the other end of a Unix socket, as the kernel
    recorded them when it connected (or, seen from a client, when the server listened)."""
    pid, uid, gid = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    return pid, uid, gid


def encode(message: Mapping[str, Any], encoded: Mapping[str, bytes] | None = None) -> bytes:
    """One frame holding ``message`` (not empty), in UTF-8 as it is
    (:func:`~sentinel.registry.records.utf8_json`), and ``encoded``'s fields, whose values
    are that JSON already (a service's nodes, encoded once for every connection sent them)."""
    data = utf8_json(message)
    if encoded:
        fields = b"".join(b"," + utf8_json(name) + b":" + text for name, text in encoded.items())
        data = data[:-1] + fields + b"}"
    return _LENGTH.pack(len(data)) + data


def send(sock: socket.socket, message: Mapping[str, Any]) -> int:
    """Write one frame; the bytes written."""
    frame = encode(message)
    sock.sendall(frame)
    return len(frame)


def receive(sock: socket.socket, max_bytes: int, ops: frozenset[str]) -> dict[str, Any] | None:
    """Read one frame of at most ``max_bytes`` holding a message whose ``op`` is one of
    ``ops``; None when the peer closed the connection between frames.
    :class:`ProtocolError` for anything else (the caller drops the connection)."""
    header = _read_exactly(sock, _LENGTH.size, at_start=True)
    if header is None:
        return None
    body = _read_exactly(sock, _length(header, max_bytes))
    assert body is not None
    return decode(body, ops)


def decode(body: bytes, ops: frozenset[str]) -> dict[str, Any]:
    """The message a frame's body holds, if its ``op`` is one of ``ops``; ProtocolError
    otherwise."""
    try:
        message = parse_json("agent frame", body, max_bytes=None)
    except SentinelError as exc:
        raise ProtocolError(f"a frame that is not JSON: {exc}") from None
    if not isinstance(message, dict) or message.get("op") not in ops:
        op = message.get("op") if isinstance(message, dict) else None
        raise ProtocolError(f"an unknown message (op {op!r})")
    return message


class FrameReader:
    """Frames from a stream read in pieces (a non-blocking socket, or a read that timed out
    between two pieces): :meth:`feed` takes what arrived and returns the messages it
    completes. Holds at most one frame of ``max_bytes`` and its length."""

    def __init__(self, max_bytes: int, ops: frozenset[str]) -> None:
        self._max_bytes = max_bytes
        self._ops = ops
        self._buffer = bytearray()

    @property
    def partial(self) -> bool:
        """Whether part of a frame has arrived and not the rest."""
        return bool(self._buffer)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """The messages ``data`` completes; ProtocolError for a frame that is not one."""
        buffer = self._buffer
        buffer += data
        messages = []
        while len(buffer) >= _LENGTH.size:
            length = _length(bytes(buffer[: _LENGTH.size]), self._max_bytes)
            end = _LENGTH.size + length
            if len(buffer) < end:
                break
            messages.append(decode(bytes(buffer[_LENGTH.size : end]), self._ops))
            del buffer[:end]
        return messages


def _length(header: bytes, max_bytes: int) -> int:
    (length,) = _LENGTH.unpack(header)
    if length > max_bytes:
        raise ProtocolError(f"a frame of {length} bytes; at most {max_bytes} are accepted")
    return length


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
