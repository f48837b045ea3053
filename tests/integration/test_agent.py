"""The host agent against a real ZooKeeper: processes served from one session, what they see,
what they write, and how they fare when the agent, its session or a neighbour misbehaves."""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sentinel.policies import MinLag

from sentinel.agent.server import AgentServer
from sentinel.agentlink import protocol
from sentinel.agentlink.link import AgentLink
from sentinel.auth import ClientKeyring
from sentinel.auth.config import AuthConfig
from sentinel.errors import AgentUnavailable, NoInstanceAvailable, ServiceNotFound
from sentinel.events import InstancesChanged, MetricsChanged, ShardKeysChanged
from sentinel.registry.layout import client_path, instance_path
from sentinel.telemetry import AGENT_DROPPED
from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.testing.zookeeper import four_letter_word
from tests.integration.daemons import Daemon
from tests.integration.peers import run_as_nobody

pytestmark = pytest.mark.integration

SERVICE = "orders-db"


@pytest.fixture
def socket_path() -> str:
    # A short path (sun_path holds 108 bytes) in a directory other users may enter, for the
    # peer-credential test.
    directory = tempfile.mkdtemp(prefix="agent-")
    os.chmod(directory, 0o755)
    return os.path.join(directory, "agent.sock")


@pytest.fixture
def agent(make_client, socket_path):
    """An agent in this process, served from a session of the test's namespace."""
    session = make_client("host-agent", announce=False, agent=False, persistent_watches=True)
    with AgentServer(session, socket_path, send_timeout=2.0) as server:
        yield server


@pytest.fixture
def agent_session(make_client):
    """The agent's own session, for an agent a test starts with its own settings."""
    return make_client("host-agent", announce=False, agent=False, persistent_watches=True)


@pytest.fixture
def proxy(zookeeper) -> Iterator[TcpProxy]:
    """A relay to the server, to cut or pause the agent's own link with."""
    host, port = zookeeper.connect_string.split(",")[0].rsplit(":", 1)
    relay = TcpProxy(host, int(port))
    yield relay
    relay.close()


def session_through(make_client, proxy: TcpProxy, **kwargs):
    """The agent's own session, through ``proxy``, lasting past the cuts (20 s)."""
    return make_client(
        "host-agent",
        hosts=proxy.address,
        announce=False,
        agent=False,
        session_timeout=20.0,
        **kwargs,
    )


@pytest.fixture
def admin(make_client):
    """The publisher and operator: a session of its own."""
    admin = make_client("admin", announce=False, agent=False)
    admin.shard_maps.ensure("tenants", "directory", partitions=["p1", "p2"])
    admin.shard_maps.assign_many("tenants", {"acme": "p1", "globex": "p2"})
    admin.ensure_service(SERVICE, scheme="postgresql", shard_policy="tenants")
    return admin


def through(make_client, socket_path: str, client_id: str = "app", **kwargs):
    return make_client(client_id, agent=socket_path, **kwargs)


def state(client) -> dict[str, tuple]:
    """What a client serves of the service: each instance and its metrics."""
    return {
        e.name: (e.host, e.port, e.status, dict(e.metrics))
        for e in client.cached_instances(SERVICE)
    }


def fresh_state(make_client) -> dict[str, tuple]:
    """What ZooKeeper holds now, read by a new client of its own."""
    reader = make_client(f"fresh-{uuid.uuid4().hex[:6]}", agent=False, announce=False)
    reader.prefetch(SERVICE)
    return state(reader)


def test_a_process_resolves_through_the_agent_and_hears_each_change(
    agent, admin, make_client, socket_path, raw_zk
):
    a = admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    admin.update_metrics(a, {"replication_lag": 3.0})
    app = through(make_client, socket_path)
    assert app.get_service(SERVICE, "acme", MinLag()).uri == "postgresql://10.0.1.1:5432"
    assert app.session_id is None  # no ZooKeeper session of its own: the agent's serves it
    heard = []
    app.listen(SERVICE, heard.append)

    b = admin.register(SERVICE, "p1", "10.0.1.2", 5432, label="b")
    admin.update_metrics(b, {"replication_lag": 0.5})
    assert wait_until(lambda: app.get_service(SERVICE, "acme", MinLag()).label == "b")
    assert any(isinstance(e, InstancesChanged) and e.added for e in heard)
    # b's registration and its first metrics may come in one frame (a service's frames
    # coalesce, as kazoo's events do); a metrics change of a known instance is heard as one.
    admin.update_metrics(a, {"replication_lag": 2.0})
    assert wait_until(
        lambda: any(
            isinstance(e, MetricsChanged) and any(new.label == "a" for _, new in e.updated)
            for e in heard
        )
    )

    admin.shard_maps.assign("tenants", "initech", "p2")
    assert wait_until(lambda: any(isinstance(e, ShardKeysChanged) for e in heard))
    c = admin.register(SERVICE, "p2", "10.0.2.1", 5432, label="c")
    assert wait_until(
        lambda: app.get_service(SERVICE, "initech").label == "c", ignore=(NoInstanceAvailable,)
    )
    admin.deregister(a)
    assert wait_until(lambda: sorted(state(app)) == ["p1:b", "p2:c"])
    assert app.explain(SERVICE, "acme").partition == "p1"
    assert app.connection_state == "connected" and app.staleness == 0
    with pytest.raises(ServiceNotFound, match="did you mean"):
        app.get_service("orders-dv")

    # The process is in /clients while it is connected, kept by the agent's session.
    assert raw_zk.exists(client_path(SERVICE, "app")) is not None
    app.close()
    assert wait_until(lambda: raw_zk.exists(client_path(SERVICE, "app")) is None)
    assert c.label == "c"


