"""sentinel.zk.watches on a real ZooKeeper: persistent and recursive watches, watches kept
across a cut connection (SetWatches2), removeWatches, multi-read, fallback and expiry.

The server's own accounts are the evidence: ``wchc`` lists the watches it holds per session,
``mntr``'s ``read_per_namespace`` counts the reads it served under the test's namespace.
"""

from __future__ import annotations

import threading
import uuid
import warnings
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionDropped,
    ConnectionLoss,
    NoNodeError,
    NoWatcherError,
    UnimplementedError,
)
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.serialization import GetData, Ping, SetData, Watch
from kazoo.protocol.states import EventType, KeeperState, WatchedEvent

from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper, four_letter_word
from sentinel.zk.watches import (
    AddWatchMode,
    PersistentWatches,
    WatcherType,
    install,
)
from sentinel.zk.wire import SET_WATCHES_MAX_LENGTH

pytestmark = pytest.mark.integration


class Events:
    """A watcher that records what it is given, for bounded waits on it."""

    def __init__(self) -> None:
        self.seen: list[WatchedEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: WatchedEvent) -> None:
        with self._lock:
            self.seen.append(event)

    def of(self, kind: str) -> set[str]:
        with self._lock:
            return {event.path for event in self.seen if event.type == kind}

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(event.type == kind for event in self.seen)

    def wait_for(self, kind: str, paths: set[str], timeout: float = 10.0) -> bool:
        return wait_until(lambda: paths <= self.of(kind), timeout) is not None


class Watched:
    """A kazoo client through a cuttable proxy with the extension installed, and its states."""

    def __init__(self, zookeeper: LocalZooKeeper, namespace: str, **install_args: bool) -> None:
        self.proxy = TcpProxy("127.0.0.1", zookeeper.members[0].client_port)
        self.client = KazooClient(hosts=f"{self.proxy.address}{namespace}", timeout=10)
        self.watches: PersistentWatches = install(self.client, **install_args)
        self.states: list[KazooState] = []
        self.client.add_listener(self.states.append)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No chroot path exists")
            self.client.start(timeout=10)

    def cut_and_restore(self, while_away: Callable[[], None]) -> None:
        """Cut the link, run ``while_away`` once kazoo knows, restore it; same session."""
        session = self.client.client_id[0]
        self.proxy.cut()
        assert wait_until(lambda: KazooState.SUSPENDED in self.states, 10) is not None
        while_away()
        self.proxy.restore()
        assert wait_until(lambda: self.client.connected, 15) is not None
        assert self.client.client_id[0] == session

    def close(self) -> None:
        self.client.stop()
        self.client.close()
        self.proxy.close()


@pytest.fixture
def watched(zookeeper: LocalZooKeeper, namespace: str) -> Iterator[Callable[..., Watched]]:
    made: list[Watched] = []

    def make(**install_args: bool) -> Watched:
        made.append(Watched(zookeeper, namespace, **install_args))
        return made[-1]

    yield make
    for one in made:
        one.close()


def watches_held(zookeeper: LocalZooKeeper, client: KazooClient) -> list[str]:
    """The paths the server holds watches on for ``client``'s session (4lw ``wchc``)."""
    host, port = zookeeper.connect_string.split(":")
    session = f"0x{client.client_id[0]:x}"
    held: list[str] = []
    current = None
    for line in four_letter_word(host, int(port), "wchc", timeout=5).splitlines():
        if line.startswith("0x"):
            current = line.strip()
        elif line.strip() and current == session:
            held.append(line.strip())
    return held


def reads_served(zookeeper: LocalZooKeeper, namespace: str) -> int:
    """Reads the server has served under ``namespace`` (mntr)."""
    host, port = zookeeper.connect_string.split(":")
    word = f"zk_cnt_{namespace.strip('/')}_read_per_namespace"
    for line in four_letter_word(host, int(port), "mntr", timeout=5).splitlines():
        name, _, value = line.partition("\t")
        if name == word:
            return int(value)
    return 0


def _wait_all(results: list) -> None:
    for result in results:
        result.get(timeout=30)


