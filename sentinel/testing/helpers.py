"""Helpers for tests and fault drills against a real ZooKeeper (as ``kazoo.testing`` does)."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kazoo.hosts import collect_hosts
from kazoo.protocol.serialization import (
    Close,
    Connect,
    ReplyHeader,
    int_int_struct,
    int_struct,
)

from sentinel.client import Sentinel
from sentinel.registry.reads import read_metrics
from sentinel.shards.maps import DirectoryMap
from sentinel.shards.store import iter_assignments
from sentinel.zk import kazoo_internals
from sentinel.zk.tls import TlsConfig


def expire_session(client: Sentinel, timeout: float = 10.0, hosts: str | None = None) -> int:
    """Expire ``client``'s ZooKeeper session the way a long pause would; return its old id.

    A second connection joins the same session (same id and password) and closes it, which
    ends the session on the server. ``client`` then finds its session expired, as after a
    long garbage-collection pause or a partition, and connects again with a new one.
    ``hosts`` is where that connection goes (default: the client's): the servers themselves
    when the client's own link is cut, so that the session ends while it cannot reconnect.
    Raises TimeoutError when no server closed the session within ``timeout`` seconds.
    """
    zk = client.session.zk
    # kazoo's client_id is None while disconnected; the session it will resume is kept.
    session_id, password = kazoo_internals.session(zk)
    close_session(hosts or client.hosts, session_id, password, timeout=timeout, tls=client.tls)
    return session_id


def close_session(
    hosts: str,
    session_id: int,
    password: bytes,
    *,
    timeout: float = 10.0,
    tls: TlsConfig | None = None,
) -> None:
    """End a ZooKeeper session from a connection of its own: a ConnectRequest with the
    session's id and password, then closeSession (opcode -11), each framed as ZooKeeper frames
    packets (a 4-byte length first) and built by kazoo's serialization classes.

    No kazoo client: no connection thread to schedule, no retry policy with its own time-outs;
    one blocking exchange, tried on each of ``hosts`` in turn until ``timeout`` (a loaded
    machine makes it slower, never makes it give up early). A server that no longer knows the
    session (expired already) answers the ConnectRequest with a time-out of 0: done too.
    Raises TimeoutError, with the last failures, when no server closed it in time.
    """
    deadline = time.monotonic() + timeout
    addresses, _ = collect_hosts(hosts)
    context = tls.ssl_context() if tls is not None else None
    failures: list[str] = []
    while True:
        for host, port in addresses:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"no server of {hosts} closed session 0x{session_id:x} within {timeout:g}s "
                    f"({'; '.join(failures[-len(addresses) :]) or 'no attempt'})"
                )
            try:
                with socket.create_connection((host, port), timeout=remaining) as plain:
                    link = context.wrap_socket(plain, server_hostname=host) if context else plain
                    link.settimeout(max(deadline - time.monotonic(), 0.1))
                    if _join_and_close(link, session_id, password, timeout):
                        return
                    failures.append(f"{host}:{port} refused closeSession")
            except (OSError, struct.error) as exc:  # refused, reset, timed out, read-only, cut
                failures.append(f"{host}:{port}: {exc!r}")
        time.sleep(0.05)  # a round on every server failed: the next after a short pause


_MAX_REPLY = 1 << 16  # a ConnectResponse or a reply header is a few dozen bytes


def _join_and_close(link: socket.socket, session_id: int, password: bytes, timeout: float) -> bool:
    """Join the session on ``link`` and close it; False if the server answered closeSession
    with an error."""
    request = Connect(0, 0, int(timeout * 1000), session_id, password, False).serialize()
    _send_packet(link, request)
    joined, _ = Connect.deserialize(_read_packet(link), 0)
    if joined.time_out <= 0:
        return True  # the session is gone already
    _send_packet(link, int_int_struct.pack(1, Close.type))  # xid 1, closeSession
    header, _ = ReplyHeader.deserialize(_read_packet(link), 0)
    return header.err == 0


def _send_packet(link: socket.socket, payload: bytes | bytearray) -> None:
    link.sendall(int_struct.pack(len(payload)) + payload)


def _read_packet(link: socket.socket) -> bytes:
    (length,) = int_struct.unpack(_read_exactly(link, int_struct.size))
    if not 0 <= length <= _MAX_REPLY:
        raise OSError(f"a reply of {length} bytes")
    return _read_exactly(link, length)


def _read_exactly(link: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = link.recv(count - len(data))
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        data.extend(chunk)
    return bytes(data)


def wait_until(
    condition: Callable[[], object],
    timeout: float = 10.0,
    *,
    interval: float = 0.01,
    ignore: tuple[type[BaseException], ...] = (),
) -> float | None:
    """Poll ``condition`` until it is truthy; return the seconds that took, None on timeout.

    Exceptions of the ``ignore`` types count as "not yet" (for example
    :class:`~sentinel.errors.ConnectionInterrupted` while a client reconnects).
    """
    start = time.monotonic()
    while True:
        with contextlib.suppress(*ignore):
            if condition():
                return time.monotonic() - start
        if time.monotonic() - start > timeout:
            return None
        time.sleep(interval)


class ManualClock:
    """A monotonic clock that moves only when told (``clock.advance(30)``): give it to what
    takes a clock (``InstanceFeedback(clock=...)``) and a test steps through time without
    sleeping."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        self.now += seconds


def flap(proxies: Sequence[TcpProxy], seconds: float, period: float = 0.1) -> int:
    """Cut and restore ``proxies`` every ``period`` seconds for ``seconds``; return the flaps."""
    flaps = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for proxy in proxies:
            proxy.cut()
        time.sleep(period / 2)  # the flapping's rhythm is the input, not a synchronisation
        for proxy in proxies:
            proxy.restore()
        time.sleep(period / 2)
        flaps += 1
    return flaps


class _Valve:
    """One direction of a :class:`TcpProxy`'s relay: open, or holding each chunk read from its
    source until it opens again or lets that chunk through."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._open = True
        self._passes = 0  # chunks let through while closed
        self.held = 0  # chunks read and not relayed yet

    def wait(self) -> None:
        """Before relaying a chunk: return once it may go."""
        with self._changed:
            self.held += 1
            self._changed.wait_for(lambda: self._open or self._passes > 0)
            if not self._open:
                self._passes -= 1
            self.held -= 1

    def set(self, open: bool) -> None:
        with self._changed:
            self._open = open
            self._passes = 0
            self._changed.notify_all()

    def let_through(self, chunks: int) -> None:
        with self._changed:
            self._passes += chunks
            self._changed.notify_all()


class TcpProxy:
    """A loopback TCP relay between clients and a real server, whose link can be cut.

    It models a network partition between one client and ZooKeeper while the server goes on
    serving everyone else: :meth:`cut` drops every relayed connection and refuses new ones
    until :meth:`restore`; :meth:`pause` holds every byte, closing nothing, until
    :meth:`resume` (a stalled link, or a frozen client as the server sees it), or the bytes of
    one direction only, whose held chunks :meth:`let_through` relays one by one. Connect
    clients to :attr:`address`. With ``delay``, each chunk waits that many seconds before it
    is relayed: a slow link. With ``record``, every byte relayed toward the server is kept
    (:meth:`recorded`): what whoever runs or listens to that server would see.
    """

    def __init__(
        self, target_host: str, target_port: int, delay: float = 0.0, record: bool = False
    ) -> None:
        self._target = (target_host, target_port)
        self.delay = delay
        self._recording: bytearray | None = bytearray() if record else None
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._valves = {True: _Valve(), False: _Valve()}  # toward the server, the client
        self._closed = False
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    @property
    def address(self) -> str:
        """``host:port`` to connect to."""
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            if not self._open.is_set():
                downstream.close()
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                downstream.close()
                continue
            # The timeout was for connecting only: left on, it cut every connection that
            # stayed quiet for 5 s (a client whose session allows pings further apart).
            upstream.settimeout(None)
            with self._lock:
                # A cut() while this one was being connected did not see it: refuse it now
                # (a client cut from one relay that reached the next as it was being cut kept
                # its session alive through it).
                if not self._open.is_set():
                    downstream.close()
                    upstream.close()
                    continue
                self._connections.update((downstream, upstream))
            for source, sink, valve, recording in (
                (downstream, upstream, self._valves[True], self._recording),
                (upstream, downstream, self._valves[False], None),
            ):
                threading.Thread(
                    target=self._pump, args=(source, sink, valve, recording), daemon=True
                ).start()

    def _pump(
        self,
        source: socket.socket,
        sink: socket.socket,
        valve: _Valve,
        recording: bytearray | None,
    ) -> None:
        try:
            while data := source.recv(65536):
                if self.delay:
                    time.sleep(self.delay)  # the slow link being simulated, not a wait
                valve.wait()
                if recording is not None:
                    with self._lock:
                        recording += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._connections.difference_update((source, sink))

    def recorded(self) -> bytes:
        """Every byte relayed toward the server so far, every connection's (``record=True``)."""
        assert self._recording is not None, "a TcpProxy records only with record=True"
        with self._lock:
            return bytes(self._recording)

    def cut(self) -> None:
        """Drop every connection and refuse new ones."""
        self._open.clear()
        with self._lock:
            connections = list(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        """Accept connections again."""
        self._open.set()

    def pause(self, *, to_server: bool = True, to_client: bool = True) -> None:
        """Hold every byte in both directions, or in the one asked for, keeping connections
        open (new ones too): ``to_client=False`` lets the server's replies and watch events
        through while the client's requests wait."""
        for direction, paused in ((True, to_server), (False, to_client)):
            if paused:
                self._valves[direction].set(open=False)

    def held(self, *, to_server: bool = True) -> int:
        """How many chunks read from one side wait to be relayed to the other."""
        return self._valves[to_server].held

    def let_through(self, chunks: int = 1, *, to_server: bool = True) -> None:
        """While paused, relay the next ``chunks`` chunks of one direction and hold the rest
        (a chunk is what one read of the source returned: one request, when the client sent
        it alone)."""
        self._valves[to_server].let_through(chunks)

    def resume(self) -> None:
        """Relay again, the bytes held first."""
        for valve in self._valves.values():
            valve.set(open=True)

    def close(self) -> None:
        """Stop relaying."""
        self._closed = True
        self.cut()
        self.resume()  # held pumps find their sockets shut and end
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()


def registry_view(client: Sentinel, service: str) -> tuple[Any, ...]:
    """What a fresh read of ``service`` finds: instances, metrics and (directory) shard keys,
    in the form :func:`cached_view` gives for the cache, so the two compare equal when the
    cache is exact."""
    listing = client.read_service(service)
    metrics, _ = read_metrics(client.session.zk, service)
    policy = listing.spec.shard_policy
    return (
        {(i.partition, i.label, i.host, i.port, i.status, i.weight) for i in listing.instances},
        {name: dict(record.values) for name, record in metrics.items()},
        dict(iter_assignments(client.session.zk, policy)) if policy else {},
    )


def cached_view(client: Sentinel, service: str) -> tuple[Any, ...]:
    """``service`` as ``client``'s cache holds it, comparable with :func:`registry_view`."""
    snapshot = client.session.cache.snapshots[service]
    shard_map = client.session.cache.shard_maps.get(snapshot.spec.shard_policy or "")
    return (
        {
            (e.partition, e.label, e.host, e.port, e.status, e.weight)
            for e in snapshot.endpoints.values()
        },
        {name: dict(record.values) for name, record in snapshot.metrics.items()},
        dict(shard_map.keys) if isinstance(shard_map, DirectoryMap) else {},
    )


class PublisherProcess:
    """A publisher in a process of its own, to kill or freeze as a crash or a stall would.

    The child registers one instance of ``service`` (``partition``, ``label``) with a session
    of ``session_timeout`` seconds and holds it until :meth:`stop` (which deregisters) or a
    signal: :meth:`kill` (SIGKILL, the node goes when the session expires), :meth:`pause` and
    :meth:`resume` (SIGSTOP/SIGCONT; past the session timeout the node goes, and the resumed
    process registers it again).
    """

    def __init__(
        self,
        hosts: str,
        namespace: str,
        service: str,
        partition: str,
        label: str,
        session_timeout: float = 2.0,
    ) -> None:
        self.label = label
        arguments = [hosts, namespace, service, partition, label, str(session_timeout)]
        self._process = subprocess.Popen(
            [sys.executable, "-m", "sentinel.testing.helpers", *arguments],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()  # the child exits (EOF) if it cannot register
        if line.strip() != "registered":
            self.kill()
            raise RuntimeError(f"publisher {label} did not register (exit {self._process.poll()})")

    @property
    def alive(self) -> bool:
        """Whether the process exists (a paused one does)."""
        return self._process.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would; ZooKeeper removes the node when the session expires."""
        if self.alive:
            self._process.kill()
        self._process.wait()

    def pause(self) -> None:
        """SIGSTOP: the process stops answering ZooKeeper, as in a long GC pause."""
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        self._process.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> None:
        """Deregister and exit (closing the child's stdin), or kill after ``timeout``."""
        if not self.alive:
            return
        self.resume()
        assert self._process.stdin is not None
        with contextlib.suppress(OSError):
            self._process.stdin.close()
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


def _hold_registration(argv: list[str]) -> None:
    """The child of :class:`PublisherProcess`: register, say so, hold until stdin closes."""
    hosts, namespace, service, partition, label, session_timeout = argv
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # its faults are the parent's doing
    client = Sentinel(
        hosts,
        f"publisher-{label}",
        namespace,
        session_timeout=float(session_timeout),
        announce=False,
    )
    with client:
        client.register(service, partition, "127.0.0.1", 9000, label=label)
        sys.stdout.write("registered\n")
        sys.stdout.flush()
        sys.stdin.read()


if __name__ == "__main__":
    _hold_registration(sys.argv[1:])

__all__ = [
    "ManualClock",
    "PublisherProcess",
    "TcpProxy",
    "cached_view",
    "close_session",
    "expire_session",
    "flap",
    "registry_view",
    "wait_until",
]