def test_a_process_writes_on_a_session_of_its_own_opened_by_its_first_write(
    agent, admin, make_client, socket_path, raw_zk
):
    app = through(make_client, socket_path)
    neighbour = through(make_client, socket_path, "neighbour")
    app.prefetch(SERVICE)
    neighbour.prefetch(SERVICE)
    mine = app.register(SERVICE, "p1", "10.0.1.9", 5432, label="mine")
    theirs = neighbour.register(SERVICE, "p2", "10.0.2.9", 5432, label="theirs")
    assert app.session_id is not None and app.session_id != neighbour.session_id
    stat = raw_zk.exists(instance_path(SERVICE, "p1", "mine"))
    assert stat.ephemeralOwner == app.session_id  # dies with the process, not the agent
    assert wait_until(lambda: sorted(state(app)) == ["p1:mine", "p2:theirs"])
    app.close()
    assert raw_zk.exists(mine.path) is None
    assert raw_zk.exists(theirs.path) is not None  # a neighbour's is not touched
    assert wait_until(lambda: sorted(state(neighbour)) == ["p2:theirs"])


def test_an_agent_gone_leaves_processes_serving_stale_and_a_new_one_converges_them(
    make_client, admin, socket_path
):
    session = make_client("host-agent", announce=False, agent=False, persistent_watches=True)
    server = AgentServer(session, socket_path).start()
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    apps = [through(make_client, socket_path, f"app-{i}") for i in range(3)]
    for app in apps:
        app.prefetch(SERVICE)
    server.stop()
    assert wait_until(lambda: all(app.connection_state == "suspended" for app in apps))
    assert all(app.get_service(SERVICE, "acme").label == "a" for app in apps)  # still served
    time.sleep(0.05)  # staleness counts from the loss (a bounded poll checks it next)
    assert all(app.staleness > 0 for app in apps)
    admin.register(SERVICE, "p1", "10.0.1.2", 5432, label="b")
    with AgentServer(session, socket_path):
        expected = fresh_state(make_client)
        assert wait_until(lambda: all(state(app) == expected for app in apps), timeout=15)
        assert all(app.connection_state == "connected" for app in apps)


def test_the_agents_own_session_cut_marks_processes_stale_and_they_converge(
    proxy, make_client, admin, socket_path
):
    with AgentServer(session_through(make_client, proxy), socket_path):
        admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
        app = through(make_client, socket_path)
        app.prefetch(SERVICE)
        proxy.cut()
        assert wait_until(lambda: app.connection_state == "suspended", timeout=20)
        admin.register(SERVICE, "p2", "10.0.2.1", 5432, label="b")
        proxy.restore()
        expected = fresh_state(make_client)
        assert wait_until(lambda: state(app) == expected, timeout=20)
        assert wait_until(lambda: app.connection_state == "connected")