def test_one_recursive_watch_follows_1000_children_every_time(watched, raw_zk, zookeeper):
    ours = watched()
    raw_zk.ensure_path("/svc")
    _wait_all([raw_zk.create_async(f"/svc/i{i}", b"0") for i in range(1000)])
    events = Events()
    ours.watches.add_watch("/svc", events, AddWatchMode.PERSISTENT_RECURSIVE)
    assert ours.watches.supported
    paths = {f"/svc/i{i}" for i in range(1000)}

    for round_ in (1, 2):  # the watch is not one-shot: every change of every round arrives
        _wait_all([raw_zk.set_async(path, str(round_).encode()) for path in sorted(paths)])
        expected = 1000 * round_
        assert wait_until(lambda n=expected: events.count(EventType.CHANGED) >= n) is not None
        assert events.of(EventType.CHANGED) == paths
    assert events.count(EventType.CHANGED) == 2000
    _wait_all([raw_zk.delete_async(f"/svc/i{i}") for i in range(10)])
    _wait_all([raw_zk.create_async(f"/svc/new{i}/deep", makepath=True) for i in range(5)])
    assert events.wait_for(EventType.DELETED, {f"/svc/i{i}" for i in range(10)})
    new = {f"/svc/new{i}" for i in range(5)} | {f"/svc/new{i}/deep" for i in range(5)}
    assert events.wait_for(EventType.CREATED, new)
    assert EventType.CHILD not in {event.type for event in events.seen}
    # the server holds one watch for all of it (a one-shot cache holds one per node)
    assert watches_held(zookeeper, ours.client) == [f"{raw_zk.chroot}/svc"]


def test_a_persistent_watch_reports_the_node_and_its_children(watched, raw_zk):
    ours = watched()
    events = Events()
    ours.watches.add_watch("/node", events, AddWatchMode.PERSISTENT)
    raw_zk.create("/node", b"a")
    raw_zk.set("/node", b"b")
    raw_zk.create("/node/child")
    raw_zk.create("/node/child/grandchild")
    raw_zk.set("/node/child", b"not ours")
    raw_zk.delete("/node", recursive=True)
    assert events.wait_for(EventType.DELETED, {"/node"})
    assert [(e.type, e.path) for e in events.seen] == [
        (EventType.CREATED, "/node"),
        (EventType.CHANGED, "/node"),
        (EventType.CHILD, "/node"),  # child created
        (EventType.CHILD, "/node"),  # child deleted by the recursive delete
        (EventType.DELETED, "/node"),
    ]


def test_watches_survive_a_cut_connection_and_nothing_is_read_again(
    watched, raw_zk, zookeeper, namespace
):
    ours = watched()
    for path in ("/svc/a", "/svc/b", "/svc/quiet"):
        raw_zk.create(path, b"0", makepath=True)
    recursive, data, exist, children, quiet = Events(), Events(), Events(), Events(), Events()
    ours.watches.add_watch("/svc", recursive, AddWatchMode.PERSISTENT_RECURSIVE)
    ours.client.get("/svc/a", watch=data)
    ours.client.exists("/svc/absent", watch=exist)
    ours.client.get_children("/svc", watch=children)
    ours.client.get("/svc/quiet", watch=quiet)
    reads_before = reads_served(zookeeper, namespace)

    def while_away() -> None:
        raw_zk.set("/svc/a", b"changed while away")
        raw_zk.create("/svc/absent")
        raw_zk.set("/svc/b", b"changed while away, under the recursive watch only")

    ours.cut_and_restore(while_away)
    # the one-shot watches, re-registered with the last zxid, report what changed...
    assert data.wait_for(EventType.CHANGED, {"/svc/a"})
    assert exist.wait_for(EventType.CREATED, {"/svc/absent"})
    assert children.wait_for(EventType.CHILD, {"/svc"})
    # ...and none fired for the reconnection itself (stock kazoo sends each a NONE event)
    assert EventType.NONE not in {e.type for e in data.seen + exist.seen + children.seen}
    # the unchanged one is still held, and the recursive one, without being added again
    held = watches_held(zookeeper, ours.client)
    assert {f"{raw_zk.chroot}/svc", f"{raw_zk.chroot}/svc/quiet"} <= set(held)
    assert f"{raw_zk.chroot}/svc/a" not in held  # it fired: one-shot
    raw_zk.set("/svc/quiet", b"after")
    raw_zk.create("/svc/later")
    assert quiet.wait_for(EventType.CHANGED, {"/svc/quiet"})
    assert recursive.wait_for(EventType.CREATED, {"/svc/later"})
    # ZooKeeper re-registers persistent watches without comparing zxids (DataTree.setWatches):
    # a change below one made while away is not reported unless a one-shot watch covered it
    assert "/svc/b" not in recursive.of(EventType.CHANGED)
    assert {"/svc/a", "/svc/absent"} <= recursive.of(EventType.CHANGED) | recursive.of(
        EventType.CREATED
    )
    assert reads_served(zookeeper, namespace) == reads_before  # nothing was read again


