"""A node deleted and created again under its name (an instance restarted with its default
``<host>_<port>`` label) is followed to its new content, in both watch modes.

The fault the convergence fuzzer found in one-shot mode: a re-read of a section's children
trusts the children it already holds to be watched, but the watch of a deleted child fired
with its deletion. When that re-read was queued before the deletion was applied (a children
event merged into one already pending), it found the name there again, kept the old content,
and the deletion applied after it dropped the instance; nothing watched the new node, so the
cache lacked it for good. A worker made busy by a slow listener makes the order exact here.
"""

from __future__ import annotations

import threading

import pytest

from sentinel.events import InstancesChanged
from sentinel.testing.helpers import cached_view, registry_view, wait_until
from tests.faults.conftest import relayed_reader
from tests.integration.nodes import instance, metrics

pytestmark = [pytest.mark.integration, pytest.mark.faults]

# Watch events the reader receives for the changes made while its worker is held: one-shot,
# the creation of b in each section (a children event) and the deletion of a (a data event; the
# children watch is spent, its re-read still queued); persistent, every creation and deletion.
EVENTS_WHILE_HELD = {False: 4, True: 6}


class HeldWorker:
    """Holds the reader's cache worker inside a listener from the first change of instance
    ``label`` until :meth:`release`: events arriving meanwhile queue up behind it, as behind a
    slow listener or a backlog after a reconnection."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.held = threading.Event()
        self._release = threading.Event()

    def __call__(self, event: object) -> None:
        if self.held.is_set() or not isinstance(event, InstancesChanged):
            return
        if any(new.label == self.label for _, new in event.updated):
            self.held.set()
            self._release.wait(30)  # bounded: a failing test must not hang the worker

    def release(self) -> None:
        self._release.set()


@pytest.mark.parametrize("persistent", [False, True], ids=["one-shot", "persistent"])
@pytest.mark.parametrize("pause", [False, True], ids=["connected", "after-a-pause"])
def test_a_node_recreated_under_its_name_is_followed(make_client, raw_zk, proxy, persistent, pause):
    nodes = [instance("a"), instance("c"), metrics("a", 1)]
    writer, reader = relayed_reader(make_client, raw_zk, proxy, persistent, nodes)
    if pause:  # a pause shorter than the session: one-shot watches are all set again
        resyncs = reader.cache_stats.resyncs
        proxy.cut()
        assert wait_until(lambda: reader.connection_state != "connected")
        proxy.restore()
        assert wait_until(lambda: reader.cache_stats.resyncs > resyncs, timeout=20)
    assert cached_view(reader, "api") == registry_view(writer, "api")

    hold = HeldWorker("c")
    reader.listen("api", hold)
    raw_zk.set(*instance("c", weight=2))
    assert hold.held.wait(10), "the reader never applied the change of c"
    try:
        seen = reader.cache_stats.watch_events
        raw_zk.create(*instance("b"))
        raw_zk.create(*metrics("b", 2))
        for path, data in (instance("a", weight=3), metrics("a", 3)):
            raw_zk.delete(path)  # a restart: the same name, a new node
            raw_zk.create(path, data)
        expected = seen + EVENTS_WHILE_HELD[persistent]
        assert wait_until(lambda: reader.cache_stats.watch_events >= expected), (
            reader.cache_stats.watch_events,
            expected,
        )
    finally:
        hold.release()
    assert wait_until(lambda: cached_view(reader, "api") == registry_view(writer, "api")), (
        cached_view(reader, "api"),
        registry_view(writer, "api"),
    )

    # The new nodes are watched: a later change of each reaches the cache.
    raw_zk.set(*instance("a", weight=4))
    raw_zk.set(*metrics("a", 4))
    assert wait_until(lambda: cached_view(reader, "api") == registry_view(writer, "api")), (
        cached_view(reader, "api"),
        registry_view(writer, "api"),
    )
    assert reader.cached_instances("api")[0].weight == 4
