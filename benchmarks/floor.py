"""How fast a change can reach a Python cache at all: ``python -m benchmarks.floor``.

One ZooKeeper server on loopback; every client below runs in this machine's one Python (or one
JVM for the Java client), alone, one after the other, with a warm-up, in rounds that take
turns. Two measurements per client:

* **request**: one ``exists("/")`` round trip;
* **change**: a write on one session reaching a follower on another session that holds a data
  watch: timed from before the write to the moment the follower has the node's new data
  (the event received, the node read again with its watch set again, the reply in hand).

The clients:

* ``raw socket``: :class:`RawSession`, ZooKeeper's wire protocol on a blocking socket, in
  the calling thread: no threads, no queues, no library. Nothing in Python can be faster
  over TCP, so it is the floor every ratio is taken to;
* ``Java client``: ZooKeeper's own client (``benchmarks/peers/FloorBench.java``, compiled
  here against Debian's jars), its watch callback reading the node again on its event
  thread: what a JVM cache (Curator's) starts from;
* ``kazoo``: kazoo's client on the transport Sentinel uses (``sentinel.zk.transport``'s
  PollHandler), the follower's watch callback reading the node again with ``get_async``;
* ``kazoo + sentinel.zk.watches``: the same client with the extension Sentinel installs
  (``install(client)``), which writes a request from the calling thread instead of queuing it
  for kazoo's connection thread, request row only;
* ``sentinel``: the whole path a user gets, ``update_metrics`` on a publisher to a
  ``listen()`` callback on another client (the persistent watch's event taken on the
  connection thread, which sends the node's read at once; the reply applied by the cache's
  worker, the snapshot swapped, the listener called), change row only;
* ``sentinel, worker reads``: the same with the event handed to kazoo's callback thread and
  the read sent by the worker (``CacheConfig(events_on_connection_thread=False)``), the path
  before the hops were cut, measured in the same rounds.

A third row, ``registration``, is the raw socket's floor for a new instance reaching a
follower (a create; the children event, the list and the new node read): the floor that
``benchmarks.compare`` divides its propagation figures by.

Each row prints p50 and p99 over every sample of every round, min-max of the rounds' p50s,
and the ratio of its p50 to the raw socket's.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.protocol.states import EventType, WatchedEvent

from benchmarks.common import compile_peer, percentiles, report
from sentinel import Sentinel
from sentinel.cache.config import CacheConfig
from sentinel.events import MetricsChanged
from sentinel.testing.zookeeper import LocalZooKeeper
from sentinel.zk.transport import PollHandler
from sentinel.zk.watches import install

PEER = Path(__file__).resolve().parent / "peers" / "FloorBench.java"
JARS = ("zookeeper", "zookeeper-jute", "slf4j-api", "slf4j-nop")
INSTALL = "apt-get install default-jdk-headless zookeeper"
WARM_UP = 100

_INT = struct.Struct("!i")
_HEADER = struct.Struct("!ii")  # xid, opcode
_REPLY = struct.Struct("!iqi")  # xid, zxid, err
_CREATE, _DELETE, _EXISTS, _GET_DATA, _SET_DATA, _GET_CHILDREN, _CLOSE = 1, 2, 3, 4, 5, 8, -11
_WATCH_XID = -1
_PERSISTENT, _EPHEMERAL = 0, 1
_OPEN_ACL = _INT.pack(1) + _INT.pack(31)  # one entry: ALL ...
_OPEN_ACL += _INT.pack(5) + b"world" + _INT.pack(6) + b"anyone"  # ... for world:anyone


def _string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return _INT.pack(len(data)) + data


class RawSession:
    """A ZooKeeper session on a plain blocking socket: requests are sent and their replies
    read in the calling thread, one at a time (no pipelining, no pings: keep it short)."""

    def __init__(self, host: str, port: int, timeout_ms: int = 10_000) -> None:
        self._sock = socket.create_connection((host, port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connect = struct.pack("!iqiq", 0, 0, timeout_ms, 0) + _string(bytes(16)) + b"\0"
        self._send(connect)
        self._receive()  # protocol version, timeout, session id, password, read-only
        self._xid = 0
        self.events: list[tuple[int, str]] = []  # watch events read while awaiting a reply

    def _send(self, body: bytes) -> None:
        self._sock.sendall(_INT.pack(len(body)) + body)

    def _exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self._sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
        return data

    def _receive(self) -> bytes:
        (size,) = _INT.unpack(self._exactly(4))
        return self._exactly(size)

    def request(self, opcode: int, body: bytes) -> bytes:
        """Send one request, return its reply's body; raise on a ZooKeeper error code."""
        self._xid += 1
        self._send(_HEADER.pack(self._xid, opcode) + body)
        while True:
            reply = self._receive()
            xid, _, err = _REPLY.unpack_from(reply)
            if xid == _WATCH_XID:
                self.events.append(self._event(reply))
                continue
            if err:
                raise RuntimeError(f"ZooKeeper error {err} for opcode {opcode}")
            return reply[_REPLY.size :]

    @staticmethod
    def _event(reply: bytes) -> tuple[int, str]:
        kind, _state, length = struct.unpack_from("!iii", reply, _REPLY.size)
        start = _REPLY.size + 12
        return kind, reply[start : start + length].decode()

    def next_event(self) -> tuple[int, str]:
        """The next watch event (one read already may have brought it)."""
        if self.events:
            return self.events.pop(0)
        reply = self._receive()
        assert _REPLY.unpack_from(reply)[0] == _WATCH_XID, "a reply nobody waited for"
        return self._event(reply)

    def exists(self, path: str) -> None:
        self.request(_EXISTS, _string(path) + b"\0")

    def get(self, path: str, watch: bool) -> bytes:
        body = self.request(_GET_DATA, _string(path) + (b"\1" if watch else b"\0"))
        (length,) = _INT.unpack_from(body)
        return body[4 : 4 + max(length, 0)]

    def set(self, path: str, data: bytes) -> None:
        self.request(_SET_DATA, _string(path) + _string(data) + _INT.pack(-1))

    def children(self, path: str, watch: bool) -> list[str]:
        body = self.request(_GET_CHILDREN, _string(path) + (b"\1" if watch else b"\0"))
        (count,) = _INT.unpack_from(body)
        names, offset = [], 4
        for _ in range(count):
            (length,) = _INT.unpack_from(body, offset)
            names.append(body[offset + 4 : offset + 4 + length].decode())
            offset += 4 + length
        return names

    def create(self, path: str, ephemeral: bool = True) -> None:
        flags = _EPHEMERAL if ephemeral else _PERSISTENT
        self.request(_CREATE, _string(path) + _string(b"") + _OPEN_ACL + _INT.pack(flags))

    def delete(self, path: str) -> None:
        self.request(_DELETE, _string(path) + _INT.pack(-1))

    def close(self) -> None:
        self._xid += 1
        self._send(_HEADER.pack(self._xid, _CLOSE))
        self._sock.close()