def test_thousands_of_watches_are_restored_in_packets_under_the_limit(watched, raw_zk, zookeeper):
    ours = watched()
    names = [f"/n{i:04d}-" + "x" * 120 for i in range(1500)]  # ~190 KB of paths: 2 packets
    assert sum(len(n) + 4 for n in names) > SET_WATCHES_MAX_LENGTH
    _wait_all([raw_zk.create_async(name) for name in names])
    events = Events()
    _wait_all([ours.client.get_async(name, watch=events) for name in names])
    assert len(watches_held(zookeeper, ours.client)) == 1500
    ours.cut_and_restore(lambda: raw_zk.set(names[-1], b"changed while away"))
    assert events.wait_for(EventType.CHANGED, {names[-1]})
    assert len(watches_held(zookeeper, ours.client)) == 1499


def test_remove_watches_stops_events(watched, raw_zk, zookeeper):
    ours = watched()
    raw_zk.ensure_path("/svc")
    events, marker = Events(), Events()
    ours.watches.add_watch("/svc", events, AddWatchMode.PERSISTENT_RECURSIVE)
    raw_zk.create("/svc/one")
    assert events.wait_for(EventType.CREATED, {"/svc/one"})
    ours.watches.remove_watches("/svc", WatcherType.PERSISTENT_RECURSIVE)
    assert watches_held(zookeeper, ours.client) == []
    raw_zk.create("/svc/two")
    # events arrive in order on one connection: once the marker's has, /svc/two's would have
    ours.client.exists("/marker", watch=marker)
    raw_zk.create("/marker")
    assert marker.wait_for(EventType.CREATED, {"/marker"})
    assert events.of(EventType.CREATED) == {"/svc/one"}
    ours.client.get("/svc/one", watch=events)
    ours.watches.remove_watches("/svc/one", WatcherType.DATA)
    assert watches_held(zookeeper, ours.client) == []
    with pytest.raises(NoWatcherError):  # nothing left to remove
        ours.watches.remove_watches("/svc/one", WatcherType.DATA)


def test_multi_read_returns_data_children_and_errors_per_path(
    watched, raw_zk, zookeeper, namespace
):
    raw_zk.create("/svc/a", b"alpha", makepath=True)
    raw_zk.create("/svc/b", b"")
    answers, reads = [], []
    for mode in ({}, {"force_fallback": True}):
        ours = watched(**mode)
        reads_before = reads_served(zookeeper, namespace)
        got = ours.watches.get_many(data=["/svc/a", "/svc/b", "/gone"], children=["/svc", "/no"])
        reads.append(reads_served(zookeeper, namespace) - reads_before)
        answers.append(got)
    assert reads == [3, 3]  # one read per node found (the server counts no failed read)
    for got in answers:
        assert got.data["/svc/a"][0] == b"alpha" and got.data["/svc/a"][1].version == 0
        assert got.data["/svc/b"][0] == b""
        assert isinstance(got.data["/gone"], NoNodeError)
        assert sorted(got.children["/svc"]) == ["a", "b"]
        assert isinstance(got.children["/no"], NoNodeError)
    assert answers[0].data["/svc/a"] == answers[1].data["/svc/a"]


def test_forced_fallback_behaves_as_stock_kazoo(watched, raw_zk, zookeeper):
    ours = watched(force_fallback=True)
    assert not ours.watches.supported and ours.watches.fallback
    with pytest.raises(UnimplementedError):
        ours.watches.add_watch("/svc", Events(), AddWatchMode.PERSISTENT_RECURSIVE)
    raw_zk.create("/svc", b"0")
    events = Events()
    ours.client.get("/svc", watch=events)
    raw_zk.set("/svc", b"1")
    raw_zk.set("/svc", b"2")
    assert events.wait_for(EventType.CHANGED, {"/svc"})
    ours.client.get("/svc", watch=events)
    ours.cut_and_restore(lambda: raw_zk.set("/svc", b"while away"))
    # as stock kazoo: the watch was dropped at SUSPENDED with a NONE event, not restored
    assert wait_until(lambda: any(e.type == EventType.NONE for e in events.seen)) is not None
    assert watches_held(zookeeper, ours.client) == []
    assert [e.type for e in events.seen] == [EventType.CHANGED, EventType.NONE]