def test_processes_converge_after_random_changes_under_agent_faults(
    proxy, make_client, admin, socket_path
):
    """Random changes while the agent's link is cut or paused, and while the agent is gone;
    after each fault every process's cache equals a fresh read."""
    seed = int(os.environ.get("SENTINEL_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    session = session_through(make_client, proxy)
    server = AgentServer(session, socket_path).start()
    apps = [through(make_client, socket_path, f"app-{i}") for i in range(3)]
    registrations: dict[str, object] = {}
    timeline: list[str] = []

    def change() -> None:
        label = f"r{rng.randrange(6)}"
        if label in registrations and rng.random() < 0.4:
            admin.deregister(registrations.pop(label))
            timeline.append(f"deregister {label}")
        elif label in registrations:
            admin.update_metrics(registrations[label], {"replication_lag": rng.random()})
            timeline.append(f"metrics {label}")
        else:
            partition = rng.choice(["p1", "p2"])
            registrations[label] = admin.register(
                SERVICE, partition, f"10.0.0.{rng.randrange(1, 250)}", 5432, label=label
            )
            timeline.append(f"register {label} in {partition}")

    try:
        registrations["r0"] = admin.register(SERVICE, "p1", "10.0.0.1", 5432, label="r0")
        for app in apps:
            app.prefetch(SERVICE)
        for round_ in range(4):
            fault = ("cut", "pause", "restart")[round_ % 3]
            timeline.append(f"fault {fault}")
            if fault == "cut":
                proxy.cut()
            elif fault == "pause":
                proxy.pause()
            else:
                server.stop()
            for _ in range(rng.randrange(2, 6)):
                change()
            if fault == "cut":
                proxy.restore()
            elif fault == "pause":
                proxy.resume()
            else:
                server = AgentServer(session, socket_path).start()
            expected = fresh_state(make_client)
            converged = wait_until(
                lambda expected=expected: all(state(app) == expected for app in apps), 20
            )
            assert converged is not None, (
                f"seed {seed} (SENTINEL_TEST_SEED to replay): after {timeline}, "
                f"{[state(app) for app in apps]} != {expected}"
            )
    finally:
        server.stop()


def _raw(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    return sock


def _hello(sock: socket.socket, namespace: str, client: str = "raw", auth_client=None) -> dict:
    protocol.send(
        sock,
        {
            "op": "hello",
            "version": 1,
            "namespace": namespace,
            "client": client,
            "auth_client": auth_client,
        },
    )
    return protocol.receive(sock, protocol.MAX_REPLY_BYTES, protocol.REPLIES)


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.mark.parametrize(
    "attack",
    [
        "oversized",
        "not-json",
        "unknown-op",
        "no-hello",
        "other-namespace",
        "bad-service",
        "other-pid",
        "deep-json",
    ],
)
def test_a_garbage_frame_drops_only_its_connection(
    attack, agent, admin, make_client, socket_path, namespace
):
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    app = through(make_client, socket_path)
    app.prefetch(SERVICE)
    dropped = AGENT_DROPPED.labels("protocol")._value.get()
    sock = _raw(socket_path)
    if attack != "no-hello" and attack != "other-namespace":
        assert _hello(sock, namespace)["op"] == "welcome"
    frames = {
        "oversized": struct.pack(">I", protocol.MAX_REQUEST_BYTES + 1) + b"{}",
        "not-json": struct.pack(">I", 5) + b"\xff\xfe{{{",
        "unknown-op": protocol.encode({"op": "drop-tables", "id": 1}),
        "no-hello": protocol.encode({"op": "follow", "id": 1, "service": SERVICE}),
        "other-namespace": protocol.encode(
            {"op": "hello", "version": 1, "namespace": "/else", "client": "x", "auth_client": None}
        ),
        "bad-service": protocol.encode({"op": "follow", "id": 1, "service": "../auth"}),
        "other-pid": protocol.encode(
            {
                "op": "announce",
                "service": SERVICE,
                "record": json.dumps({"v": 1, "service": SERVICE, "client_id": "raw", "pid": 1}),
            }
        ),
        "deep-json": (lambda body: struct.pack(">I", len(body)) + body)(b"[" * 5000 + b"]" * 5000),
    }
    sock.sendall(frames[attack])
    assert _closed_by_peer(sock)
    sock.close()
    assert AGENT_DROPPED.labels("protocol")._value.get() == dropped + 1
    # The agent serves the others as before.
    admin.register(SERVICE, "p1", "10.0.1.2", 5432, label="b")
    assert wait_until(lambda: sorted(state(app)) == ["p1:a", "p1:b"])


def test_a_slow_process_is_dropped_not_waited_for(admin, make_client, socket_path, namespace):
    big = {"blob": "x" * 60_000}  # each instance's properties: a state frame of ~3.6 MB
    for i in range(60):
        admin.register(
            SERVICE, "p1", f"10.0.{i // 200}.{i % 200 + 1}", 5432, label=f"r{i}", properties=big
        )
    session = make_client("host-agent", announce=False, agent=False, persistent_watches=True)
    with AgentServer(session, socket_path, send_timeout=8.0):
        app = through(make_client, socket_path)
        app.prefetch(SERVICE)
        slow = _raw(socket_path)
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        assert _hello(slow, namespace)["op"] == "welcome"
        protocol.send(slow, {"op": "follow", "id": 1, "service": SERVICE})  # and never reads
        dropped = AGENT_DROPPED.labels("slow")._value.get()
        for round_ in range(6):
            admin.update_metrics(SERVICE, "p1", "r0", {"replication_lag": float(round_)})
            wanted = {"replication_lag": float(round_)}
            assert wait_until(lambda wanted=wanted: state(app)["p1:r0"][3] == wanted)
        # Every change reached the app while the slow one was still held: a change queued
        # behind the slow process would have waited for its drop (8 s without reading). No
        # bound on the app's own lag, which is the machine's and not this test's.
        assert AGENT_DROPPED.labels("slow")._value.get() == dropped
        assert wait_until(lambda: AGENT_DROPPED.labels("slow")._value.get() == dropped + 1, 20)
        slow.close()


def test_a_credential_crosses_the_socket_sealed_and_opens_in_the_process(
    agent, admin, make_client, socket_path, namespace
):
    secret = f"s3cret-{uuid.uuid4().hex}"
    app = through(make_client, socket_path, auth=AuthConfig(keys=ClientKeyring.generate()))
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    admin.credentials.publish(SERVICE, "app", {"user": "app", "password": secret})
    assert wait_until(lambda: app.get_service(SERVICE, "acme").auth is not None)
    assert app.get_service(SERVICE, "acme").auth["password"] == secret

    # What the agent sends for that client: the sealed node, never the secret.
    sock = _raw(socket_path)
    _hello(sock, namespace, client="eavesdropper", auth_client="app")
    protocol.send(sock, {"op": "follow", "id": 1, "service": SERVICE})
    frame = protocol.receive(sock, protocol.MAX_REPLY_BYTES, protocol.REPLIES)
    sock.close()
    assert frame["op"] == "service" and frame["auth"] is not None
    assert secret not in json.dumps(frame)


def test_the_agent_process_holds_no_credential_in_the_clear(
    zookeeper, make_client, namespace, socket_path
):
    """The secret is in the process that opened it and nowhere in the agent's memory."""
    secret = f"s3cret-{uuid.uuid4().hex}"
    admin = make_client("admin", announce=False, agent=False)
    admin.ensure_service(SERVICE)
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    daemon = Daemon(zookeeper, namespace, "agent", "--socket", socket_path)
    try:
        assert wait_until(lambda: daemon.saw("serving"), 20)
        app = through(make_client, socket_path, auth=AuthConfig(keys=ClientKeyring.generate()))
        app.prefetch(SERVICE)
        admin.credentials.publish(SERVICE, "app", {"user": "app", "password": secret})
        assert wait_until(lambda: (app.get_service(SERVICE).auth or {}).get("password") == secret)
        try:
            found = _memory_holds(daemon.process.pid, secret.encode())
        except PermissionError as exc:
            pytest.skip(f"cannot read the agent's memory here ({exc}): ptrace is restricted")
        assert not found
        assert _memory_holds(os.getpid(), secret.encode())  # the scan finds what is there
    finally:
        daemon.stop()


def _memory_holds(pid: int, needle: bytes) -> bool:
    """Whether any readable mapping of process ``pid`` holds ``needle`` (UTF-8 and UTF-16
    forms: Python keeps str data as either)."""
    forms = (needle, needle.decode().encode("utf-16-le"))
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5].startswith("[v")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
            if any(form in chunk for form in forms):
                return True
    return False


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_another_users_process_is_refused_at_the_socket(make_client, socket_path, namespace):
    session = make_client("host-agent", announce=False, agent=False)
    probe = (
        "import json, socket, struct, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(10)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except OSError as exc:\n"
        "    print('connect', exc.errno); sys.exit()\n"
        "body = json.dumps({'op': 'hello', 'version': 1, 'namespace': sys.argv[2],\n"
        "                   'client': 'nobody', 'auth_client': None}).encode()\n"
        "try:\n"
        "    s.sendall(struct.pack('>I', len(body)) + body)\n"
        "    print('answered' if s.recv(4) else 'closed')\n"
        "except OSError:  # reset, or a broken pipe: closed either way\n"
        "    print('closed')\n"
    )

    def as_nobody() -> str:
        return run_as_nobody(probe, socket_path, namespace)

    with AgentServer(session, socket_path) as server:
        assert Path(socket_path).stat().st_mode & 0o777 == 0o600
        assert as_nobody() == "connect 13"  # EACCES: the file's mode keeps it out
    # Another user allowed: the file lets everyone reach the peer check, which refuses it.
    with AgentServer(session, socket_path, allowed_uids=[65533]) as server:
        refused = AGENT_DROPPED.labels("refused")._value.get()
        assert as_nobody() == "closed"
        assert AGENT_DROPPED.labels("refused")._value.get() == refused + 1
        assert server.processes == 0
    with AgentServer(session, socket_path, allowed_uids=[65534]):
        assert as_nobody() == "answered"  # nothing loosened by hand


def test_sentinel_agent_killed_and_restarted_converges_its_processes(
    zookeeper, make_client, admin, namespace, socket_path, raw_zk
):
    daemon = Daemon(zookeeper, namespace, "agent", "--socket", socket_path)
    try:
        assert wait_until(lambda: daemon.saw("serving"), 20)
        admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
        app = through(make_client, socket_path)
        app.prefetch(SERVICE)
        daemon.stop()  # SIGKILL: its socket file stays behind
        assert Path(socket_path).exists()
        assert wait_until(lambda: app.connection_state == "suspended")
        admin.register(SERVICE, "p2", "10.0.2.1", 5432, label="b")
        daemon = Daemon(zookeeper, namespace, "agent", "--socket", socket_path)
        assert wait_until(lambda: daemon.saw("serving"), 20)  # the stale socket replaced
        expected = fresh_state(make_client)
        assert wait_until(lambda: state(app) == expected, timeout=20)
        # Its /clients entry went with the killed agent's session, and is back.
        assert wait_until(lambda: raw_zk.exists(client_path(SERVICE, "app")) is not None, 20)
    finally:
        daemon.stop()


class _HeldReader:
    """Holds the link's reader thread at a hook on its socket until released, and lets
    the test know once :meth:`AgentLink.close` on another thread has done all but wait for the
    reader (the close's join of the reader thread): the races of a close with the reader,
    held open by events."""

    def __init__(self, monkeypatch) -> None:
        self.monkeypatch = monkeypatch
        self.held = threading.Event()
        self.joining = threading.Event()
        self.release = threading.Event()
        self.reader: threading.Thread | None = None

    def hold(self, sock: socket.socket, path: str) -> None:
        """Called at the hook with the socket it uses: on the link's (its peer is the agent's
        socket file, where the agent's own ends have none), the first time, wait there
        (bounded) until released."""
        if self.reader is not None or sock.family != socket.AF_UNIX or sock.getpeername() != path:
            return
        self.reader = threading.current_thread()
        self.monkeypatch.setattr(self.reader, "join", self._join)
        self.held.set()
        assert self.release.wait(30)

    def _join(self, timeout: float | None = None) -> None:
        self.joining.set()
        threading.Thread.join(self.reader, timeout)

    def close_meanwhile(self, link: AgentLink) -> threading.Thread:
        """Close ``link`` on another thread once the reader is held; release the reader once
        the close waits for it. Returns the closing thread."""
        assert self.held.wait(30)
        closing = threading.Thread(target=link.close)
        closing.start()
        assert self.joining.wait(30)
        self.release.set()
        return closing


def test_closing_a_link_while_its_reader_sends_a_heartbeat_drops_nothing(
    agent_session, namespace, socket_path, monkeypatch, caplog
):
    """The close ended the connection while the reader was between a read and its heartbeat:
    the heartbeat found no socket and the reader logged the agent's connection as dropped
    ("not connected to the agent"). The reader owns its socket now: the close ends the
    connection, the reader sees it and stops, and nothing is logged as a failure."""
    with AgentServer(agent_session, socket_path, heartbeat=0.2):
        link = AgentLink(socket_path, namespace, "app", None, timeout=5.0)
        race = _HeldReader(monkeypatch)
        link.start()
        link.wait_connected(10)
        connected_at = time.monotonic()
        receive = socket.socket.recv

        def recv(sock: socket.socket, *args):
            data = receive(sock, *args)
            # A frame heard (the agent's heartbeat) once the link's own heartbeat is due: the
            # reader sends it next.
            if data and time.monotonic() - connected_at > 0.25:
                race.hold(sock, socket_path)
            return data

        monkeypatch.setattr(socket.socket, "recv", recv)
        caplog.set_level(logging.WARNING, logger="sentinel.agentlink.link")
        closing = race.close_meanwhile(link)
        closing.join(30)
        assert not closing.is_alive() and not race.reader.is_alive()
        dropped = [r.getMessage() for r in caplog.records if "dropping" in r.getMessage()]
        assert dropped == []
        assert link.connections == 1 and not link.connected


def test_closing_a_link_while_it_connects_leaves_no_connection_behind(
    agent_session, namespace, socket_path, monkeypatch
):
    """Closed while its reader was connecting (after the socket's checks, before the hello):
    the connection went on being made, and served and beat for ever after the close. Now the
    connection being made is dropped and the reader stops."""
    with AgentServer(agent_session, socket_path, heartbeat=0.2) as server:
        link = AgentLink(socket_path, namespace, "app", None, timeout=2.0)
        race = _HeldReader(monkeypatch)
        credentials = protocol.peer_credentials

        def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
            race.hold(
                sock, socket_path
            )  # the link's check of who listens; the agent's admission passes
            return credentials(sock)

        monkeypatch.setattr(protocol, "peer_credentials", peer_credentials)
        link.start()
        closing = race.close_meanwhile(link)
        closing.join(30)
        assert not closing.is_alive()
        assert wait_until(lambda: not race.reader.is_alive(), 10)
        assert not link.connected and link.connections == 0
        assert wait_until(lambda: server.processes == 0, 5)


def test_start_says_when_no_agent_answers(make_client, socket_path):
    started = time.monotonic()
    with pytest.raises(AgentUnavailable, match=socket_path):
        make_client("app", agent=socket_path, connect_timeout=1.0)
    assert time.monotonic() - started < 5


def test_the_environment_variable_turns_agent_mode_on(monkeypatch, agent, admin, socket_path):
    from sentinel import Sentinel

    monkeypatch.setenv(protocol.ENV, socket_path)
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    code = (
        "from sentinel import Sentinel\n"
        f"with Sentinel(hosts={admin.hosts!r}, namespace={admin.namespace!r}, "
        "client_id='env-app') as s:\n"
        f"    print(s.agent, s.session_id, s.get_service({SERVICE!r}, 'acme').label)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == [socket_path, "None", "a"]
    assert Sentinel(hosts=admin.hosts, agent=False).agent is None


def test_asyncio_code_resolves_and_streams_events_through_the_agent(
    agent, admin, socket_path, zookeeper, namespace
):
    import asyncio

    from sentinel.aio import AsyncSentinel

    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")

    async def scenario() -> tuple[str, str]:
        async with AsyncSentinel(
            hosts=zookeeper.connect_string,
            client_id="async-app",
            namespace=namespace,
            agent=socket_path,
        ) as client:
            first = await client.aget_service(SERVICE, "acme")
            async with client.events(SERVICE) as events:
                admin.register(SERVICE, "p1", "10.0.1.2", 5432, label="b")
                async for event in events:
                    if isinstance(event, InstancesChanged) and event.added:
                        return first.label, event.added[0].label
        raise AssertionError("the stream ended")

    assert asyncio.run(asyncio.wait_for(scenario(), 20)) == ("a", "b")


def test_a_key_ring_whose_keys_are_published_opens_no_session(
    agent, admin, make_client, socket_path, raw_zk
):
    """The agent tells a process with a key ring what is published for its client: a ring
    published before (another worker of the same application) needs no session; a new one
    is published on the process's own session, and the manager seals to it as to any."""
    ring = ClientKeyring.generate()
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    first = through(make_client, socket_path, "etl-1", auth=AuthConfig(keys=ring, client="etl"))
    assert first.session_id is not None  # nothing published yet: it published the ring
    second = through(make_client, socket_path, "etl-2", auth=AuthConfig(keys=ring, client="etl"))
    assert second.session_id is None
    admin.credentials.publish(SERVICE, "etl", {"user": "etl", "password": "pw"})
    assert wait_until(lambda: (second.get_service(SERVICE, "acme").auth or {}).get("user") == "etl")
    other = through(
        make_client,
        socket_path,
        "etl-3",
        auth=AuthConfig(keys=ClientKeyring.generate(), client="etl-new"),
    )
    assert other.session_id is not None


def test_a_process_is_served_only_what_its_own_identity_may_read(
    zookeeper, make_client, namespace, socket_path, raw_zk
):
    """A service whose node not everyone may read: the agent's session reads it, and serves
    it to a process whose identity may read it too, never to another."""
    from kazoo.client import KazooClient
    from kazoo.security import make_acl, make_digest_acl

    from sentinel.errors import AccessDenied
    from sentinel.registry.records import InstanceRecord, ServiceSpec

    assert raw_zk.exists("/") is not None  # the namespace, made by the fixture
    owner = KazooClient(
        f"{zookeeper.connect_string}{namespace}", auth_data=[("digest", "agent:agent-pw")]
    )
    owner.start(timeout=10)
    try:
        owner.ensure_path("/services")
        restricted = [
            make_digest_acl("agent", "agent-pw", all=True),
            make_digest_acl("alice", "alice-pw", read=True),
        ]
        spec_path = "/services/private"
        owner.create(spec_path, ServiceSpec("private").to_bytes(spec_path), acl=restricted)
        node = instance_path("private", "p1", "a")
        owner.create(
            node,
            InstanceRecord("private", "p1", "a", "10.0.9.9", 80).to_bytes(node),
            acl=[make_acl("world", "anyone", read=True)],
        )
        session = make_client("host-agent", announce=False, agent=False, identity="agent:agent-pw")
        with AgentServer(session, socket_path):
            alice = through(make_client, socket_path, "alice", identity="alice:alice-pw")
            assert alice.get_service("private").host == "10.0.9.9"
            for name, identity in (("bob", "bob:bob-pw"), ("anonymous", None)):
                other = through(make_client, socket_path, name, identity=identity)
                with pytest.raises(AccessDenied, match="may not read /services/private"):
                    other.get_service("private")
    finally:
        owner.stop()
        owner.close()


def test_a_process_started_while_the_agent_is_down_serves_its_snapshot_file_then_converges(
    make_client, admin, socket_path, tmp_path
):
    from sentinel import CacheConfig

    snapshot = str(tmp_path / "cache.json")
    session = make_client("host-agent", announce=False, agent=False)
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    with AgentServer(session, socket_path):
        first = through(
            make_client, socket_path, "app-1", cache=CacheConfig(snapshot_path=snapshot)
        )
        first.prefetch(SERVICE)
        first.close()  # writes the file
    app = through(
        make_client,
        socket_path,
        "app-2",
        connect_timeout=1.0,
        cache=CacheConfig(snapshot_path=snapshot),
    )
    assert app.connection_state == "snapshot" and app.staleness > 0
    assert app.get_service(SERVICE, "acme").label == "a"  # served from the file
    admin.register(SERVICE, "p1", "10.0.1.2", 5432, label="b")
    with AgentServer(session, socket_path):
        assert wait_until(lambda: sorted(state(app)) == ["p1:a", "p1:b"], timeout=15)
        assert wait_until(lambda: app.connection_state == "connected")


def test_a_follow_while_the_agents_session_is_down_is_an_answer_not_a_dropped_connection(
    proxy, make_client, admin, socket_path
):
    from sentinel.errors import ZooKeeperUnavailable

    session = session_through(make_client, proxy, connect_timeout=1.0)
    with AgentServer(session, socket_path) as server:
        admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
        app = through(make_client, socket_path)
        dropped = {r: AGENT_DROPPED.labels(r)._value.get() for r in ("protocol", "error")}
        proxy.cut()
        with pytest.raises(ZooKeeperUnavailable):
            app.get_service(SERVICE, "acme")  # the agent cannot load it now
        assert server.processes == 1  # still connected
        assert {r: AGENT_DROPPED.labels(r)._value.get() for r in dropped} == dropped
        proxy.restore()
        assert wait_until(
            lambda: app.get_service(SERVICE, "acme").label == "a",
            timeout=20,
            ignore=(ZooKeeperUnavailable,),
        )


def test_the_agent_never_replaces_a_file_that_is_not_a_socket_nor_a_live_agent(
    make_client, socket_path
):
    from sentinel.errors import SentinelError

    session = make_client("host-agent", announce=False, agent=False)
    Path(socket_path).write_text("someone's file")
    with pytest.raises(SentinelError, match="is not a socket"):
        AgentServer(session, socket_path).start()
    assert Path(socket_path).read_text() == "someone's file"
    os.unlink(socket_path)
    with (
        AgentServer(session, socket_path),
        pytest.raises(SentinelError, match="already serves"),
    ):
        AgentServer(session, socket_path).start()


def test_a_frame_from_the_agent_that_does_not_decode_is_skipped_and_the_state_kept(
    agent, admin, make_client, socket_path
):
    """What the agent sends is untrusted as ZooKeeper's nodes are: a garbage state of a
    service is counted and skipped, the state before it served, and the next good frame
    applied."""
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    app = through(make_client, socket_path)
    app.prefetch(SERVICE)
    # The link's first connection schedules a re-sync (after a jitter), which applies the
    # agent's answer in place of any frame not applied yet: let it pass before injecting.
    assert wait_until(
        lambda: app.cache_stats.resyncs >= 1 and not app.session.cache.worker.resync_due
    )
    before, errors = state(app), app.cache_stats.decode_errors
    follower = app.session.cache._follower  # the link's reader hands every frame to it
    for entry in (
        {"spec": "{", "instances": {}, "metrics": {}},
        {"spec": "{}", "instances": {"p1:a": [0, "not json"]}, "metrics": {}},
        "not an object",
    ):  # one at a time: a service's frames coalesce, the latest applied
        follower.receive({"op": "service", "service": SERVICE, "entry": entry})
        errors += 1
        assert wait_until(lambda errors=errors: app.cache_stats.decode_errors == errors)
        assert state(app) == before
    admin.register(SERVICE, "p1", "10.0.1.2", 5432, label="b")
    assert wait_until(lambda: sorted(state(app)) == ["p1:a", "p1:b"])


def _credential_watches(zookeeper, agent: AgentServer, prefix: str) -> list[str]:
    """The watches the server holds for the agent's session on credential nodes of ``SERVICE``
    whose client name starts with ``prefix`` (4lw ``wchc``)."""
    host, port = zookeeper.connect_string.split(",")[0].rsplit(":", 1)
    session = f"0x{agent.sentinel.session.zk.client_id[0]:x}"
    held, current = [], None
    for line in four_letter_word(host, int(port), "wchc", timeout=5).splitlines():
        if line.startswith("0x"):
            current = line.strip()
        elif current == session and f"/auth/{SERVICE}/{prefix}" in line:
            held.append(line.strip())
    return held


def test_a_claimed_client_name_costs_the_agent_no_watch_once_its_process_leaves(
    agent, admin, socket_path, namespace, zookeeper
):
    # A local process may claim any client name; the agent watches that client's credential
    # node while it is connected. For a made-up name the node never exists, and a watch on an
    # absent node only ends when the node is created: each claim used to cost the agent's
    # session a watch for good.
    for i in range(10):
        sock = _raw(socket_path)
        _hello(sock, namespace, client=f"claim{i}", auth_client=f"ghost{i}")
        protocol.send(sock, {"op": "follow", "id": 1, "service": SERVICE})
        frame = protocol.receive(sock, protocol.MAX_REPLY_BYTES, protocol.REPLIES)
        assert frame["op"] == "service" and frame["auth"] is None
        assert wait_until(lambda i=i: _credential_watches(zookeeper, agent, f"ghost{i}"))
        sock.close()
    assert wait_until(lambda: _credential_watches(zookeeper, agent, "ghost") == []), (
        _credential_watches(zookeeper, agent, "ghost")
    )
    assert agent._credentials._texts == {}


def test_a_clients_credential_is_followed_while_any_of_its_processes_is_connected(
    agent, admin, make_client, socket_path, namespace
):
    app = through(make_client, socket_path, auth=AuthConfig(keys=ClientKeyring.generate()))
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    assert app.get_service(SERVICE, "acme").auth is None
    # Its own session (it published its keys) re-syncs through the agent once, following the
    # service again; done before the other process leaves, so nothing re-follows after.
    assert wait_until(lambda: app.cache_stats.resyncs >= 1)
    other = _raw(socket_path)  # another process of the same client, which leaves
    _hello(other, namespace, client="app-2", auth_client="app")
    protocol.send(other, {"op": "follow", "id": 1, "service": SERVICE})
    assert protocol.receive(other, protocol.MAX_REPLY_BYTES, protocol.REPLIES)["op"] == "service"
    other.close()
    assert wait_until(lambda: agent.processes == 1)
    admin.credentials.publish(SERVICE, "app", {"user": "app", "password": "p1"})
    assert wait_until(lambda: (app.get_service(SERVICE, "acme").auth or {}).get("password") == "p1")


def test_agent_status_names_each_process_and_what_it_follows(
    agent, admin, make_client, socket_path, namespace, tmp_path
):
    from tests.conftest import sentinel_in_process

    def status(*options: str):
        return sentinel_in_process(
            "agent", "status", "--socket", socket_path, "--namespace", namespace, *options
        )

    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    through(make_client, socket_path, "billing-api").prefetch(SERVICE)
    through(make_client, socket_path, "idle").start()

    def processes():
        answer = status("--json")
        assert answer.returncode == 0, answer.stderr
        document = json.loads(answer.stdout)
        assert (document["state"], document["staleness"]) == ("connected", 0)
        return sorted((p["client"], p["services"], p["pid"]) for p in document["processes"])

    # The asking command itself is not listed; both processes here are this test's.
    assert wait_until(
        lambda: processes() == [("billing-api", [SERVICE], os.getpid()), ("idle", [], os.getpid())]
    )
    text = status()
    assert text.stdout.splitlines()[0] == (f"agent {socket_path}: ZooKeeper session connected")
    assert f"billing-api  {SERVICE}" in text.stdout
    # No agent on the socket: exit 3, as for an unreachable ZooKeeper.
    missing = sentinel_in_process(
        "agent", "status", "--socket", str(tmp_path / "none.sock"), "--timeout", "0.5"
    )
    assert missing.returncode == 3 and "none.sock" in missing.stderr