def timed(call: Callable[[int], None], count: int, interval: float = 0.0) -> list[float]:
    """Milliseconds of ``call(i)`` for ``count`` calls after WARM_UP untimed ones, each
    after ``interval`` seconds of quiet."""
    clock = time.perf_counter
    samples = []
    for i in range(WARM_UP + count):
        if interval:
            time.sleep(interval)
        started = clock()
        call(i)
        if i >= WARM_UP:
            samples.append((clock() - started) * 1000)
    return samples


def raw_request(host: str, port: int, calls: int) -> list[float]:
    session = RawSession(host, port)
    try:
        return timed(lambda _: session.exists("/"), calls)
    finally:
        session.close()


def raw_change(host: str, port: int, changes: int) -> list[float]:
    writer, follower = RawSession(host, port), RawSession(host, port)
    path = f"/floor-raw-{os.getpid()}"
    writer.create(path)
    follower.get(path, watch=True)

    def change(i: int) -> None:
        value = str(i).encode()
        writer.set(path, value)
        follower.next_event()  # NodeDataChanged
        assert follower.get(path, watch=True) == value

    try:
        return timed(change, changes)
    finally:
        writer.close()
        follower.close()


def raw_registration(host: str, port: int, count: int, interval: float = 0.0) -> list[float]:
    """The floor of a registration reaching a follower: the writer's create, then on the
    follower the children event, the list read again and the new node read (watches set
    again on both), as a cache must before it can serve the instance. ``interval``: seconds
    of quiet before each one (untimed), as a paced benchmark leaves between its changes."""
    writer, follower = RawSession(host, port), RawSession(host, port)
    parent = f"/floor-registrations-{os.getpid()}"
    writer.create(parent, ephemeral=False)
    follower.children(parent, watch=True)

    def register(i: int) -> None:
        writer.create(f"{parent}/n{i}")
        follower.next_event()  # NodeChildrenChanged
        assert f"n{i}" in follower.children(parent, watch=True)
        follower.get(f"{parent}/n{i}", watch=True)

    try:
        return timed(register, count, interval)
    finally:
        writer.close()  # its ephemeral children go with its session, in one transaction
        follower.next_event()  # NodeChildrenChanged: they are gone
        follower.delete(parent)
        follower.close()


def _kazoo(hosts: str, extension: bool = False) -> KazooClient:
    client = KazooClient(hosts, handler=PollHandler())
    if extension:
        install(client)
    client.start(timeout=10)
    return client


def kazoo_request(hosts: str, calls: int, extension: bool = False) -> list[float]:
    client = _kazoo(hosts, extension)
    try:
        return timed(lambda _: client.exists("/"), calls)
    finally:
        client.stop()
        client.close()


