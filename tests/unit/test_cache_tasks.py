"""The followers' tasks: which bound method a watch event asks for, and that repeats merge."""

import queue
import threading
import time

import pytest
from kazoo.protocol.states import EventType, KazooState, WatchedEvent, ZnodeStat

from sentinel.cache import RegistryCache, reads
from sentinel.cache.followers import DEREGISTERED, OneShotFollower, PersistentFollower, node_at
from sentinel.cache.protection import MassLossProtection, Protection
from sentinel.cache.views import ServiceSnapshot
from sentinel.cache.worker import Task
from sentinel.registry.records import InstanceRecord, ServiceSpec
from sentinel.testing.helpers import wait_until
from tests.unit.endpoints import endpoint


@pytest.fixture
def cache():
    """A cache that is never started: building tasks touches neither ZooKeeper nor a thread."""
    return RegistryCache(None, "me", None)


@pytest.fixture
def one_shot(cache):
    return OneShotFollower(cache, None, None)


class Watches:
    """The follower's persistent watches as the connection thread sees them (``reads_now``) or
    any other thread (None from read_now): the reads sent and their completions."""

    def __init__(self, reads_now: bool) -> None:
        self.reads_now = reads_now
        self.sent: list[tuple[str, object]] = []

    def read_now(self, path, then):
        if not self.reads_now:
            return None
        self.sent.append((path, then))
        return f"read of {path}"

    def after_message(self, run):
        return False  # the worker is woken at once


@pytest.fixture
def persistent(cache):
    return PersistentFollower(cache, None, None, Watches(reads_now=False))


@pytest.fixture
def reads_now(cache):
    """A follower whose events arrive on the connection thread, which can send reads; the
    cache holds service ``db`` with instance ``p1:a``."""
    cache.snapshots["db"] = ServiceSnapshot.first(
        ServiceSpec("db"), {"p1:a": endpoint("a", "p1")}, {}, frozenset(), None
    )
    return PersistentFollower(cache, None, None, Watches(reads_now=True))


@pytest.mark.parametrize(
    ("kind", "path", "method", "args"),
    [
        (EventType.CHILD, "/services/db", "_refresh_children", ("db", "instances")),
        (EventType.CHANGED, "/services/db", "_refresh_service", ("db",)),
        (EventType.DELETED, "/services/db", "_refresh_service", ("db",)),
        (EventType.CHANGED, "/services/db/p1:a", "_refresh_child", ("db", "instances", "p1:a")),
        (EventType.CREATED, "/services/db/p1:a", "_refresh_child", ("db", "instances", "p1:a")),
        (EventType.DELETED, "/services/db/p1:a", "_refresh_child", ("db", "instances", "p1:a")),
        (EventType.CHILD, "/metrics/db", "_refresh_children", ("db", "metrics")),
        (EventType.CREATED, "/metrics/db", "_refresh_children", ("db", "metrics")),
        (EventType.CHANGED, "/metrics/db/p1:a", "_refresh_child", ("db", "metrics", "p1:a")),
        (EventType.DELETED, "/metrics/db/p1:a", "_refresh_child", ("db", "metrics", "p1:a")),
        (EventType.CHANGED, "/auth/db/me", "_refresh_auth", ("db",)),
        (EventType.DELETED, "/auth/db/me", "_refresh_auth", ("db",)),
        (EventType.CHANGED, "/shard_info/tenants", "_reload_policy", ("tenants",)),
        (EventType.CHANGED, "/shard_info/tenants/00ff", "_refresh_bucket", ("tenants", 255)),
    ],
)
def test_each_one_shot_event_names_one_bound_method_by_its_path(one_shot, kind, path, method, args):
    task = one_shot._task_for(kind, path)
    assert task == Task(getattr(one_shot, method), args)
    assert str(task) == f"{method}{args}"


@pytest.mark.parametrize("path", ["/services/db/p1:a", "/metrics/db/p1:a"])
def test_a_deleted_child_is_read_with_one_shot_watches_and_dropped_under_a_recursive_one(
    one_shot, persistent, path
):
    # One-shot, the node may already exist again under its name (a restart), and only this
    # read sets a watch on it; a recursive watch reports its creation by itself.
    assert one_shot._task_for(EventType.DELETED, path).run == one_shot._refresh_child
    assert persistent._task_for(EventType.DELETED, path).run == persistent._forget_child


