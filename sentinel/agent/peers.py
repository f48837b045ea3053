"""What the host agent grants the local processes it serves, whoever they are: a share of its
connections or streams per peer user, and a log that a peer cannot flood or forge lines in.

Both of the agent's servers use it: its socket (:mod:`sentinel.agent.server`, where the
kernel names each peer: ``SO_PEERCRED``) and its xDS server (:mod:`sentinel.agent.xds`,
where gRPC names only the peer's address: :func:`loopback_tcp_uid` finds its user).
"""

from __future__ import annotations

import collections
import logging
import socket
import sys
import time

log = logging.getLogger(__name__)

# A condition logged at most once in this many seconds (with how many were not), so that a
# flood of refused connections cannot flood the log.
LOG_EVERY = 10.0
# The characters of a peer's text quoted in a log line (before escaping).
QUOTED_CHARS = 200
_ESTABLISHED = "01"  # the state column of /proc/net/tcp (include/net/tcp_states.h)


class Throttled:
    """A warning logged at most once every :data:`LOG_EVERY` seconds, with the count of
    those not logged since."""

    def __init__(self, logger: logging.Logger = log) -> None:
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
    per peer uid; a peer that cannot be told apart (None) is one peer of its own. Not
    thread-safe: its owner's lock or loop guards it."""

    def __init__(self, total: int, per_peer: int, what: str) -> None:
        self.total = total
        self.per_peer = per_peer
        self._what = what
        self._held = 0
        self._per_peer: collections.Counter[int | None] = collections.Counter()

    def __len__(self) -> int:
        return self._held

    def take(self, peer: int | None) -> str | None:
        """Take a slot for ``peer``; why it may not hold one more (nothing taken), else None."""
        if self._held >= self.total:
            return f"it serves {self.total} {self._what} already"
        if self._per_peer[peer] >= self.per_peer:
            whose = "of peers it cannot tell apart" if peer is None else f"of uid {peer}"
            return f"it serves {self.per_peer} {self._what} {whose} already"
        self._held += 1
        self._per_peer[peer] += 1
        return None

    def release(self, peer: int | None) -> None:
        """Give back a slot ``peer`` took."""
        self._held -= 1
        self._per_peer[peer] -= 1
        if not self._per_peer[peer]:
            del self._per_peer[peer]


def loopback_tcp_uid(peer: str, server_port: int) -> int | None:
    """The uid owning the client's end of a loopback TCP connection to ``server_port``,
    from gRPC's name of the peer (``ipv4:127.0.0.1:PORT``, ``ipv6:[::1]:PORT``): its line in
    ``/proc/net/tcp`` (or ``tcp6``, where an IPv4 client on a dual-stack socket is), found by
    both ports, as ``SO_PEERCRED`` names a Unix socket's peer. None when it cannot be told
    (a Unix socket's peer, which gRPC does not name; a connection closed meanwhile)."""
    family, _, address = peer.partition(":")
    host, _, port = address.rpartition(":")
    if family not in ("ipv4", "ipv6") or not port.isdigit():
        return None
    try:
        packed = socket.inet_pton(
            socket.AF_INET if family == "ipv4" else socket.AF_INET6, host.strip("[]")
        )
    except OSError:
        return None
    tables = [("/proc/net/tcp6", packed if family == "ipv6" else _V4_MAPPED + packed)]
    if family == "ipv4":
        tables.insert(0, ("/proc/net/tcp", packed))
    for table, local in tables:
        uid = _owner(table, f"{_proc_address(local)}:{int(port):04X}", f":{server_port:04X}")
        if uid is not None:
            return uid
    return None


_V4_MAPPED = bytes(10) + b"\xff\xff"  # ::ffff:0:0/96, an IPv4 address on an IPv6 socket


def _proc_address(packed: bytes) -> str:
    # The kernel prints each 32-bit word of the address as a number in its own byte order.
    words = (packed[i : i + 4] for i in range(0, len(packed), 4))
    return "".join(f"{int.from_bytes(w, sys.byteorder):08X}" for w in words)


def _owner(table: str, local: str, remote_port: str) -> int | None:
    """The uid of the established socket of ``table`` at ``local`` whose remote address ends
    with ``remote_port``."""
    try:
        with open(table, encoding="ascii") as lines:
            for line in lines:
                if local not in line:
                    continue
                # sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
                fields = line.split(None, 8)
                if (
                    len(fields) > 7
                    and fields[1] == local
                    and fields[2].endswith(remote_port)
                    and fields[3] == _ESTABLISHED
                ):
                    return int(fields[7])
    except OSError:
        return None
    return None
