"""What the host agent grants the local processes it serves, whoever they are: a share of its
connections or streams per peer user, and a log that a peer cannot flood or forge lines in.

Both of the agent's servers use it: its socket (:mod:`sentinel.agent.server`, where the
kernel names each peer: ``SO_PEERCRED``) and its xDS server (:mod:`sentinel.agent.xds`,
where gRPC names only the peer's address: :func:`loopback_tcp_uid` finds its user).
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import socket
import struct
import time

# A condition logged at most once in this many seconds (with how many were not), so that a
# flood of refused connections cannot flood the log.
LOG_EVERY = 10.0
# The characters of a peer's text quoted in a log line (before escaping).
QUOTED_CHARS = 200


class Throttled:
    """A warning logged on ``logger`` at most once every :data:`LOG_EVERY` seconds, with the
    count of those not logged since. Threads may share it: a race logs a line more at worst."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._last = -LOG_EVERY
        self._skipped = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < LOG_EVERY:
            self._skipped += 1
            return
        skipped, self._skipped, self._last = self._skipped, 0, now
        suffix = f" ({skipped} more like it not logged)" if skipped else ""
        self._log.warning(message + suffix, *args)


def quoted(text: str) -> str:
    """A peer's ``text`` as a log line may hold it: escaped as :func:`repr` escapes (a
    newline or another control character cannot start a line of its own) and at most
    :data:`QUOTED_CHARS` characters of it."""
    if len(text) <= QUOTED_CHARS:
        return repr(text)
    return f"{text[:QUOTED_CHARS]!r}... ({len(text)} characters)"


class Shares:
    """Slots (connections, streams) held at once, at most ``total`` in all and ``per_peer``
    per peer uid; peers that cannot be told apart (None: a Unix socket's, to gRPC) have only
    the total, since one share among them all would only lower it. Not thread-safe: its
    owner's lock or loop guards it."""

    def __init__(self, total: int, per_peer: int, what: str) -> None:
        self._total = total
        self._per_peer_cap = per_peer
        self._what = what
        self._held = 0
        self._per_peer: collections.Counter[int | None] = collections.Counter()

    def take(self, peer: int | None) -> str | None:
        """Take a slot for ``peer``; why it may not hold one more (nothing taken), else None."""
        if self._held >= self._total:
            return f"it serves {self._total} {self._what} already"
        if peer is not None and self._per_peer[peer] >= self._per_peer_cap:
            return f"it serves {self._per_peer_cap} {self._what} of uid {peer} already"
        self._held += 1
        self._per_peer[peer] += 1
        return None

    def release(self, peer: int | None) -> None:
        """Give back a slot ``peer`` took."""
        self._held -= 1
        self._per_peer[peer] -= 1
        if not self._per_peer[peer]:
            del self._per_peer[peer]


def loopback_tcp_uid(peer: str, server: str) -> int | None:
    """The uid owning the client's end of a loopback TCP connection to ``server`` (its
    ``HOST:PORT``), from gRPC's name of the peer (``ipv4:127.0.0.1:PORT``,
    ``ipv6:[::1]:PORT``), as ``SO_PEERCRED`` names a Unix socket's peer: the kernel's socket
    diagnostics (``NETLINK_SOCK_DIAG``) look up the client's socket by the connection's
    addresses and ports, one hash lookup whatever the host's sockets (``/proc/net/tcp``
    would list them all at every lookup). None when it cannot be told: a Unix
    socket's peer, which gRPC does not name; a connection closed meanwhile."""
    try:
        client_name, client_port = _endpoint(peer.partition(":")[2])
        server_name, server_port = _endpoint(server)
        client_host = ipaddress.ip_address(client_name)
        if isinstance(client_host, ipaddress.IPv6Address) and client_host.ipv4_mapped:
            client_host = client_host.ipv4_mapped  # an IPv4 client, on a dual-stack socket
        server_host = ipaddress.ip_address(
            server_name
            if server_name != "localhost"  # bound on both: the client's family's loopback
            else "127.0.0.1"
            if client_host.version == 4
            else "::1"
        )
    except ValueError:
        return None
    family = socket.AF_INET if client_host.version == 4 else socket.AF_INET6
    socket_id = (
        struct.pack(">HH", client_port, server_port)
        + client_host.packed.ljust(16, b"\0")
        + server_host.packed.ljust(16, b"\0")
        + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)  # any interface; no cookie to check
    )
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, _ANY_STATE) + socket_id
    header = _NLMSG.pack(_NLMSG.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as diag:
            diag.settimeout(1.0)  # answered as it is asked: the kernel looks up one socket
            diag.sendto(header + request, (0, 0))
            answer = diag.recv(4096)
    except OSError:  # no socket diagnostics here (a sandbox): not told
        return None
    if len(answer) < _NLMSG.size + _UID_OFFSET + 4:
        return None  # NLMSG_ERROR: no such connection (closed meanwhile)
    _, kind, _, _, _ = _NLMSG.unpack_from(answer)
    _, state = struct.unpack_from("=BB", answer, _NLMSG.size)
    # The kernel falls back to a listening socket on the port: only the connection will do.
    if kind != _SOCK_DIAG_BY_FAMILY or state != _TCP_ESTABLISHED:
        return None
    (uid,) = struct.unpack_from("=I", answer, _NLMSG.size + _UID_OFFSET)
    return int(uid)


# <linux/netlink.h>, <linux/sock_diag.h>, <linux/inet_diag.h>
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG = struct.Struct("=IHHII")  # length, type, flags, sequence, port
_NO_COOKIE = 0xFFFFFFFF
_ANY_STATE = 0xFFFFFFFF
_TCP_ESTABLISHED = 1  # <net/tcp_states.h>
# In struct inet_diag_msg: family, state, timer, retransmits (a byte each), the socket's id
# (48 bytes), expires, read queue, write queue (4 bytes each), then the uid.
_UID_OFFSET = 4 + 48 + 12


def _endpoint(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as a host and a port; ValueError if not one."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ValueError(address)
    return host.strip("[]"), int(port)
