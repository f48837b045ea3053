"""Calls made from a change listener, which runs on the cache's worker thread.

Every public call of :class:`Sentinel` made there either works or raises a clear
:class:`~sentinel.errors.SentinelError` at once: none waits for the worker that is running it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from sentinel import Sentinel
from sentinel.auth import ClientKeyring
from sentinel.auth.backends import FileBackend
from sentinel.auth.config import AuthConfig
from sentinel.auth.writer import CredentialWriter
from sentinel.errors import CalledFromListener, ClientClosed, SentinelError, ServiceNotFound
from sentinel.events import InstancesChanged
from sentinel.publisher import Registration
from sentinel.registry.failover import Failover
from sentinel.shards.writer import ShardMapWriter
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper, four_letter_word

pytestmark = pytest.mark.integration

# What "at once" means for a call made from a listener (a stall waited for the 10 s load
# timeout before the fix).
AT_ONCE = 1.0


class FromListener:
    """Runs ``call(client)`` in ``client``'s listener on the next change of service
    ``trigger``, and keeps what it returned or raised and how long it took."""

    def __init__(self, client: Sentinel, call: Callable[[Sentinel], Any]) -> None:
        self.client = client
        self.call = call
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.thread: threading.Thread | None = None

    def __call__(self, event: object) -> None:
        if self.done.is_set() or not isinstance(event, InstancesChanged):
            return
        self.thread = threading.current_thread()
        started = time.monotonic()
        try:
            self.result = self.call(self.client)
        except BaseException as exc:  # kept for the test to judge
            self.error = exc
        self.seconds = time.monotonic() - started
        self.done.set()


def call_from_listener(
    publisher: Sentinel, client: Sentinel, call: Callable[[Sentinel], Any]
) -> FromListener:
    """Make a change ``client`` hears, run ``call`` in its listener, and wait for it."""
    publisher.register("trigger", "p1", "10.9.0.1", 80, label="a")
    client.get_service("trigger")
    probe = FromListener(client, call)
    client.listen("trigger", probe)
    publisher.register("trigger", "p1", "10.9.0.2", 80, label="b")
    assert probe.done.wait(30), "the listener did not finish within 30 s"
    assert probe.thread is not threading.current_thread()
    return probe


def sessions_on_server(zookeeper: LocalZooKeeper) -> str:
    """Every connection the servers hold, with its session id (``cons``)."""
    return "".join(
        four_letter_word("127.0.0.1", member.client_port, "cons", timeout=5)
        for member in zookeeper.members
    )


def test_close_from_a_listener_ends_the_session_and_its_registrations(
    zookeeper, make_client, raw_zk
):
    publisher = make_client("publisher")
    client = make_client("closer")
    client.register("own", "p1", "10.9.1.1", 5432, label="mine")
    session = f"sid=0x{client.session_id:x},"
    assert session in sessions_on_server(zookeeper)

    probe = call_from_listener(publisher, client, lambda c: c.close())

    assert probe.error is None, repr(probe.error)
    assert probe.seconds < AT_ONCE
    assert client.connection_state == "closed"
    assert wait_until(lambda: session not in sessions_on_server(zookeeper), 5) is not None, (
        "the session is still open on the server"
    )
    assert raw_zk.get_children("/services/own") == []
    client.close()  # a second close is harmless
    assert client.connection_state == "closed"


def test_a_lookup_queued_behind_a_listener_that_closes_fails_at_once(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.register("other", "p1", "10.9.2.1", 5432, label="x")
    waiting: dict[str, Any] = {}

    def lookup_then_close(c: Sentinel) -> None:
        # Another thread's first lookup of a service queues its load behind this listener.
        def lookup() -> None:
            started = time.monotonic()
            try:
                c.get_service("other")
            except BaseException as exc:  # kept for the test to judge
                waiting["error"] = exc
            waiting["seconds"] = time.monotonic() - started

        waiting["thread"] = threading.Thread(target=lookup)
        waiting["thread"].start()
        assert wait_until(lambda: not c.session.cache.worker._tasks.empty(), 5) is not None
        c.close()

    probe = call_from_listener(publisher, client, lookup_then_close)

    assert probe.error is None, repr(probe.error)
    waiting["thread"].join(30)
    assert waiting["seconds"] < AT_ONCE, f"the lookup waited {waiting['seconds']:.1f}s"
    assert isinstance(waiting["error"], ClientClosed), repr(waiting.get("error"))


def test_a_first_lookup_from_a_listener_loads_the_service_at_once(make_client):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.register("other", "p1", "10.9.2.1", 5432, label="x")

    probe = call_from_listener(publisher, client, lambda c: c.get_service("other"))

    assert probe.error is None, repr(probe.error)
    assert probe.seconds < AT_ONCE
    assert probe.result.host == "10.9.2.1"
    # Loaded as any lookup loads it: cached and followed from now on.
    publisher.register("other", "p1", "10.9.2.2", 5432, label="y")
    assert wait_until(lambda: len(client.cached_instances("other")) == 2) is not None


@dataclass(frozen=True)
class Case:
    """A public name of Sentinel used from a listener: ``call(client, scene)``, what it must
    raise at once (None: it works), and what it needs first (``prepare(client, scene)``)."""

    call: Callable[[Sentinel, Scene], Any]
    raises: type[SentinelError] | None = None
    prepare: Callable[[Sentinel, Scene], None] | None = None


@dataclass
class Scene:
    """What the calls work on: a publisher, this client's own registration, a credential
    backend; ``other`` and ``sharded`` are services the client has not looked up yet."""

    publisher: Sentinel
    own: Registration
    backend: FileBackend


def follow_credential(client: Sentinel, scene: Scene) -> None:
    """The client holds version 1 of a credential for ``vault``, so a rotation of it waits
    for this client's confirmation."""
    scene.publisher.register("vault", "p1", "10.9.4.1", 5432, label="v")
    scene.publisher.credentials.publish(
        "vault", "caller", scene.backend.create("vault", "caller", 1)
    )
    assert wait_until(lambda: getattr(client.get_service("vault").auth, "version", 0) == 1)