def test_session_expiry_drops_persistent_watches_and_tells_the_watcher(watched, raw_zk, zookeeper):
    ours = watched()
    raw_zk.ensure_path("/svc")
    events = Events()
    ours.watches.add_watch("/svc", events, AddWatchMode.PERSISTENT_RECURSIVE)
    old_session, password = ours.client.client_id
    intruder = KazooClient(hosts=zookeeper.connect_string, client_id=(old_session, password))
    intruder.start(timeout=10)
    intruder.stop()  # closing the borrowed session ends it on the server
    intruder.close()
    assert wait_until(lambda: any(e.type == EventType.NONE for e in events.seen), 15)
    (gone,) = [e for e in events.seen if e.type == EventType.NONE]
    assert gone.state == KeeperState.EXPIRED_SESSION and gone.path is None
    assert wait_until(lambda: ours.client.connected, 15) is not None
    assert ours.client.client_id[0] != old_session
    assert watches_held(zookeeper, ours.client) == []
    raw_zk.create("/svc/after-expiry")
    marker = Events()
    ours.client.exists("/marker", watch=marker)
    raw_zk.create("/marker")
    assert marker.wait_for(EventType.CREATED, {"/marker"})
    assert events.of(EventType.CREATED) == set()


def test_known_paths_let_the_server_report_what_changed_below_a_recursive_watch(
    watched, raw_zk, zookeeper, namespace
):
    ours = watched()
    names = [f"/svc/i{i}" for i in range(200)]
    raw_zk.ensure_path("/svc")
    _wait_all([raw_zk.create_async(name, b"0") for name in names])
    held = ["/svc", *names]  # what a cache following /svc holds
    events = Events()
    ours.watches.add_watch(
        "/svc", events, AddWatchMode.PERSISTENT_RECURSIVE, known=lambda: list(held)
    )
    only_the_watch = [f"{raw_zk.chroot}/svc"]
    reads_before = reads_served(zookeeper, namespace)

    ours.cut_and_restore(lambda: None)  # nothing changes: nothing reported, nothing read
    assert wait_until(lambda: watches_held(zookeeper, ours.client) == only_the_watch)

    def while_away() -> None:
        raw_zk.set("/svc/i1", b"changed")
        raw_zk.delete("/svc/i2")
        raw_zk.create("/svc/new")

    ours.cut_and_restore(while_away)
    assert events.wait_for(EventType.CHANGED, {"/svc/i1"})
    assert events.wait_for(EventType.DELETED, {"/svc/i2"})
    assert events.wait_for(EventType.CHILD, {"/svc"})  # a creation: list /svc again
    # the one-shot watches that did not fire are gone again: the server holds one watch
    assert wait_until(lambda: watches_held(zookeeper, ours.client) == only_the_watch)
    raw_zk.create("/svc/later")
    assert events.wait_for(EventType.CREATED, {"/svc/later"})
    assert [(e.type, e.path) for e in events.seen] == [
        (EventType.CHANGED, "/svc/i1"),
        (EventType.DELETED, "/svc/i2"),
        (EventType.CHILD, "/svc"),
        (EventType.CREATED, "/svc/later"),
    ]  # the server handles SetWatches2's data watches before its child watches
    assert reads_served(zookeeper, namespace) == reads_before  # nothing was read again


