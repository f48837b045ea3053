"""The host agent's deltas against a real ZooKeeper: a process fed change by change stays what a
fresh read of ZooKeeper gives, its listeners hear exact diffs, and whatever breaks the chain (a
gap, a backlog, a delta that does not decode, a new connection) ends in the whole state."""

from __future__ import annotations

import os
import random
import time
import uuid

import pytest

from sentinel.agent import changes
from sentinel.agent.changes import Pending
from sentinel.agent.server import AgentServer
from sentinel.agentlink import protocol
from sentinel.events import InstancesChanged, MetricsChanged
from sentinel.registry.layout import METRICS, instance_path
from sentinel.registry.records import MetricsRecord
from sentinel.telemetry import AGENT_FRAMES
from sentinel.testing.helpers import wait_until
from tests.integration import test_agent
from tests.integration.test_agent import SERVICE, through

pytestmark = pytest.mark.integration

# The agent tests' fixtures: a socket path of its own, and the publisher with the service.
socket_path = test_agent.socket_path
admin = test_agent.admin


def served(client) -> tuple:
    """Everything a client serves of the service: spec, endpoints (every field), metrics
    records and the nodes it could not read."""
    snapshot = client._snapshots.get(SERVICE)
    if snapshot is None:
        return ()
    return snapshot.spec, dict(snapshot.endpoints), dict(snapshot.metrics), snapshot.invalid


def fresh(make_client) -> tuple:
    """What ZooKeeper holds now, read by a new client of its own."""
    reader = make_client(f"fresh-{uuid.uuid4().hex[:6]}", agent=False, announce=False)
    reader.prefetch(SERVICE)
    state = served(reader)
    reader.close()
    return state


def settled(app) -> None:
    """Wait for the re-sync the link's first connection schedules (after a jitter): it asks
    for every service's whole state again, which would hide what a test looks for."""
    assert wait_until(
        lambda: app.cache_stats.resyncs >= 1 and not app.session.cache.worker.resync_due
    )


def frames(op: str) -> float:
    return AGENT_FRAMES.labels(op)._value.get()


class Fold:
    """A listener that keeps the endpoints its events describe, and every event that does not
    follow from what it kept (an inexact diff)."""

    def __init__(self, endpoints) -> None:
        self.endpoints = dict(endpoints)
        self.wrong: list[str] = []
        self.events = 0

    def __call__(self, event) -> None:
        self.events += 1
        if isinstance(event, InstancesChanged):
            for endpoint in event.removed:
                if self.endpoints.pop(endpoint.name, None) != endpoint:
                    self.wrong.append(f"removed {endpoint.name}: not what was held")
            for endpoint in event.added:
                if endpoint.name in self.endpoints:
                    self.wrong.append(f"added {endpoint.name}: held already")
                self.endpoints[endpoint.name] = endpoint
        if isinstance(event, InstancesChanged | MetricsChanged):
            for old, new in event.updated:
                if self.endpoints.get(old.name) != old or old == new:
                    self.wrong.append(f"updated {old.name}: not from what was held, or no change")
                self.endpoints[new.name] = new


@pytest.fixture
def serve(make_client, socket_path):
    """Start agents on the test's socket (one at a time); stopped at the end."""
    servers: list[AgentServer] = []
    session = make_client("host-agent", announce=False, agent=False, persistent_watches=True)

    def start(**kwargs) -> AgentServer:
        server = AgentServer(session, socket_path, send_timeout=5.0, **kwargs).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def following(agent: AgentServer, admin, make_client, socket_path: str) -> tuple:
    """An instance, a process following its service through ``agent`` (settled) with a
    listener, and the agent's connection of that process."""
    a = admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    app = through(make_client, socket_path)
    app.prefetch(SERVICE)
    settled(app)
    heard: list = []
    app.listen(SERVICE, heard.append)
    assert wait_until(lambda: any(SERVICE in c.followed for c in agent._admission.connected()))
    (connection,) = [c for c in agent._admission.connected() if SERVICE in c.followed]
    return agent, a, app, heard, connection


