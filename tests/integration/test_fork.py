"""A client started before ``os.fork()`` (gunicorn ``--preload``, uWSGI, multiprocessing):
the child gets a session of its own on first use, starting from the inherited snapshot, and
the parent's session, cache and ephemeral nodes are never touched from the child."""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import re
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sentinel import Sentinel
from sentinel.cache.config import CacheConfig
from sentinel.errors import ZooKeeperUnavailable
from sentinel.events import InstancesChanged
from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.testing.zookeeper import free_ports

pytestmark = pytest.mark.integration

# A change reaches a forked child once it has connected and re-synced: its connection, then
# the re-sync's jitter (resync_jitter, 0.5 s by default) and reads. Bounded well above that.
PROPAGATION_BOUND = 5.0
REPLY_TIMEOUT = 30.0

Child = Callable[[Sentinel, multiprocessing.connection.Connection], dict[str, Any]]


def _fork(client: Sentinel, body: Child) -> tuple[int, multiprocessing.connection.Connection]:
    """Fork; the child runs ``body(client, pipe)``, sends its result (or its traceback)
    through the pipe and leaves with ``os._exit``, never returning into pytest."""
    ours, theirs = multiprocessing.Pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            theirs.send(body(client, theirs))
            code = 0
        except BaseException:
            theirs.send({"error": traceback.format_exc()})
        finally:
            os._exit(code)
    theirs.close()
    return pid, ours


def _receive(pipe: multiprocessing.connection.Connection) -> dict[str, Any]:
    assert pipe.poll(REPLY_TIMEOUT), "the child did not answer"
    message = pipe.recv()
    assert "error" not in message, message["error"]
    return message


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_forked_child_gets_its_own_session_and_sees_changes_after_the_fork(make_client, raw_zk):
    writer = make_client("writer")
    writer.register("db", "p1", "10.0.0.1", 5432, label="a")
    writer.register("cache", "p1", "10.0.0.9", 6379, label="c")
    parent = make_client("app")
    mine = parent.register("web", "p1", "10.0.1.1", 8080, label="w")
    assert parent.get_service("db").label == "a"  # warm before the fork
    parent_session = parent.session_id
    heard: list[InstancesChanged] = []
    parent.listen("db", lambda event: isinstance(event, InstancesChanged) and heard.append(event))

    def child(client: Sentinel, pipe: multiprocessing.connection.Connection) -> dict[str, Any]:
        started = time.monotonic()
        first = client.get_service("db").label  # the inherited snapshot, served at once
        first_lookup = time.monotonic() - started
        pipe.send({"first": first, "first_lookup": first_lookup})
        assert pipe.poll(REPLY_TIMEOUT)  # the parent has registered b after the fork
        pipe.recv()
        seen = wait_until(
            lambda: {e.label for e in client.eligible_instances("db")} == {"a", "b"},
            timeout=PROPAGATION_BOUND,
        )
        return {
            "seen_after": seen,
            "heard": [[e.label for e in event.added] for event in heard],
            "never_loaded": client.get_service("cache").label,
            "session": client.session_id,
            "client_id": client.client_id,
            "state": client.connection_state,
            "staleness": client.staleness,
            "resyncs": client.cache_stats.resyncs,
            "registrations": len(client.registrations),
            # Written by the re-sync once it has re-read the inherited services.
            "announced": wait_until(
                lambda: client.session.zk.exists(f"/clients/db/{client.client_id}"),
                timeout=PROPAGATION_BOUND,
            ),
            "clients_db": sorted(client.session.zk.get_children("/clients/db")),
        }

    pid, pipe = _fork(parent, child)
    hello = _receive(pipe)
    assert hello["first"] == "a"
    assert hello["first_lookup"] < 1.0  # served, not loaded: no wait for a connection
    writer.register("db", "p1", "10.0.0.2", 5432, label="b")  # after the fork
    pipe.send("registered")
    result = _receive(pipe)
    assert _exit_code(pid) == 0

    assert result["seen_after"] is not None, "the child never saw the registration"
    assert result["never_loaded"] == "c"
    assert result["session"] not in (None, parent_session)
    assert result["client_id"] == f"app-{pid}"
    assert result["state"] == "connected" and result["staleness"] == 0.0
    assert result["resyncs"] >= 1
    assert result["registrations"] == 0  # the parent's registration stays the parent's
    assert result["announced"] is not None
    assert result["clients_db"] == ["app", f"app-{pid}"]  # each process announces itself
    assert ["b"] in result["heard"]  # the parent's listener, delivered in the child too

    # The parent: same session, its ephemeral node still its own, its cache still current.
    assert parent.session_id == parent_session
    assert parent.connection_state == "connected"
    _, stat = raw_zk.get(mine.path)
    assert stat.ephemeralOwner == parent_session
    assert parent.registrations == (mine,)
    assert wait_until(lambda: {e.label for e in parent.eligible_instances("db")} == {"a", "b"})
    writer.register("db", "p1", "10.0.0.3", 5432, label="d")
    assert wait_until(lambda: len(parent.eligible_instances("db")) == 3, timeout=PROPAGATION_BOUND)