def test_an_absolute_watch_follows_a_registry_outside_the_chroot_on_the_same_session(
    watched, raw_zk, zookeeper
):
    # A Curator base path outside the client's namespace, named as a path inside it is: one
    # session follows both, and neither watcher hears of the other's nodes.
    ours = watched()
    outside = f"/jvm-{uuid.uuid4().hex[:8]}"
    unrooted = KazooClient(hosts=zookeeper.connect_string)
    unrooted.start(timeout=10)
    try:
        unrooted.ensure_path(f"{outside}/services/orders")
        raw_zk.ensure_path(f"{outside}/services/orders")  # the same path, inside the chroot
        theirs, mine = Events(), Events()
        held = [f"{outside}/services/orders/a"]
        ours.watches.add_watch(
            f"{outside}/services",
            theirs,
            AddWatchMode.PERSISTENT_RECURSIVE,
            known=lambda: list(held),
            absolute=True,
        )
        ours.watches.add_watch(f"{outside}/services", mine, AddWatchMode.PERSISTENT_RECURSIVE)
        unrooted.create(f"{outside}/services/orders/a", b"1")
        raw_zk.create(f"{outside}/services/orders/b", b"2")
        assert theirs.wait_for(EventType.CREATED, {f"{outside}/services/orders/a"})
        assert mine.wait_for(EventType.CREATED, {f"{outside}/services/orders/b"})
        assert [e.path for e in theirs.seen] == [f"{outside}/services/orders/a"]
        assert [e.path for e in mine.seen] == [f"{outside}/services/orders/b"]
        chroot = raw_zk.chroot
        assert sorted(watches_held(zookeeper, ours.client)) == sorted(
            [f"{outside}/services", f"{chroot}{outside}/services"]
        )
        # Reads from the server's root, in one multi-read and pipelined alike.
        results = ours.watches.get_many(
            [f"{outside}/services/orders/a"], [f"{outside}/services/orders"], absolute=True
        )
        assert results.data[f"{outside}/services/orders/a"][0] == b"1"
        assert results.children[f"{outside}/services/orders"] == ["a"]
        fallback = watched(force_fallback=True)
        piped = fallback.watches.get_many([f"{outside}/services/orders/a"], absolute=True)
        assert piped.data[f"{outside}/services/orders/a"][0] == b"1"
        # Known paths from the server's root: a change while cut off is reported on return.
        ours.cut_and_restore(lambda: unrooted.set(f"{outside}/services/orders/a", b"changed"))
        assert theirs.wait_for(EventType.CHANGED, {f"{outside}/services/orders/a"})
        ours.watches.remove_watches(
            f"{outside}/services", WatcherType.PERSISTENT_RECURSIVE, absolute=True
        )
        unrooted.create(f"{outside}/services/orders/c", b"3")
        raw_zk.create(f"{outside}/services/orders/c", b"3")
        assert mine.wait_for(EventType.CREATED, {f"{outside}/services/orders/c"})
        assert f"{outside}/services/orders/c" not in theirs.of(EventType.CREATED)
    finally:
        unrooted.stop()
        unrooted.close()


class ReadingWatcher:
    """A watcher for ``add_watch(on_connection_thread=True)``: records the thread it runs on,
    and sends the read of each created or changed node with ``read_now``."""

    def __init__(self, watches: PersistentWatches, fail_first: bool = False) -> None:
        self.watches = watches
        self.fail_first = fail_first
        self.threads: set[threading.Thread] = set()
        self.reads: dict[str, object] = {}
        self.completed: list[tuple[str, threading.Thread]] = []

    def __call__(self, event: WatchedEvent) -> None:
        self.threads.add(threading.current_thread())
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError("a watcher's bug")
        if event.type in (EventType.CREATED, EventType.CHANGED):
            path = event.path

            def then() -> None:
                self.completed.append((path, threading.current_thread()))

            self.reads[path] = self.watches.read_now(path, then)


def reading(watched, raw_zk, fail_first: bool = False) -> tuple[Watched, ReadingWatcher]:
    """A client whose :class:`ReadingWatcher` follows ``/svc`` on the connection thread."""
    ours = watched()
    raw_zk.ensure_path("/svc")
    watcher = ReadingWatcher(ours.watches, fail_first=fail_first)
    ours.watches.add_watch(
        "/svc", watcher, AddWatchMode.PERSISTENT_RECURSIVE, on_connection_thread=True
    )
    return ours, watcher


