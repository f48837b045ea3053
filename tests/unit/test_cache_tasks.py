"""The cache's tasks: which bound method a watch event asks for, and that repeats merge."""

import pytest
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from sentinel.cache import RegistryCache, _Task


@pytest.fixture
def cache():
    """A cache that is never started: building tasks touches neither ZooKeeper nor a thread."""
    return RegistryCache(None, "me", None)


@pytest.mark.parametrize(
    ("kind", "path", "method", "args"),
    [
        (EventType.CHILD, "/services/db", "_refresh_children", ("instances", "db")),
        (EventType.CHANGED, "/services/db", "_refresh_service", ("db",)),
        (EventType.DELETED, "/services/db", "_refresh_service", ("db",)),
        (EventType.CHANGED, "/services/db/p1:a", "_refresh_child", ("instances", "db", "p1:a")),
        (EventType.CREATED, "/services/db/p1:a", "_refresh_child", ("instances", "db", "p1:a")),
        (EventType.DELETED, "/services/db/p1:a", "_refresh_child", ("instances", "db", "p1:a")),
        (EventType.CHILD, "/metrics/db", "_refresh_children", ("metrics", "db")),
        (EventType.CREATED, "/metrics/db", "_refresh_children", ("metrics", "db")),
        (EventType.CHANGED, "/metrics/db/p1:a", "_refresh_child", ("metrics", "db", "p1:a")),
        (EventType.DELETED, "/metrics/db/p1:a", "_refresh_child", ("metrics", "db", "p1:a")),
        (EventType.CHANGED, "/auth/db/me", "_refresh_auth", ("db",)),
        (EventType.DELETED, "/auth/db/me", "_refresh_auth", ("db",)),
        (EventType.CHANGED, "/shard_info/tenants", "_reload_policy", ("tenants",)),
        (EventType.CHANGED, "/shard_info/tenants/00ff", "_refresh_bucket", ("tenants", 255)),
    ],
)
def test_each_event_names_one_bound_method_by_its_path(cache, kind, path, method, args):
    task = cache._task_for(kind, path)
    assert task == _Task(getattr(cache, method), args)
    assert str(task) == f"{method}{args}"


@pytest.mark.parametrize("path", ["/services/db/p1:a", "/metrics/db/p1:a"])
def test_a_deleted_child_is_read_with_one_shot_watches_and_dropped_under_a_recursive_one(
    cache, path
):
    # One-shot, the node may already exist again under its name (a restart), and only this
    # read sets a watch on it; a recursive watch reports its creation by itself.
    assert cache._task_for(EventType.DELETED, path).run == cache._refresh_child
    assert cache._task_for(EventType.DELETED, path, persistent=True).run == cache._forget_child


@pytest.mark.parametrize(
    "path", ["/shard_info/tenants/zzzz", "/shard_info/tenants/lock", "/clients/db/me", "/other"]
)
def test_events_on_nodes_the_cache_does_not_follow_ask_for_nothing(cache, path):
    assert cache._task_for(EventType.CHANGED, path) is None


def test_repeated_events_merge_while_the_first_is_queued(cache):
    event = WatchedEvent(EventType.CHANGED, KazooState.CONNECTED, "/metrics/db/p1:a")
    other = WatchedEvent(EventType.CHANGED, KazooState.CONNECTED, "/metrics/db/p1:b")
    for watched in (event, event, other, event):
        cache._watch(watched)
    assert cache._tasks.qsize() == 2 and cache.stats.watch_events == 4
    assert hash(cache._tasks.get()) == hash(cache._task_for(EventType.CHANGED, event.path))


def test_tasks_of_two_caches_never_merge(cache):
    other = RegistryCache(None, "me", None)
    assert cache._task_for(EventType.CHANGED, "/auth/db/me") != other._task_for(
        EventType.CHANGED, "/auth/db/me"
    )


@pytest.mark.parametrize(
    ("kind", "path", "method", "args"),
    [
        (EventType.CHILD, "/services/db", "_refresh_children", ("instances", "db")),
        (EventType.CHANGED, "/services/db", "_refresh_spec", ("db",)),
        (EventType.CREATED, "/services/db", "_refresh_spec", ("db",)),
        (EventType.DELETED, "/services/db", "_drop_service", ("db",)),
        (EventType.CREATED, "/services/db/p1:a", "_refresh_child", ("instances", "db", "p1:a")),
        (EventType.DELETED, "/services/db/p1:a", "_forget_child", ("instances", "db", "p1:a")),
        (EventType.CHANGED, "/metrics/db", "_refresh_children", ("metrics", "db")),
        (EventType.DELETED, "/metrics/db", "_forget_section", ("metrics", "db")),
        (EventType.CHANGED, "/auth/db/me", "_refresh_auth", ("db",)),
        (EventType.DELETED, "/auth/db/me", "_refresh_auth", ("db", True)),
        (EventType.DELETED, "/shard_info/tenants", "_reload_policy", ("tenants", True)),
        (EventType.DELETED, "/shard_info/tenants/00ff", "_refresh_bucket", ("tenants", 255, True)),
    ],
)
def test_under_a_recursive_watch_deletions_need_no_read_and_a_service_node_is_its_spec(
    cache, kind, path, method, args
):
    assert cache._task_for(kind, path, persistent=True) == _Task(getattr(cache, method), args)


def test_a_policys_children_changing_asks_for_nothing_under_a_recursive_watch(cache):
    # every bucket is followed itself; placement requests are not the cache's
    assert cache._task_for(EventType.CHILD, "/shard_info/tenants", persistent=True) is None


def test_a_nodes_events_under_a_recursive_watch_merge_into_its_latest_kind(cache):
    path = "/services/db/p1:a"
    for kind in (EventType.CHANGED, EventType.DELETED, EventType.CREATED):
        cache._on_persistent("/services/db", WatchedEvent(kind, KazooState.CONNECTED, path))
    assert cache._tasks.qsize() == 1 and cache.stats.watch_events == 3
    assert cache._tasks.get() == _Task(cache._apply_event, (path,))
    assert cache._latest == {path: EventType.CREATED}  # applied as a creation: one read


def test_a_session_end_forgets_the_watch_and_queues_following_again(cache):
    cache._followed["/services/db"] = True
    cache._on_persistent("/services/db", WatchedEvent(EventType.NONE, "EXPIRED_SESSION", None))
    assert "/services/db" not in cache._followed
    assert cache._tasks.get() == _Task(cache._follow_all)
