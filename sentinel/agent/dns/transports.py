"""The agent's DNS server's transports: UDP (a datagram a query) and TCP (queries with their
2-octet length, RFC 1035 4.2.2), each handing a query's bytes to the server and sending back
what it answers, now or once a load it waits for is done."""

from __future__ import annotations

import asyncio
import collections
import functools
import ipaddress
from collections.abc import Callable
from typing import Any

from sentinel import telemetry

#: What the server does with a query's bytes (see DnsServer.handle): its source (what its
#: rate is kept for), its peer's name in the log, and whether it came over TCP.
Handler = Callable[[bytes, object, str, bool], "bytes | asyncio.Future[bytes | None] | None"]


class Udp(asyncio.DatagramProtocol):
    """The UDP socket: each datagram one query, answered to its source."""

    def __init__(self, handle: Handler) -> None:
        self._handle = handle
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        telemetry.AGENT_DNS_QUERIES.labels("udp").inc()
        # A loopback client's socket is a source of its own (the host's processes all send
        # from 127.0.0.1); another host is one source whatever its ports.
        source = addr[:2] if _loopback(addr[0]) else addr[0]
        answer = self._handle(data, source, f"udp:{addr[0]}:{addr[1]}", False)
        if isinstance(answer, asyncio.Future):
            answer.add_done_callback(functools.partial(self._send_later, addr))
        elif answer is not None and self._transport is not None:
            self._transport.sendto(answer, addr)

    def _send_later(self, addr: tuple[Any, ...], done: asyncio.Future[bytes | None]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        answer = done.result()
        if answer is not None and self._transport is not None:
            self._transport.sendto(answer, addr)

    def error_received(self, exc: Exception) -> None:
        pass  # an ICMP error for an earlier answer: its client went away


class Tcp:
    """The TCP connections: at most ``max_connections`` at once, ``max_per_source`` from one
    address (more are closed at once, ``drop(reason, peer)`` told), each closed after
    ``idle_timeout`` silent seconds."""

    def __init__(
        self,
        handle: Handler,
        drop: Callable[[str, str], None],
        max_connections: int,
        max_per_source: int,
        idle_timeout: float,
    ) -> None:
        self._handle = handle
        self._drop = drop
        self._max_connections = max_connections
        self._max_per_source = max_per_source
        self._idle_timeout = idle_timeout
        self._connections: collections.Counter[str] = collections.Counter()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: its queries, each answered in full, until it closes or stays
        silent for the idle timeout."""
        source = str(writer.get_extra_info("peername", ("?",))[0])
        peer = f"tcp:{source}"
        if (
            sum(self._connections.values()) >= self._max_connections
            or self._connections[source] >= self._max_per_source
        ):
            self._drop("connections", peer)
            writer.close()
            return
        self._connections[source] += 1
        try:
            while True:
                try:
                    length = int.from_bytes(
                        await asyncio.wait_for(reader.readexactly(2), self._idle_timeout), "big"
                    )
                    data = await asyncio.wait_for(reader.readexactly(length), self._idle_timeout)
                except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    return
                telemetry.AGENT_DNS_QUERIES.labels("tcp").inc()
                answer = self._handle(data, source, peer, True)
                if isinstance(answer, asyncio.Future):
                    answer = await answer
                if answer is None:
                    continue  # unanswered: the client times out, as over UDP
                writer.write(len(answer).to_bytes(2, "big") + answer)
                await writer.drain()
        except ConnectionError:
            return
        finally:
            self._connections[source] -= 1
            if not self._connections[source]:
                del self._connections[source]
            writer.close()


def _loopback(host: str) -> bool:
    """Whether a peer's address (``::1``, ``fe80::1%eth0``) is loopback."""
    try:
        return ipaddress.ip_address(host.partition("%")[0]).is_loopback
    except ValueError:
        return False