def test_kazoo_handles_only_the_events_its_own_one_shot_watchers_wait_for(
    watched, raw_zk, monkeypatch
):
    # kazoo's own handling parses each event a second time, on the connection thread, while
    # the cache's worker waits for that thread: it is left out when kazoo holds no one-shot
    # watcher of the event's path, and still serves one that does, once.
    ours = watched()
    handed_to_kazoo: list[str] = []
    stock = ConnectionHandler._read_watch_event

    def spy(connection, buffer, offset):
        if connection.client is ours.client:
            handed_to_kazoo.append(Watch.deserialize(buffer, offset)[0].path)
        return stock(connection, buffer, offset)

    monkeypatch.setattr(ConnectionHandler, "_read_watch_event", spy)
    raw_zk.ensure_path("/svc")
    events, one_shot = Events(), Events()
    ours.watches.add_watch("/svc", events, AddWatchMode.PERSISTENT_RECURSIVE)
    assert ours.client.exists("/svc/b", watch=one_shot) is None
    raw_zk.create("/svc/a", b"1")
    raw_zk.delete("/svc/a")
    raw_zk.create("/svc/b", b"1")
    raw_zk.set("/svc/b", b"2")
    assert events.wait_for(EventType.CHANGED, {"/svc/b"})
    assert one_shot.wait_for(EventType.CREATED, {"/svc/b"})
    assert [(e.type, e.path) for e in events.seen] == [
        (EventType.CREATED, "/svc/a"),
        (EventType.DELETED, "/svc/a"),
        (EventType.CREATED, "/svc/b"),
        (EventType.CHANGED, "/svc/b"),
    ]
    assert [(e.type, e.path) for e in one_shot.seen] == [(EventType.CREATED, "/svc/b")]
    assert handed_to_kazoo == [f"{raw_zk.chroot}/svc/b"]  # the one-shot watch's event alone


def test_a_watcher_on_the_connection_thread_sends_the_changed_nodes_read_at_once(watched, raw_zk):
    ours, watcher = reading(watched, raw_zk, fail_first=True)
    raw_zk.create("/svc/a", b"raises")  # the watcher's bug is logged, no more
    raw_zk.set("/svc/a", b"one")
    raw_zk.create("/svc/b", b"two")
    assert wait_until(lambda: len(watcher.completed) == 2)
    connection_thread = ours.client._connection._connection_routine
    assert watcher.threads == {connection_thread}  # never kazoo's callback thread
    assert [thread for _, thread in watcher.completed] == [connection_thread] * 2
    assert watcher.reads["/svc/a"].get(timeout=5)[0] == b"one"
    assert watcher.reads["/svc/b"].get(timeout=5)[0] == b"two"
    # Anywhere else there is no event being read: the caller reads the usual way.
    assert ours.watches.read_now("/svc/a", lambda: None) is None
    assert ours.client.get("/svc/a")[0] == b"one"  # the connection is as sound as before


def test_a_read_sent_at_once_that_the_connection_loses_fails_and_still_completes(watched, raw_zk):
    ours, watcher = reading(watched, raw_zk)
    raw_zk.create("/svc/a", b"zero")
    assert wait_until(lambda: len(watcher.completed) == 1)
    ours.proxy.pause(to_client=False)  # the event comes in; its read waits in the link
    raw_zk.set("/svc/a", b"one")
    assert wait_until(lambda: len(ours.client._pending) == 1)
    ours.proxy.cut()
    assert wait_until(lambda: len(watcher.completed) == 2)
    with pytest.raises(ConnectionLoss):
        watcher.reads["/svc/a"].get(timeout=5)
    ours.proxy.resume()
    ours.proxy.restore()
    assert wait_until(lambda: ours.client.connected, 15)


class Writers:
    """Which threads wrote requests (pings aside) to a client's socket, and how often its
    connection thread was woken to send a queued one."""

    def __init__(self, client: KazooClient) -> None:
        self.threads: list[threading.Thread] = []
        self.woken = 0
        connection = client._connection
        submit, send_request = connection._submit, connection._send_request

        def recording_submit(request, timeout, xid=None):
            if not isinstance(request, Ping):
                self.threads.append(threading.current_thread())
            return submit(request, timeout, xid)

        def counting_send_request(*args):
            self.woken += 1
            return send_request(*args)

        connection._submit = recording_submit
        connection._send_request = counting_send_request


def test_a_request_is_written_by_the_thread_that_makes_it(watched, raw_zk):
    ours = watched()
    writers = Writers(ours.client)
    ours.client.create("/a", b"one")
    assert ours.client.get("/a")[0] == b"one"
    ours.client.set("/a", b"two")
    assert [r.get(timeout=10)[0] for r in [ours.client.get_async("/a") for _ in range(50)]] == [
        b"two"
    ] * 50
    # 53 requests, each written by this thread: the connection thread was never woken for one.
    assert writers.threads == [threading.current_thread()] * 53
    assert writers.woken == 0


