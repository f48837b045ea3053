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
        (EventType.DELETED, "/services/db/p1:a", "_forget_child", ("instances", "db", "p1:a")),
        (EventType.CHILD, "/metrics/db", "_refresh_children", ("metrics", "db")),
        (EventType.CREATED, "/metrics/db", "_refresh_children", ("metrics", "db")),
        (EventType.CHANGED, "/metrics/db/p1:a", "_refresh_child", ("metrics", "db", "p1:a")),
        (EventType.DELETED, "/metrics/db/p1:a", "_forget_child", ("metrics", "db", "p1:a")),
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
