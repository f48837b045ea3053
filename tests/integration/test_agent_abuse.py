"""The host agent's connections under abuse, against a real ZooKeeper: idle connections by the
thousand, hellos that never come, caps, a service too large to send, an agent that goes quiet,
a process that does, and a full descriptor table. Each fails on the agent of thread-per-
connection days (checked by hand; see docs/test-catalogue.md)."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import time

import pytest

from sentinel.agent.server import AgentServer
from sentinel.agentlink import protocol
from sentinel.errors import AgentServiceUnavailable, AgentUnavailable
from sentinel.registry.layout import instance_path
from sentinel.telemetry import AGENT_DROPPED, AGENT_ERRORS, AGENT_UNSENT
from sentinel.testing.helpers import wait_until
from tests.integration import test_agent
from tests.integration.daemons import Daemon
from tests.integration.test_agent import (
    SERVICE,
    _closed_by_peer,
    _raw,
    fresh_state,
    state,
    through,
)

pytestmark = pytest.mark.integration

socket_path = test_agent.socket_path  # the fixtures, shared
agent_session = test_agent.agent_session

OTHER = "billing-api"  # a second service of the same process
# The idle connections of the thread test (SENTINEL_ABUSE_CONNECTIONS to run it smaller, as
# on the old agent, whose two threads per connection would otherwise load the machine).
IDLE = int(os.environ.get("SENTINEL_ABUSE_CONNECTIONS", "5000"))
# What the agent process may run whatever its connections: its loop, 8 request workers, 2
# frame workers, the main thread, kazoo's threads and the cache's worker, with room to spare.
MAX_AGENT_THREADS = 30


@pytest.fixture
def admin(make_client):
    admin = make_client("admin", announce=False, agent=False)
    admin.ensure_service(SERVICE, scheme="postgresql")
    admin.ensure_service(OTHER, scheme="http")
    return admin


def _count(counter, *labels) -> float:
    return (counter.labels(*labels) if labels else counter)._value.get()


def _hello(sock: socket.socket, namespace: str, version: int = 2) -> None:
    protocol.send(
        sock,
        {
            "op": "hello",
            "version": version,
            "namespace": namespace,
            "client": "idle",
            "auth_client": None,
        },
    )


def _open_files_at_least(count: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < count:
        pytest.skip(f"{count} open files needed, the hard limit here is {hard}")
    if soft != resource.RLIM_INFINITY and soft < count:
        resource.setrlimit(resource.RLIMIT_NOFILE, (count if hard == -1 else hard, hard))


def test_thousands_of_idle_connections_cost_no_threads_and_a_new_process_is_served_at_once(
    zookeeper, make_client, admin, namespace, socket_path
):
    """IDLE connections from the test's own uid (the caps raised above them: the per-uid cap
    is the next test's), each past its hello and then silent (version 1: no heartbeats, so
    none is dropped for its silence); the agent's threads stay a fixed few, and a new
    process is served within a second."""
    _open_files_at_least(IDLE + 512)
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    cap = str(IDLE + 100)
    daemon = Daemon(
        zookeeper,
        namespace,
        "agent",
        "--socket",
        socket_path,
        "--max-connections",
        cap,
        "--max-connections-per-uid",
        cap,
    )
    idle: list[socket.socket] = []
    try:
        assert wait_until(lambda: daemon.saw("serving"), 60)  # its start, on a loaded machine
        tasks = f"/proc/{daemon.process.pid}/task"
        for _ in range(IDLE):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(socket_path)  # blocking: waits while the agent's backlog is full
            sock.settimeout(10)
            _hello(sock, namespace, version=1)
            idle.append(sock)
        # Each welcomed: the agent answered every hello (the last one's answer is readable).
        assert protocol.receive(idle[-1], protocol.MAX_REPLY_BYTES, protocol.REPLIES)["op"] == (
            "welcome"
        )
        threads = len(os.listdir(tasks))
        print(f"agent threads with {IDLE} idle connections: {threads}")
        assert threads <= MAX_AGENT_THREADS
        started = time.monotonic()
        app = through(make_client, socket_path)
        assert app.get_service(SERVICE).label == "a"
        served = time.monotonic() - started
        print(f"a new process served in {served * 1000:.0f} ms")
        assert served < 1.0
        assert len(os.listdir(tasks)) <= MAX_AGENT_THREADS
    finally:
        for sock in idle:
            sock.close()
        daemon.stop()


def test_connections_over_the_per_uid_cap_are_refused_and_told_why(
    agent_session, make_client, admin, socket_path
):
    with AgentServer(agent_session, socket_path, max_connections_per_uid=20) as server:
        refused = _count(AGENT_DROPPED, "cap")
        held = [_raw(socket_path) for _ in range(20)]
        assert wait_until(lambda: server.processes == 20)
        over = [_raw(socket_path) for _ in range(5)]
        for sock in over:  # told why, then closed
            answer = protocol.receive(sock, protocol.MAX_REPLY_BYTES, protocol.REPLIES)
            assert answer["op"] == "error" and "20 connections of uid" in answer["message"]
            assert _closed_by_peer(sock)
        assert _count(AGENT_DROPPED, "cap") == refused + 5
        with pytest.raises(AgentUnavailable, match="refused this process: it serves 20"):
            make_client("app", agent=socket_path, connect_timeout=1.0)
        for sock in held + over:
            sock.close()
        assert wait_until(lambda: server.processes == 0)
        admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
        assert through(make_client, socket_path).get_service(SERVICE).label == "a"


def test_a_hello_that_never_comes_is_dropped_at_the_deadline(agent_session, socket_path):
    with AgentServer(agent_session, socket_path, hello_timeout=0.5) as server:
        dropped = _count(AGENT_DROPPED, "hello")
        started = time.monotonic()  # before the agent accepts it
        sock = _raw(socket_path)
        assert _closed_by_peer(sock)  # within its 10 s read timeout
        took = time.monotonic() - started
        assert 0.5 <= took < 2.0, took  # the deadline, plus a tick of the loop
        assert _count(AGENT_DROPPED, "hello") == dropped + 1
        assert server.processes == 0


def test_a_process_that_sends_nothing_not_even_a_heartbeat_is_dropped(
    agent_session, make_client, namespace, socket_path
):
    with AgentServer(agent_session, socket_path, heartbeat=0.3) as server:
        dropped = _count(AGENT_DROPPED, "silent")
        sock = _raw(socket_path)
        _hello(sock, namespace)
        welcome = protocol.receive(sock, protocol.MAX_REPLY_BYTES, protocol.REPLIES)
        assert welcome["op"] == "welcome" and welcome["heartbeat"] == 0.3
        # The agent's heartbeats come meanwhile; this end never answers.
        assert protocol.receive(sock, protocol.MAX_REPLY_BYTES, protocol.REPLIES) == (
            protocol.HEARTBEAT
        )
        assert _closed_by_peer(sock)
        assert _count(AGENT_DROPPED, "silent") == dropped + 1
        # A process of this library answers with its own, and stays.
        app = through(make_client, socket_path)
        time.sleep(1.5)  # five heartbeats: long past the agent's bound of three
        assert server.processes == 1 and app.connection_state == "connected"


def test_a_node_of_four_byte_characters_near_the_size_limit_is_served(
    agent_session, admin, make_client, socket_path, raw_zk
):
    """Written anonymously (an open namespace): 480 KB of 4-byte characters, within the
    registry's bound. Escaped to ASCII it was 1.44 MB, over the bound, and the frame could not
    be built: the agent's sender died and the process stayed `connected` with no frame ever
    again. Now it is served like any node."""
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    with AgentServer(agent_session, socket_path):
        app = through(make_client, socket_path)
        app.prefetch(SERVICE)
        template = json.loads(raw_zk.get(instance_path(SERVICE, "p1", "a"))[0])
        big = {**template, "label": "big", "host": "10.0.1.2", "properties": {"b": "😀" * 120_000}}
        data = json.dumps(big, ensure_ascii=False).encode()
        assert 470_000 < len(data) < 512 * 1024
        raw_zk.create(instance_path(SERVICE, "p1", "big"), data)
        assert wait_until(lambda: "p1:big" in state(app), 20)
        admin.register(SERVICE, "p1", "10.0.1.3", 5432, label="c")  # and later changes flow
        assert wait_until(lambda: "p1:c" in state(app))
        assert app.connection_state == "connected" and app.staleness == 0


def test_a_service_too_large_to_send_makes_the_process_stale_and_its_others_flow(
    agent_session, admin, make_client, socket_path
):
    """The frame bound made small (the agent's ``max_frame_bytes``): one service outgrows it.
    The process hears so, is stale (``suspended``, staleness counting) while its other
    services keep flowing, and is connected and converged once the cause goes."""
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    admin.register(OTHER, "p1", "10.0.2.1", 80, label="x")
    with AgentServer(agent_session, socket_path, max_frame_bytes=32 * 1024):
        app = through(make_client, socket_path)
        app.prefetch(SERVICE)
        app.prefetch(OTHER)
        unsent = _count(AGENT_UNSENT)
        big = admin.register(
            SERVICE, "p1", "10.0.1.2", 5432, label="big", properties={"b": "😀" * 20_000}
        )
        assert wait_until(lambda: app.connection_state == "suspended", 10)
        assert app.staleness > 0 or wait_until(lambda: app.staleness > 0, 1)
        assert _count(AGENT_UNSENT) > unsent
        assert "p1:big" not in state(app)  # served as it was
        admin.register(OTHER, "p1", "10.0.2.2", 80, label="y")  # the others flow
        assert wait_until(lambda: len(app.cached_instances(OTHER)) == 2)
        assert app.connection_state == "suspended"
        admin.deregister(big)  # the cause goes
        assert wait_until(lambda: app.connection_state == "connected", 10)
        expected = fresh_state(make_client)
        assert wait_until(lambda: state(app) == expected)
        assert app.staleness == 0
        # A first load of a service too large is an answer naming it, not a dead link.
        admin.register(OTHER, "p1", "10.0.2.3", 80, label="z", properties={"b": "x" * 40_000})
        other = through(make_client, socket_path, "other")
        with pytest.raises(AgentServiceUnavailable, match=OTHER):
            other.get_service(OTHER)
        assert other.get_service(SERVICE).label == "a"


def test_an_agent_that_goes_quiet_makes_its_processes_stale_within_the_heartbeat_bound(
    zookeeper, make_client, admin, namespace, socket_path
):
    heartbeat = 0.5
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    daemon = Daemon(
        zookeeper, namespace, "agent", "--socket", socket_path, "--heartbeat", str(heartbeat)
    )
    try:
        assert wait_until(lambda: daemon.saw("serving"), 60)  # its start, on a loaded machine
        app = through(make_client, socket_path)
        app.prefetch(SERVICE)
        assert app.connection_state == "connected"
        os.kill(daemon.process.pid, signal.SIGSTOP)  # alive, its socket open, silent
        stopped = time.monotonic()
        assert wait_until(lambda: app.connection_state == "suspended", 10)
        took = time.monotonic() - stopped
        print(f"stale {took:.2f}s after the agent went quiet (heartbeat {heartbeat}s)")
        # Three heartbeats missed, noticed at the next wake of the reader (one more).
        assert took < (protocol.HEARTBEAT_MISSES + 1) * heartbeat + 1.0
        assert app.get_service(SERVICE).label == "a"  # served, marked stale
        os.kill(daemon.process.pid, signal.SIGCONT)
        assert wait_until(lambda: app.connection_state == "connected", 20)
    finally:
        os.kill(daemon.process.pid, signal.SIGCONT)
        daemon.stop()


def test_a_full_descriptor_table_pauses_accepting_and_never_ends_it(
    agent_session, admin, make_client, socket_path
):
    """The agent's process out of descriptors: accepting fails (EMFILE), is counted, and
    resumes once descriptors are free again; nothing else of the agent stops."""
    admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    with AgentServer(agent_session, socket_path):
        app = through(make_client, socket_path)
        app.prefetch(SERVICE)
        waiting = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
        errors = _count(AGENT_ERRORS, "accept")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest_free = os.open(os.devnull, os.O_RDONLY)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no new descriptor
        try:
            for sock in waiting:
                sock.connect(socket_path)  # into the backlog; accepting them needs descriptors
            wait_until(lambda: _count(AGENT_ERRORS, "accept") > errors, 10)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        admin.register(SERVICE, "p1", "10.0.1.2", 5432, label="b")  # the served are served
        assert wait_until(lambda: "p1:b" in state(app))
        late = through(make_client, socket_path, "late", connect_timeout=5.0)  # accepted
        late.prefetch(SERVICE)
        assert sorted(state(late)) == ["p1:a", "p1:b"]
        assert _count(AGENT_ERRORS, "accept") > errors  # it did fail, and said so
        for sock in waiting:
            sock.close()