@pytest.mark.parametrize(
    "path",
    [
        "/shard_info/tenants/zzzz",
        "/shard_info/tenants/lock",
        "/clients/db/me",
        "/other",
        "/",
        "/services/db/p1:a/below",
    ],
)
def test_events_on_nodes_the_cache_does_not_follow_ask_for_nothing(one_shot, persistent, path):
    assert node_at(path) is None
    assert one_shot._task_for(EventType.CHANGED, path) is None
    assert persistent._task_for(EventType.CHANGED, path) is None


def test_repeated_events_merge_while_the_first_is_queued(cache, one_shot):
    event = WatchedEvent(EventType.CHANGED, KazooState.CONNECTED, "/metrics/db/p1:a")
    other = WatchedEvent(EventType.CHANGED, KazooState.CONNECTED, "/metrics/db/p1:b")
    for watched in (event, event, other, event):
        one_shot._on_event(watched)
    assert cache.worker._tasks.qsize() == 2 and cache.stats.watch_events == 4
    assert cache.worker._tasks.get() == one_shot._task_for(EventType.CHANGED, event.path)


def test_a_connection_event_asks_a_one_shot_follower_for_nothing(cache, one_shot):
    # the re-sync after reconnecting covers it
    one_shot._on_event(WatchedEvent(EventType.NONE, KazooState.SUSPENDED, None))
    assert cache.worker._tasks.empty() and cache.stats.watch_events == 0


def test_tasks_of_two_followers_never_merge(cache, one_shot):
    other = OneShotFollower(cache, None, None)
    assert one_shot._task_for(EventType.CHANGED, "/auth/db/me") != other._task_for(
        EventType.CHANGED, "/auth/db/me"
    )


@pytest.mark.parametrize(
    ("kind", "path", "method", "args"),
    [
        (EventType.CHILD, "/services/db", "_refresh_children", ("db", "instances")),
        (EventType.CHANGED, "/services/db", "_refresh_spec", ("db",)),
        (EventType.CREATED, "/services/db", "_refresh_spec", ("db",)),
        (EventType.DELETED, "/services/db", "_drop_service", ("db",)),
        (EventType.CREATED, "/services/db/p1:a", "_refresh_child", ("db", "instances", "p1:a")),
        (
            EventType.DELETED,
            "/services/db/p1:a",
            "_forget_child",
            ("db", "instances", "p1:a", False),
        ),
        (DEREGISTERED, "/services/db/p1:a", "_forget_child", ("db", "instances", "p1:a", True)),
        (EventType.CHANGED, "/metrics/db", "_refresh_children", ("db", "metrics")),
        (EventType.DELETED, "/metrics/db", "_forget_section", ("db", "metrics")),
        (EventType.CHANGED, "/auth/db/me", "_refresh_auth", ("db",)),
        (EventType.DELETED, "/auth/db/me", "_refresh_auth", ("db", True)),
        (EventType.CHANGED, "/shard_info/tenants", "_reload_policy", ("tenants",)),
        (EventType.DELETED, "/shard_info/tenants", "_reload_policy", ("tenants", True)),
        (EventType.CHANGED, "/shard_info/tenants/00ff", "_refresh_bucket", ("tenants", 255)),
        (EventType.DELETED, "/shard_info/tenants/00ff", "_refresh_bucket", ("tenants", 255, True)),
    ],
)
def test_under_a_recursive_watch_deletions_need_no_read_and_a_service_node_is_its_spec(
    persistent, kind, path, method, args
):
    assert persistent._task_for(kind, path) == Task(getattr(persistent, method), args)


def test_a_policys_children_changing_asks_for_nothing_under_a_recursive_watch(persistent):
    # every bucket is followed itself; placement requests are not the cache's
    assert persistent._task_for(EventType.CHILD, "/shard_info/tenants") is None


def test_a_nodes_events_under_a_recursive_watch_merge_into_its_latest_kind(cache, persistent):
    path = "/services/db/p1:a"
    for kind in (EventType.CHANGED, EventType.DELETED, EventType.CREATED):
        persistent._on_event("/services/db", WatchedEvent(kind, KazooState.CONNECTED, path))
    assert cache.worker._tasks.qsize() == 1 and cache.stats.watch_events == 3
    assert cache.worker._tasks.get() == Task(persistent._apply_event, (path,))
    assert persistent._latest == {path: (EventType.CREATED, None)}  # a creation: one read