def test_threads_writing_at_once_each_get_their_own_replies_in_order(watched, raw_zk):
    ours = watched()
    ours.client.ensure_path("/t")
    failures: list[str] = []

    def queued_get(path: str):
        """A read through kazoo's queue, written by the connection thread meanwhile."""
        result = ours.client.handler.async_result()
        ours.watches._internals.stock_call(GetData(f"{ours.client.chroot}{path}", None), result)
        return result

    def work(worker: int) -> None:
        try:
            for i in range(100):
                path = f"/t/{worker}-{i}"
                ours.client.create(path, f"{worker}:{i}".encode())
                # pipelined: sent before any reply is read; a session's replies come in order
                results = [queued_get(path), ours.client.set_async(path, b"x")]
                results += [ours.client.get_async(path), queued_get(path)]
                values = [results[0].get(timeout=10)[0]] + [
                    r.get(timeout=10)[0] for r in results[2:]
                ]
                if values != [f"{worker}:{i}".encode(), b"x", b"x"]:
                    failures.append(f"{path}: {values}")
        except Exception as exc:  # a lost reply or a dropped connection fails the test
            failures.append(f"worker {worker}: {exc!r}")

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures[:5]
    assert len(ours.client.get_children("/t")) == 800


def test_a_request_waits_behind_those_queued_for_the_connection_thread(watched, raw_zk):
    ours = watched()
    ours.client.create("/a", b"zero")
    connection, queued = ours.client._connection, ours.client.handler.async_result()
    server_path = f"{ours.client.chroot}/a"
    # A request in kazoo's queue that the connection thread has not been woken for yet.
    ours.client._queue.append((SetData(server_path, b"queued", -1), queued))
    later = ours.client.handler.async_result()
    try:
        sent = connection.send_now(SetData(server_path, b"later", -1), later)
    finally:
        connection._write_sock.send(b"\0")  # the wake the queued one never had
    assert sent is False  # not written ahead of it
    queued.get(timeout=10)
    ours.client._call(SetData(server_path, b"later", -1), later)
    later.get(timeout=10)
    assert ours.client.get("/a")[0] == b"later"  # written in the order they were made


def test_a_write_that_fails_on_the_callers_thread_loses_the_connection_not_the_request(
    watched, raw_zk
):
    ours = watched()
    ours.client.create("/a", b"one")
    session = ours.client.client_id[0]
    connection = ours.client._connection
    submit = connection._submit
    failed = []

    def failing_once(request, timeout, xid=None):
        if threading.current_thread() is threading.main_thread() and not failed:
            failed.append(request)
            raise ConnectionDropped("the socket broke")
        return submit(request, timeout, xid)

    connection._submit = failing_once
    with pytest.raises(ConnectionLoss):  # at once: the socket is shut, no ping has to time out
        ours.client.get_async("/a").get(timeout=3)
    assert failed
    assert wait_until(lambda: ours.client.connected, 15) is not None
    assert ours.client.get("/a")[0] == b"one"  # reconnected, within the same session
    assert ours.client.client_id[0] == session


def test_while_the_connection_is_down_requests_queue_as_kazoo_queues_them(watched, raw_zk):
    ours = watched()
    ours.client.create("/a", b"one")
    ours.proxy.cut()
    assert wait_until(lambda: KazooState.SUSPENDED in ours.states, 10) is not None
    assert not ours.client._connection._direct
    result = ours.client.get_async("/a")  # queued for the next connection
    ours.proxy.restore()
    assert result.get(timeout=15)[0] == b"one"
    assert wait_until(lambda: ours.client._connection._direct, 10) is not None


def test_a_read_sent_at_once_whose_write_fails_is_failed_once_and_the_session_kept(watched, raw_zk):
    ours, watcher = reading(watched, raw_zk)
    session = ours.client.client_id[0]
    connection = ours.client._connection
    submit = connection._submit
    failed = []

    def failing_once(request, timeout, xid=None):
        if isinstance(request, GetData) and not failed:
            failed.append(request)
            raise ConnectionDropped("the socket broke")
        return submit(request, timeout, xid)

    connection._submit = failing_once
    raw_zk.create("/svc/a", b"one")
    assert wait_until(lambda: watcher.completed) is not None
    with pytest.raises(ConnectionLoss):
        watcher.reads["/svc/a"].get(timeout=5)
    assert wait_until(lambda: ours.client.connected, 15) is not None
    assert ours.client.get("/svc/a")[0] == b"one"
    assert ours.client.client_id[0] == session
    assert failed and len(watcher.completed) == 1  # ``then`` once, on the connection thread
    assert watcher.completed[0][1] is connection._connection_routine