@pytest.mark.parametrize(
    ("inherited_max_age", "served"),
    [
        pytest.param("default", {"a"}, id="default: read afresh"),
        # The control: today's opt-out serves the inherited snapshot, drained instance and all.
        pytest.param(None, {"a", "b"}, id="None: the inherited snapshot"),
    ],
)
def test_a_child_whose_first_use_comes_after_a_drain_never_returns_the_drained_instance(
    make_client, inherited_max_age, served
):
    writer = make_client("writer")
    writer.register("db", "p1", "10.0.0.1", 5432, label="a")
    drained = writer.register("db", "p1", "10.0.0.2", 5432, label="b")
    options = (
        {}
        if inherited_max_age == "default"
        else {"cache": CacheConfig(inherited_max_age=inherited_max_age)}
    )
    parent = make_client("app", **options)
    assert {e.label for e in parent.eligible_instances("db")} == {"a", "b"}  # warm before the fork

    def child(client: Sentinel, pipe: multiprocessing.connection.Connection) -> dict[str, Any]:
        assert pipe.poll(REPLY_TIMEOUT)  # the parent has drained b
        pipe.recv()
        since_fork = time.time() - client.session.forked_at
        return {"labels": {e.label for e in client.eligible_instances("db")}, "age": since_fork}

    pid, pipe = _fork(parent, child)
    writer.deregister(drained, wait=1.0)  # then 1 s for clients to see it
    pipe.send("drained")
    result = _receive(pipe)
    assert _exit_code(pid) == 0
    # The first use came after the deregistration (its wait, 1 s on a wall clock that may run a
    # hair short of the sleep's monotonic second), past the default bound it tests.
    assert result["age"] > CacheConfig().inherited_max_age
    assert result["labels"] == served


def _fork_then_cut_the_link(
    zookeeper, make_client, child: Child, **parent_options: Any
) -> dict[str, Any]:
    """A warm parent ``app`` whose link to ZooKeeper goes through a proxy; fork, cut the link,
    and tell the child (``child`` waits for it on the pipe); returns the child's result."""
    make_client("writer").register("db", "p1", "10.0.0.1", 5432, label="a")
    proxy = TcpProxy("127.0.0.1", zookeeper.members[0].client_port)
    try:
        parent = make_client("app", hosts=proxy.address, **parent_options)
        parent.get_service("db")
        pid, pipe = _fork(parent, child)
        proxy.cut()
        pipe.send("cut")
        result = _receive(pipe)
        assert _exit_code(pid) == 0
    finally:
        proxy.close()
    return result


def test_a_child_within_inherited_max_age_serves_the_inherited_snapshot_with_no_zookeeper(
    zookeeper, make_client
):
    """Served, not loaded: the link is cut before the child's first lookup, so only the
    snapshot it inherited can answer it (a child that inherited nothing fails here)."""

    def child(client: Sentinel, pipe: multiprocessing.connection.Connection) -> dict[str, Any]:
        assert pipe.poll(REPLY_TIMEOUT)  # the link is cut
        pipe.recv()
        return {"label": client.get_service("db").label, "state": client.connection_state}

    # A bound far above the fork's own time, so the test does not depend on the load.
    result = _fork_then_cut_the_link(
        zookeeper, make_client, child, cache=CacheConfig(inherited_max_age=60.0)
    )
    assert result == {"label": "a", "state": "snapshot"}


def test_a_child_past_inherited_max_age_that_cannot_connect_fails_typed_not_stale(
    zookeeper, make_client
):
    def child(client: Sentinel, pipe: multiprocessing.connection.Connection) -> dict[str, Any]:
        assert pipe.poll(REPLY_TIMEOUT)  # the link is cut
        pipe.recv()
        # Timed by the child's own clock: the fork itself may take a while under load.
        assert wait_until(
            lambda: time.time() - client.session.forked_at > client.cache_config.inherited_max_age
        )
        started = time.monotonic()
        try:
            client.get_service("db")
        except ZooKeeperUnavailable as exc:
            return {"raised": str(exc), "waited": time.monotonic() - started}
        return {"raised": None}

    result = _fork_then_cut_the_link(zookeeper, make_client, child, connect_timeout=1.0)
    assert result["raised"] is not None, "the child served its stale inherited cache"
    assert 0.9 <= result["waited"] < 3.0  # connect_timeout (1 s), then the typed error