@pytest.mark.parametrize("deltas", [True, False], ids=["deltas", "whole-states"])
def test_a_process_stays_a_fresh_read_and_hears_exact_diffs_through_any_changes(
    deltas, serve, admin, make_client, socket_path, raw_zk
):
    """Random instance registrations, deregistrations, updates, metrics (of instances and of
    names with none) and unreadable nodes, a few at a time: after each batch the process
    serves exactly what a fresh read of ZooKeeper gives, and its listener's events, applied
    one by one, give what it serves. With deltas, nothing is sent whole after the first
    follow and no whole state is asked."""
    seed = int(os.environ.get("SENTINEL_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    serve(deltas=deltas)
    registrations: dict[str, object] = {}
    registrations["r0"] = admin.register(SERVICE, "p1", "10.0.0.1", 5432, label="r0")
    app = through(make_client, socket_path)
    app.prefetch(SERVICE)
    settled(app)
    fold = Fold(app._snapshots[SERVICE].endpoints)
    app.listen(SERVICE, fold)
    wholes = frames("service")
    timeline: list[str] = []

    def change() -> None:
        label = f"r{rng.randrange(8)}"
        roll = rng.random()
        if roll < 0.1:
            path = f"{instance_path(SERVICE, 'p2', label)}-junk"
            if raw_zk.exists(path):
                raw_zk.delete(path)
                timeline.append(f"junk {label} gone")
            else:
                raw_zk.create(path, b"not an instance")
                timeline.append(f"junk {label}")
        elif roll < 0.2:  # a metrics node no instance has (the publisher refuses to write one)
            path = f"{METRICS}/{SERVICE}/p2:ghost-{label}"
            record = MetricsRecord(SERVICE, "p2", f"ghost-{label}", {"lag": roll}, time.time())
            raw_zk.ensure_path(f"{METRICS}/{SERVICE}")
            raw_zk.set(path, record.to_bytes(path)) if raw_zk.exists(path) else raw_zk.create(
                path, record.to_bytes(path)
            )
            timeline.append(f"metrics of no instance {label}")
        elif label not in registrations:
            partition = rng.choice(["p1", "p2"])
            registrations[label] = admin.register(
                SERVICE, partition, f"10.0.0.{rng.randrange(1, 250)}", 5432, label=label
            )
            timeline.append(f"register {label} in {partition}")
        elif roll < 0.4:
            admin.deregister(registrations.pop(label))
            timeline.append(f"deregister {label}")
        elif roll < 0.6:
            status = rng.choice(["up", "draining", "down"])
            registrations[label] = admin.update_registration(
                registrations[label], status=status, weight=rng.randrange(1, 4)
            )
            timeline.append(f"update {label} to {status}")
        else:
            admin.update_metrics(registrations[label], {"replication_lag": rng.random()})
            timeline.append(f"metrics {label}")

    deadline = time.monotonic() + 60  # bounded in time whatever the machine's load
    rounds = 0
    while rounds < 12 and time.monotonic() < deadline:
        for _ in range(rng.randrange(1, 5)):
            change()
        expected = fresh(make_client)
        assert wait_until(lambda expected=expected: served(app) == expected, 20), (
            f"seed {seed} (SENTINEL_TEST_SEED to replay): after {timeline}, the process "
            f"serves {served(app)}, ZooKeeper holds {expected}"
        )
        assert wait_until(lambda: fold.endpoints == dict(app._snapshots[SERVICE].endpoints), 5), (
            f"seed {seed}: after {timeline}, the events give {fold.endpoints}"
        )
        assert fold.wrong == [], f"seed {seed}: after {timeline}: {fold.wrong}"
        rounds += 1
    assert rounds >= 3, f"only {rounds} rounds in the time bound"
    assert fold.events > 0
    if deltas:
        assert frames("service") == wholes  # every change went as a delta
        assert app.cache_stats.agent_whole_states_asked == 0
        assert app.cache_stats.decode_errors == 0
    else:
        assert frames("service") > wholes


def test_a_gap_in_a_services_deltas_ends_in_its_whole_state(serve, admin, make_client, socket_path):
    """A delta the process never got (dropped here on the agent's side): the next one skips a
    number, so the process skips it, asks for the whole state and converges, and its listener
    hears both changes."""
    _, a, app, heard, connection = following(serve(), admin, make_client, socket_path)

    class DropsOne(Pending):
        dropped = 0

        def add_delta(self, service, seq, frame):
            if not self.dropped:
                self.dropped = seq
                return
            super().add_delta(service, seq, frame)

    with connection.due:
        connection.pending = losing = DropsOne()
    admin.update_metrics(a, {"replication_lag": 7.0})
    assert wait_until(lambda: losing.dropped)
    admin.update_metrics(a, {"replication_lag": 9.0})
    expected = fresh(make_client)
    assert wait_until(lambda: served(app) == expected)
    assert app.cache_stats.agent_whole_states_asked == 1
    lags = [new.metrics["replication_lag"] for e in heard for _, new in e.updated]
    assert lags[-1] == 9.0
    # The chain goes on from the whole state: the next change is a delta again.
    admin.update_metrics(a, {"replication_lag": 11.0})
    assert wait_until(lambda: app.get_service(SERVICE, "acme").metrics["replication_lag"] == 11)
    assert app.cache_stats.agent_whole_states_asked == 1


def test_a_backlog_past_the_bound_collapses_into_the_whole_state(
    serve, admin, make_client, socket_path, monkeypatch
):
    """A connection whose frames are not built (a process that does not read) while the
    service changes more times than a connection may have deltas pending: they collapse into
    the whole state, sent once the connection is written to again; nothing is asked."""
    monkeypatch.setattr(changes, "MAX_PENDING_DELTAS", 3)
    agent, a, app, heard, connection = following(serve(), admin, make_client, socket_path)

    def hold() -> bool:
        with connection.due:
            if connection.flushing or connection.out:
                return False
            connection.flushing = True  # as if a frame worker were on it: nothing is built
            return True

    assert wait_until(hold)
    wholes = frames("service")
    held = agent.sentinel._snapshots
    for lag in range(1, 6):
        admin.update_metrics(a, {"replication_lag": float(lag)})
        # One change at a time in the agent's cache (a node's events in a burst coalesce).
        assert wait_until(
            lambda lag=lag: held[SERVICE].endpoints["p1:a"].metrics.get("replication_lag") == lag
        )
    assert connection.pending.collapsed == 1
    assert SERVICE in connection.pending.whole and not connection.pending.deltas
    with connection.due:
        connection.flushing = False
    agent._fanout.schedule(connection)
    expected = fresh(make_client)
    assert wait_until(lambda: served(app) == expected)
    assert frames("service") == wholes + 1
    assert app.cache_stats.agent_whole_states_asked == 0
    assert any(new.metrics["replication_lag"] == 5.0 for e in heard for _, new in e.updated)


def test_a_delta_that_does_not_decode_is_skipped_counted_and_the_whole_state_asked(
    serve, admin, make_client, socket_path, monkeypatch
):
    """The agent sends, across the socket, a delta whose instance node is not an instance:
    the process counts it, keeps its state (the instance keeps its old address), asks for the
    whole state, and converges to what ZooKeeper holds."""
    serve()
    a = admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    app = through(make_client, socket_path)
    app.prefetch(SERVICE)
    settled(app)
    errors = app.cache_stats.decode_errors
    honest = changes.delta

    def garbling(service, old, new, names):
        fields = honest(service, old, new, names)
        if fields and "instances" in fields:
            fields["instances"] = {name: [0, "{not json"] for name in fields["instances"]}
        return fields

    monkeypatch.setattr(changes, "delta", garbling)
    seen = []
    app.listen(SERVICE, seen.append)
    admin.update_registration(a, weight=3)
    assert wait_until(lambda: app.cache_stats.decode_errors == errors + 1)
    assert app.cache_stats.agent_whole_states_asked == 1
    expected = fresh(make_client)
    assert wait_until(lambda: served(app) == expected)
    assert app.get_service(SERVICE, "acme").weight == 3
    updated = [(old.weight, new.weight) for e in seen for old, new in e.updated]
    assert updated == [(1, 3)]  # heard once, from the whole state: nothing garbled applied


def test_a_new_connection_starts_from_the_whole_state_and_numbers_anew(
    serve, admin, make_client, socket_path
):
    """The agent restarted: its numbers start again, lower than the process's last. The
    process follows from the new connection's whole state (which holds what changed while it
    was away) and applies the new agent's deltas, none skipped as old, none asked again."""
    agent = serve()
    a = admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    app = through(make_client, socket_path)
    app.prefetch(SERVICE)
    settled(app)
    for lag in range(1, 6):
        admin.update_metrics(a, {"replication_lag": float(lag)})
    # the instance may be served before its first metrics: "not yet", not a KeyError
    assert wait_until(lambda: app.get_service(SERVICE, "acme").metrics.get("replication_lag") == 5)
    agent.stop()
    assert wait_until(lambda: app.connection_state != "connected")
    b = admin.register(SERVICE, "p1", "10.0.1.2", 5432, label="b")
    wholes = frames("service")
    serve()
    expected = fresh(make_client)
    assert wait_until(lambda: served(app) == expected)
    assert frames("service") >= wholes + 1
    assert app.session.cache._agent.connections == 2
    admin.update_metrics(b, {"replication_lag": 0.5})
    admin.update_metrics(a, {"replication_lag": 6.0})
    expected = fresh(make_client)
    assert wait_until(lambda: served(app) == expected)
    assert app.cache_stats.agent_whole_states_asked == 0
    assert app.connection_state == "connected"


def test_a_process_that_does_not_say_it_applies_deltas_is_sent_whole_states(
    serve, admin, socket_path, namespace
):
    """A process of an earlier release (its hello has no ``deltas``) is sent a change as the
    service's whole state, which is all it reads; the agent sends deltas only to processes
    that say they apply them."""
    serve()
    a = admin.register(SERVICE, "p1", "10.0.1.1", 5432, label="a")
    sock = test_agent._raw(socket_path)
    assert test_agent._hello(sock, namespace)["op"] == "welcome"
    protocol.send(sock, {"op": "follow", "id": 1, "service": SERVICE})

    def next_frame() -> dict:
        while True:
            message = protocol.receive(sock, protocol.MAX_REPLY_BYTES, protocol.REPLIES)
            if message["op"] != "heartbeat":
                return message

    assert next_frame()["op"] == "service"
    admin.update_metrics(a, {"replication_lag": 4.0})
    change = next_frame()
    assert change["op"] == "service", change
    assert "replication_lag" in change["entry"]["metrics"]["p1:a"]
    sock.close()