def kazoo_change(hosts: str, changes: int) -> list[float]:
    writer, follower = _kazoo(hosts), _kazoo(hosts)
    path = f"/floor-kazoo-{os.getpid()}"
    writer.create(path, b"", ephemeral=True)
    applied: list[bytes] = []
    done = threading.Event()

    def on_reply(result: object) -> None:
        applied.append(result.get()[0])  # type: ignore[attr-defined]
        done.set()

    def watch(event: WatchedEvent) -> None:  # on kazoo's callback thread: never block it
        if event.type == EventType.CHANGED:  # not the deletion when the writer closes
            follower.get_async(path, watch=watch).rawlink(on_reply)

    follower.get(path, watch=watch)

    def change(i: int) -> None:
        value = str(i).encode()
        done.clear()
        writer.set(path, value)
        assert done.wait(10) and applied[-1] == value, f"change {i} not applied"

    try:
        return timed(change, changes)
    finally:
        for client in (follower, writer):
            client.stop()
            client.close()


def sentinel_change(hosts: str, changes: int, at_once: bool = True) -> list[float]:
    cache = CacheConfig(events_on_connection_thread=at_once)
    with (
        Sentinel(hosts, "floor-writer", announce=False) as writer,
        Sentinel(hosts, "floor-follower", announce=False, cache=cache) as follower,
    ):
        registration = writer.register("floor", "p1", "127.0.0.1", 5432, label="a")
        writer.update_metrics(registration, {"n": -1})
        heard = threading.Event()
        expected: list[float] = [-1.0]

        def listener(event: object) -> None:
            if isinstance(event, MetricsChanged) and any(
                new.metrics.get("n") == expected[0] for _, new in event.updated
            ):
                heard.set()

        follower.prefetch("floor")
        follower.listen("floor", listener)

        def change(i: int) -> None:
            heard.clear()
            expected[0] = float(i)
            writer.update_metrics(registration, {"n": i})
            assert heard.wait(10), f"change {i} not heard"

        return timed(change, changes)


def java_samples(java: list[str] | None, hosts: str, mode: str, count: int) -> list[float]:
    if java is None:
        return []
    run = subprocess.run(
        [*java, hosts, mode, str(count)], capture_output=True, text=True, timeout=600, check=False
    )
    if run.returncode != 0:
        raise RuntimeError(f"FloorBench {mode} failed: {run.stderr.strip()[-500:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])["samples_ms"]


def main(argv: list[str] | None = None) -> None:
    """Run the rounds, print the table and write ``benchmarks/results/floor.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000, help="requests per client and round")
    parser.add_argument("--changes", type=int, default=300, help="changes per client and round")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as build, LocalZooKeeper() as zk:
        java, why_not = compile_peer(Path(build), PEER, JARS, "FloorBench", INSTALL)
        if java is None:
            print(f"(no Java row: {why_not})")
        host, port = "127.0.0.1", zk.members[0].client_port
        hosts = zk.connect_string
        ways: dict[str, dict[str, Callable[[], list[float]]]] = {
            "request": {
                "raw socket": lambda: raw_request(host, port, args.calls),
                "Java client": lambda: java_samples(java, hosts, "request", args.calls),
                "kazoo": lambda: kazoo_request(hosts, args.calls),
                "kazoo + sentinel.zk.watches": lambda: kazoo_request(hosts, args.calls, True),
            },
            "change": {
                "raw socket": lambda: raw_change(host, port, args.changes),
                "Java client": lambda: java_samples(java, hosts, "change", args.changes),
                "kazoo": lambda: kazoo_change(hosts, args.changes),
                "sentinel": lambda: sentinel_change(hosts, args.changes),
                "sentinel, worker reads": lambda: sentinel_change(hosts, args.changes, False),
            },
            "registration": {"raw socket": lambda: raw_registration(host, port, args.changes)},
        }
        samples = {(kind, name): [] for kind, row in ways.items() for name in row}
        round_p50 = {key: [] for key in samples}
        for turn in range(args.rounds):
            order = [(kind, name) for kind, row in ways.items() for name in row]
            for kind, name in order if turn % 2 == 0 else reversed(order):
                taken = ways[kind][name]()
                if taken:
                    samples[kind, name] += taken
                    round_p50[kind, name].append(percentiles(taken)["p50"])
    figures = {}
    rows = []
    for kind, name in samples:
        if not samples[kind, name]:
            rows.append([kind, name, "-", "-", "-", f"not run: {INSTALL}"])
            continue
        tails = percentiles(samples[kind, name])
        floor = percentiles(samples[kind, "raw socket"])["p50"]
        p50s = round_p50[kind, name]
        figures[f"{kind}/{name}"] = {**tails, "round_p50s": p50s, "ratio": tails["p50"] / floor}
        rows.append(
            [
                kind,
                name,
                f"{tails['p50']:.3f}",
                f"{tails['p99']:.3f}",
                f"{min(p50s):.3f}-{max(p50s):.3f}",
                f"x{tails['p50'] / floor:.2f}",
            ]
        )
    report(
        "floor",
        f"The floor: {args.rounds} rounds of {args.calls} requests and {args.changes} changes "
        "per client (ms; ratio: p50 over the raw socket's)",
        ["what", "client", "p50", "p99", "round p50s", "vs raw socket"],
        rows,
        {"rounds": args.rounds, "calls": args.calls, "changes": args.changes, **figures},
    )


if __name__ == "__main__":
    main()