def test_a_thread_that_does_not_wait_for_a_connection_is_told_at_once_it_has_none(watched, raw_zk):
    ours = watched()
    ours.client.create("/a", b"one")
    ours.proxy.cut()
    assert wait_until(lambda: KazooState.SUSPENDED in ours.states, 10) is not None
    with ours.watches.waiting_for_connection(False), pytest.raises(ConnectionLoss):
        ours.client.get_async("/a").get(timeout=1)  # not queued for the next connection
    failed_at_once: list[int] = []  # without a byte on kazoo's wake-up socket each: a few
    # hundred unread ones fill it, and the next request's write of one would block

    def many() -> None:
        with ours.watches.waiting_for_connection(False):
            results = [ours.client.exists_async("/a") for _ in range(3000)]
        failed_at_once.append(sum(isinstance(r.exception, ConnectionLoss) for r in results))

    thread = threading.Thread(target=many, daemon=True)
    thread.start()
    thread.join(10)
    while thread.is_alive():  # blocked on a full wake-up socket: empty it, or nothing stops
        ours.client._connection._read_sock.recv(65536)
        thread.join(0.1)
    assert failed_at_once == [3000]
    waiting = ours.client.get_async("/a")  # outside the block: kazoo's way
    ours.proxy.restore()
    assert waiting.get(timeout=15)[0] == b"one"
    with ours.watches.waiting_for_connection(False):  # connected: as any request
        assert ours.client.get("/a")[0] == b"one"


def test_an_unwaited_request_is_failed_when_the_drop_beats_its_queueing(
    watched, raw_zk, monkeypatch
):
    # kazoo fails what is queued when the link drops; a request queued just after that (its
    # thread saw the connection up a moment before) would wait for the next connection.
    ours = watched()
    ours.client.create("/a", b"one")
    stock_call = ours.watches._internals.stock_call
    monkeypatch.setattr(ours.client._connection, "send_now", lambda request, result: False)

    def dropped_first(request, result):
        ours.proxy.cut()
        assert wait_until(lambda: KazooState.SUSPENDED in ours.states, 10) is not None
        return stock_call(request, result)

    monkeypatch.setattr(ours.watches._internals, "stock_call", dropped_first)
    with ours.watches.waiting_for_connection(False):
        result = ours.client.get_async("/a")
    monkeypatch.undo()
    assert result.ready(), "queued for the next connection after the drop"
    with pytest.raises(ConnectionLoss):
        result.get(timeout=0)
    assert not ours.client._queue
    ours.proxy.restore()
    assert ours.client.get("/a")[0] == b"one"  # the wake-up it left did no harm


def test_work_asked_for_after_a_message_runs_once_it_is_handled_on_the_connection_thread(
    watched, raw_zk
):
    # The cache wakes its worker there: just before the thread lets go of the interpreter,
    # after the watcher (and the read it sent) is done, so the worker does not wake to wait.
    ours = watched()
    raw_zk.ensure_path("/svc")
    steps: list[tuple[str, threading.Thread]] = []

    def watcher(event: WatchedEvent) -> None:
        if event.type != EventType.CREATED:
            return
        steps.append(("watcher", threading.current_thread()))
        assert ours.watches.after_message(
            lambda: steps.append(("after", threading.current_thread()))
        )
        steps.append(("watcher returns", threading.current_thread()))

    ours.watches.add_watch(
        "/svc", watcher, AddWatchMode.PERSISTENT_RECURSIVE, on_connection_thread=True
    )
    raw_zk.create("/svc/a", b"")
    assert wait_until(lambda: len(steps) == 3)
    connection_thread = ours.client._connection._connection_routine
    assert steps == [
        ("watcher", connection_thread),
        ("watcher returns", connection_thread),
        ("after", connection_thread),
    ]
    # Anywhere else there is no message being handled: nothing is taken.
    assert not ours.watches.after_message(lambda: steps.append(("never", None)))
    raw_zk.create("/svc/b", b"")
    assert wait_until(lambda: len(steps) == 6)
    assert ("never", None) not in steps