def event(kind, path):
    return WatchedEvent(kind, KazooState.CONNECTED, path)


@pytest.mark.parametrize("kind", [EventType.CREATED, EventType.CHANGED])
@pytest.mark.parametrize("path", ["/services/db/p1:a", "/metrics/db/p1:a"])
def test_a_childs_event_sends_its_read_and_queues_its_task_with_the_reply(
    cache, reads_now, kind, path
):
    reads_now._on_event("/services/db", event(kind, path))
    [(sent, then)] = reads_now._watches.sent
    assert sent == path and cache.worker._tasks.qsize() == 0  # the worker sleeps meanwhile
    assert reads_now._latest == {path: (kind, f"read of {path}")}
    then()  # the reply is in
    assert cache.worker._tasks.get() == Task(reads_now._apply_event, (path,))


def test_events_while_a_nodes_read_is_out_are_read_once_by_the_worker(cache, reads_now):
    path = "/services/db/p1:a"
    reads_now._on_event("/services/db", event(EventType.CREATED, path))
    reads_now._on_event("/services/db", event(EventType.CHANGED, path))
    reads_now._on_event("/services/db", event(EventType.CHANGED, path))
    [(_, then)] = reads_now._watches.sent  # the first read only: the reply may predate the rest
    assert reads_now._latest == {path: (EventType.CHANGED, None)}  # the worker reads again
    then()
    assert cache.worker._tasks.qsize() == 1  # the reply's task merged into the queued one


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        (EventType.DELETED, "/services/db/p1:a"),  # applied with no read
        (EventType.CHANGED, "/services/db"),  # a spec
        (EventType.CHANGED, "/auth/db/me"),
        (EventType.CHANGED, "/shard_info/tenants/00ff"),
        (EventType.CREATED, "/services/other/p1:a"),  # a service the cache does not hold
    ],
)
def test_only_a_childs_creation_or_change_sends_a_read_from_the_event(cache, reads_now, kind, path):
    reads_now._on_event("/services/db", event(kind, path))
    assert reads_now._watches.sent == []
    assert cache.worker._tasks.get() == Task(reads_now._apply_event, (path,))


def test_a_session_end_forgets_the_watch_and_queues_following_again(cache, persistent):
    persistent._followed["/services/db"] = True
    persistent._on_event("/services/db", WatchedEvent(EventType.NONE, "EXPIRED_SESSION", None))
    assert "/services/db" not in persistent._followed
    assert cache.worker._tasks.get() == Task(persistent._follow_all)


def test_a_task_on_a_service_the_cache_no_longer_holds_reads_nothing(cache, one_shot):
    # The follower was handed no ZooKeeper client: any read would raise AttributeError.
    for task in (
        one_shot._task_for(EventType.CHANGED, "/services/db"),
        one_shot._task_for(EventType.CHILD, "/services/db"),
        one_shot._task_for(EventType.CHANGED, "/metrics/db/p1:a"),
        one_shot._task_for(EventType.CHANGED, "/auth/db/me"),
    ):
        task.run(*task.args)
    assert cache.snapshots == {}


def test_a_newcomer_to_a_section_at_its_bound_is_left_to_the_worker_unread(
    cache, reads_now, monkeypatch
):
    # A flood past the bound must cost no reads: the worker counts the node and skips it.
    monkeypatch.setattr(reads, "MAX_SECTION_NODES", 1)  # p1:a fills the instances
    reads_now._on_event("/services/db", event(EventType.CREATED, "/services/db/p1:b"))
    reads_now._on_event("/services/db", event(EventType.CHANGED, "/services/db/p1:a"))
    assert [path for path, _ in reads_now._watches.sent] == ["/services/db/p1:a"]
    assert reads_now._latest["/services/db/p1:b"] == (EventType.CREATED, None)