def test_a_child_closing_its_inherited_client_leaves_the_parent_session_alone(make_client, raw_zk):
    parent = make_client("app")
    mine = parent.register("web", "p1", "10.0.1.1", 8080, label="w")
    parent_session = parent.session_id

    def child(client: Sentinel, _: multiprocessing.connection.Connection) -> dict[str, Any]:
        client.close()  # before any use: nothing of the child's own to end
        return {"state": client.connection_state}

    pid, pipe = _fork(parent, child)
    assert _receive(pipe) == {"state": "closed"}
    assert _exit_code(pid) == 0

    # A close that reached the inherited socket would have ended the parent's session.
    assert parent.session_id == parent_session
    assert parent.connection_state == "connected"
    assert raw_zk.get(mine.path)[1].ephemeralOwner == parent_session
    writer_view = parent.read_service("web")  # a round trip on the parent's session
    assert [i.label for i in writer_view.instances] == ["w"]


def test_a_used_child_that_closes_ends_only_its_own_session(make_client, raw_zk):
    writer = make_client("writer")
    writer.register("db", "p1", "10.0.0.1", 5432, label="a")
    parent = make_client("app")
    parent.get_service("db")
    parent_session = parent.session_id

    def child(client: Sentinel, _: multiprocessing.connection.Connection) -> dict[str, Any]:
        client.get_service("db")
        assert wait_until(lambda: client.session_id is not None, timeout=REPLY_TIMEOUT)
        session = client.session_id
        client.close()
        return {"session": session}

    pid, pipe = _fork(parent, child)
    child_session = _receive(pipe)["session"]
    assert _exit_code(pid) == 0
    assert child_session != parent_session
    # The child's /clients entry went with its session; the parent's is still there.
    assert wait_until(lambda: raw_zk.get_children("/clients/db") == ["app"])
    assert raw_zk.get("/clients/db/app")[1].ephemeralOwner == parent_session
    assert parent.session_id == parent_session
    assert parent.get_service("db").label == "a"


DOC = Path(__file__).resolve().parents[2] / "docs" / "resolution.md"


def _docs_app() -> str:
    """The gunicorn app of docs/resolution.md, as printed there."""
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        if "def application" in block:
            return block
    raise AssertionError("docs/resolution.md has no gunicorn app")


def _ask(port: int, path: str, hold: socket.socket | None = None) -> dict[str, Any]:
    """GET ``path``; with ``hold`` (a connection already accepted by one worker) the request
    goes on that connection, else on a new one."""
    sock = hold or socket.create_connection(("127.0.0.1", port), timeout=REPLY_TIMEOUT)
    with sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: test\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") or head.startswith(b"HTTP/1.0 200"), answer
    return json.loads(body)


def _both_workers(port: int, path: str) -> list[dict[str, Any]]:
    """One answer from each of two sync workers: a connection held open (its worker blocks
    reading it) sends the next request to the other worker."""
    held = socket.create_connection(("127.0.0.1", port), timeout=REPLY_TIMEOUT)
    other = _ask(port, path)
    return [other, _ask(port, path, hold=held)]


@pytest.fixture
def gunicorn() -> str:
    try:
        import gunicorn as _  # noqa: F401
    except ImportError:
        pytest.skip("gunicorn is not installed (pip install -e '.[test]')")
    return str(Path(sys.executable).with_name("gunicorn"))