CASES: dict[str, Case] = {
    # life cycle
    "start": Case(lambda c, s: c.start()),
    "close": Case(lambda c, s: c.close()),
    "close and start again": Case(lambda c, s: (c.close(), c.start())),
    # resolution: every first lookup loads its service on the spot
    "get_service": Case(lambda c, s: c.get_service("sharded", "acme")),
    "get_service of no service": Case(lambda c, s: c.get_service("absent"), ServiceNotFound),
    "eligible_instances": Case(lambda c, s: c.eligible_instances("other")),
    "prefetch": Case(lambda c, s: c.prefetch("other")),
    "partition_of": Case(lambda c, s: c.partition_of("sharded", "acme")),
    "explain": Case(lambda c, s: c.explain("sharded", "acme")),
    "explain_partition": Case(lambda c, s: c.explain_partition("sharded", "p1")),
    "cached_instances": Case(lambda c, s: c.cached_instances("other")),
    "read_service": Case(lambda c, s: c.read_service("other")),
    "report": Case(lambda c, s: c.report(c.get_service("other"), ok=False, latency=0.1)),
    "listen": Case(lambda c, s: c.listen("other", lambda event: None)),
    # publishing
    "ensure_namespace": Case(lambda c, s: c.ensure_namespace()),
    "ensure_service": Case(lambda c, s: c.ensure_service("fresh")),
    "set_failover": Case(lambda c, s: c.set_failover("other", Failover(regions=("west",)))),
    "register": Case(lambda c, s: c.register("own", "p1", "10.9.1.2", 5432, label="second")),
    "update_registration": Case(lambda c, s: c.update_registration(s.own, weight=2)),
    "deregister": Case(lambda c, s: c.deregister(s.own)),
    "deregister, waiting": Case(lambda c, s: c.deregister(s.own, wait=0.01)),
    "update_metrics": Case(lambda c, s: c.update_metrics(s.own, {"replication_lag": 1.5})),
    # shard maps
    "shard_maps.create": Case(lambda c, s: c.shard_maps.create("fresh", "hash", ["p1"])),
    "shard_maps.ensure": Case(lambda c, s: c.shard_maps.ensure("tenants", buckets=4)),
    "shard_maps.assign": Case(lambda c, s: c.shard_maps.assign("tenants", "beta", "p1")),
    "shard_maps.assign_many": Case(lambda c, s: c.shard_maps.assign_many("tenants", {"g": "p1"})),
    "shard_maps.unassign": Case(lambda c, s: c.shard_maps.unassign("tenants", "acme")),
    "shard_maps.request_placement": Case(
        lambda c, s: c.shard_maps.request_placement("tenants", "delta")
    ),
    # credentials
    "credentials.publish": Case(
        lambda c, s: c.credentials.publish("other", "caller", {"user": "u", "password": "p"})
    ),
    # A rotation waits for every client's confirmation, this one's made on this thread.
    "credentials.rotate": Case(
        lambda c, s: c.credentials.rotate("vault", "caller", s.backend, timeout=5),
        CalledFromListener,
        follow_credential,
    ),
    # properties
    **{
        name: Case(lambda c, s, name=name: getattr(c, name))
        for name in (
            "cache_stats",
            "connection_state",
            "ejections",
            "lookup_counts",
            "persistent_watches",
            "registrations",
            "session_id",
            "snapshot_ages",
            "staleness",
        )
    },
}


def test_the_survey_covers_every_public_name_of_sentinel():
    public = {name for name in dir(Sentinel) if not name.startswith("_")}
    roles = {"shard_maps": ShardMapWriter, "credentials": CredentialWriter}
    public |= {f"{role}.{m}" for role, cls in roles.items() for m in dir(cls) if m[0] != "_"}
    assert public <= CASES.keys(), f"not surveyed from a listener: {public - CASES.keys()}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_public_call_from_a_listener_works_or_refuses_at_once(name, make_client, tmp_path):
    case = CASES[name]
    publisher = make_client("publisher")
    client = make_client("caller", auth=AuthConfig(keys=ClientKeyring.generate()))
    publisher.shard_maps.create("tenants", "directory", buckets=4)
    publisher.ensure_service("sharded", shard_policy="tenants")
    publisher.register("sharded", "p1", "10.9.3.1", 5432, label="s")
    publisher.shard_maps.assign("tenants", "acme", "p1")
    publisher.register("other", "p1", "10.9.2.1", 5432, label="x")
    scene = Scene(
        publisher,
        client.register("own", "p1", "10.9.1.1", 5432, label="mine"),
        FileBackend(tmp_path / "credentials.json"),
    )
    if case.prepare is not None:
        case.prepare(client, scene)

    probe = call_from_listener(publisher, client, lambda c: case.call(c, scene))

    assert probe.seconds < AT_ONCE, f"{name} took {probe.seconds:.1f}s from a listener"
    if case.raises is None:
        assert probe.error is None, repr(probe.error)
    else:
        assert isinstance(probe.error, case.raises), repr(probe.error)
    # The client keeps working (or, closed, refuses clearly), and its worker too.
    if client.connection_state == "closed":
        with pytest.raises(ClientClosed):
            client.get_service("other")
    else:
        publisher.register("other", "p1", "10.9.2.9", 5432, label="late")
        assert wait_until(
            lambda: "10.9.2.9" in {e.host for e in client.eligible_instances("other")}
        )