def test_a_deletion_waits_for_the_read_of_a_creation_before_it(cache, reads_now):
    # A replacement: the new instance's creation, then the old one's deletion. Applied as they
    # arrive, the deletion (no read) would overtake the creation (its read on its way) and the
    # cache would hold neither for a round trip.
    new, old = "/services/db/p1:b", "/services/db/p1:a"
    reads_now._on_event("/services/db", event(EventType.CREATED, new))
    reads_now._on_event("/services/db", event(EventType.DELETED, old))
    reads_now._on_event("/services/db", WatchedEvent(EventType.NONE, "EXPIRED_SESSION", None))
    assert cache.worker._tasks.qsize() == 0  # all behind the read
    [(_, then)] = reads_now._watches.sent
    then()  # the reply (or the connection's loss) is in
    queued = [cache.worker._tasks.get() for _ in range(3)]
    assert queued == [
        Task(reads_now._apply_event, (new,)),
        Task(reads_now._apply_event, (old,)),
        Task(reads_now._follow_all),
    ]
    gone = "/metrics/db/p1:a"
    reads_now._on_event("/services/db", event(EventType.DELETED, gone))  # nothing waits now
    assert cache.worker._tasks.get_nowait() == Task(reads_now._apply_event, (gone,))


class Gated(queue.SimpleQueue):
    """The worker's queue, whose tasks reach the worker once ``gate`` is set: what the
    caller's thread did before the worker ran anything can be seen."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def get(self, *args, **kwargs):
        task = super().get(*args, **kwargs)
        assert self.gate.wait(5)
        return task


@pytest.fixture
def gated(cache):
    """The cache's worker started behind a gate (set it to let the worker run), and what its
    listeners of ``db`` heard, with the thread that told them."""
    gate = threading.Event()
    cache.worker._tasks = Gated(gate)
    heard: list[tuple[object, threading.Thread]] = []
    cache.listen("db", lambda change: heard.append((change, threading.current_thread())))
    cache.worker.start()
    yield gate, heard
    gate.set()
    assert cache.worker.stop(lambda task: None, timeout=5)


class Reply:
    """A read's reply in hand, as kazoo's async result holds it."""

    def __init__(self, value) -> None:
        self.value = value

    def successful(self) -> bool:
        return True

    def get(self):
        return self.value


def test_a_removal_is_served_on_the_events_thread_and_told_on_the_worker(cache, reads_now, gated):
    gate, heard = gated
    reads_now._on_event("/services/db", event(EventType.DELETED, "/services/db/p1:a"))
    # served before the worker ran anything (it was queued for the worker before)
    assert "p1:a" not in cache.snapshots["db"].endpoints
    assert heard == []  # a listener may call back into the client: never on kazoo's thread
    gate.set()
    assert wait_until(lambda: heard) is not None
    [(change, thread)] = heard
    assert [e.label for e in change.removed] == ["a"] and thread.name == "sentinel-cache"


def test_a_read_in_hand_is_served_on_the_replys_thread_and_told_on_the_worker(
    cache, reads_now, gated
):
    gate, heard = gated
    path = "/services/db/p1:b"
    reads_now._on_event("/services/db", event(EventType.CREATED, path))
    [(_, then)] = reads_now._watches.sent
    record = InstanceRecord("db", "p1", "b", "10.0.0.2", 80).to_bytes(path)
    now = int(time.time() * 1000)
    reads_now._latest[path] = (EventType.CREATED, Reply((record, ZnodeStat(*[now] * 11))))
    then()  # the reply is in, on kazoo's connection thread
    assert "p1:b" in cache.snapshots["db"].endpoints and heard == []
    gate.set()
    assert wait_until(lambda: heard) is not None
    [(change, thread)] = heard
    assert [e.label for e in change.added] == ["b"] and thread.name == "sentinel-cache"


def test_a_removal_behind_queued_work_or_counted_as_a_loss_is_the_workers(cache, reads_now, gated):
    gate, _ = gated
    cache.worker.put(Task(lambda: None))  # queued: a removal applied now would overtake it
    reads_now._on_event("/services/db", event(EventType.DELETED, "/services/db/p1:a"))
    assert "p1:a" in cache.snapshots["db"].endpoints
    gate.set()
    assert wait_until(lambda: "p1:a" not in cache.snapshots["db"].endpoints) is not None
    # an unmarked loss of a service that marks departures: protection counts it (timers)
    cache.protection = Protection(MassLossProtection(), cache.stats, lambda *_: None)
    marking = ServiceSpec("db", mark_departures=True)
    cache.snapshots["db"] = ServiceSnapshot.first(
        marking, {"p1:c": endpoint("c", "p1")}, {}, frozenset(), None
    )
    assert wait_until(lambda: cache.worker.idle) is not None
    assert not cache.serves_at_once("db", lost=True) and cache.serves_at_once("db", lost=False)