def test_gunicorn_preload_workers_each_get_a_session_and_see_fresh_registrations(
    gunicorn, zookeeper, namespace, make_client, raw_zk, tmp_path
):
    writer = make_client("writer")
    old = writer.register("db", "p1", "10.0.0.1", 5432, label="a")
    writer.register("cache", "p1", "10.0.0.9", 6379, label="c")
    (tmp_path / "app.py").write_text(_docs_app())
    (port,) = free_ports(1)
    env = os.environ | {"SENTINEL_ZK": zookeeper.connect_string, "WEB_NAMESPACE": namespace}
    command = [gunicorn, "--preload", "-w", "2", "-b", f"127.0.0.1:{port}", "app:application"]
    log = tmp_path / "gunicorn.log"  # a file, not a pipe: a full pipe would stall gunicorn
    with log.open("wb") as stderr:
        server = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        assert wait_until(lambda: _ask(port, "/db"), timeout=REPLY_TIMEOUT, ignore=(OSError,)), (
            log.read_text()
        )
        # After the fork: a new instance, and the old one gone, so only a fresh view answers b.
        writer.register("db", "p1", "10.0.0.2", 5432, label="b")
        writer.deregister(old)
        answers: dict[int, dict[str, Any]] = {}

        def both_answer_b() -> bool:
            for answer in _both_workers(port, "/db"):
                answers[answer["pid"]] = answer
            return len(answers) == 2 and all(
                a["uri"] == "http://10.0.0.2:5432" for a in answers.values()
            )

        assert wait_until(both_answer_b, timeout=PROPAGATION_BOUND), answers
        assert {a["client_id"] for a in answers.values()} == {f"web-{pid}" for pid in answers}
        never_loaded = _both_workers(port, "/cache")
        assert {a["uri"] for a in never_loaded} == {"http://10.0.0.9:6379"}
        # The master announced itself once; each worker under its own id and session.
        expected = sorted(["web", *(f"web-{pid}" for pid in answers)])
        # Each worker's entry is written when its re-sync has re-read the inherited services.
        assert wait_until(
            lambda: sorted(raw_zk.get_children("/clients/db")) == expected,
            timeout=PROPAGATION_BOUND,
        ), raw_zk.get_children("/clients/db")
        clients = raw_zk.get_children("/clients/db")
        owners = {raw_zk.get(f"/clients/db/{name}")[1].ephemeralOwner for name in clients}
        assert len(owners) == 3
    finally:
        server.terminate()
        server.wait(timeout=REPLY_TIMEOUT)


def test_gunicorn_preload_workers_whose_first_request_comes_after_a_drain_never_return_it(
    gunicorn, zookeeper, namespace, make_client, tmp_path
):
    writer = make_client("writer")
    writer.register("db", "p1", "10.0.0.1", 5432, label="a")
    drained = writer.register("db", "p1", "10.0.0.2", 5432, label="b")
    (tmp_path / "app.py").write_text(_docs_app())  # prefetches db in the master
    (port,) = free_ports(1)
    env = os.environ | {"SENTINEL_ZK": zookeeper.connect_string, "WEB_NAMESPACE": namespace}
    command = [gunicorn, "--preload", "-w", "2", "-b", f"127.0.0.1:{port}", "app:application"]
    log = tmp_path / "gunicorn.log"
    with log.open("wb") as stderr:
        server = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        # Both workers forked (gunicorn logs each), and no request served yet.
        assert wait_until(
            lambda: log.read_text().count("Booting worker") == 2, timeout=REPLY_TIMEOUT
        ), log.read_text()
        writer.deregister(drained, wait=1.0)
        # Round robin per worker: two answers each would include b if a worker still had it.
        answers = [a for _ in range(2) for a in _both_workers(port, "/db")]
        assert len({a["pid"] for a in answers}) == 2
        assert {a["uri"] for a in answers} == {"http://10.0.0.1:5432"}
    finally:
        server.terminate()
        server.wait(timeout=REPLY_TIMEOUT)


_POOL_CLIENT: Sentinel | None = None  # a global, as an application's module would hold it


def _resolve_in_worker(service: str) -> tuple[int, str, int | None, str]:
    assert _POOL_CLIENT is not None
    endpoint = _POOL_CLIENT.get_service(service)  # "db": served from the inherited snapshot
    wait_until(lambda: _POOL_CLIENT.session_id is not None, timeout=REPLY_TIMEOUT)
    return os.getpid(), endpoint.uri, _POOL_CLIENT.session_id, _POOL_CLIENT.client_id


def test_multiprocessing_fork_pool_workers_resolve_on_sessions_of_their_own(make_client):
    global _POOL_CLIENT
    writer = make_client("writer")
    writer.register("db", "p1", "10.0.0.1", 5432, label="a")
    parent = _POOL_CLIENT = make_client("app")
    parent.get_service("db")
    parent_session = parent.session_id
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            # Registered after the workers were forked: they load it on their own sessions.
            writer.register("queue", "p1", "10.0.0.7", 5672, label="q")
            results = pool.map(_resolve_in_worker, ["queue", "db"] * 4, chunksize=1)
    finally:
        _POOL_CLIENT = None
    assert {uri for _, uri, _, _ in results} == {"http://10.0.0.7:5672", "http://10.0.0.1:5432"}
    assert {pid for pid, _, _, _ in results}.isdisjoint({os.getpid()})
    assert all(session not in (None, parent_session) for _, _, session, _ in results)
    assert all(cid == f"app-{pid}" for pid, _, _, cid in results)
    assert parent.session_id == parent_session
    assert parent.get_service("db").uri == "http://10.0.0.1:5432"
