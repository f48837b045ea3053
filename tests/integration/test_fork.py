"""A client started before ``os.fork()`` (gunicorn ``--preload``, uWSGI, multiprocessing):
the child gets a session of its own on first use, starting from the inherited snapshot, and
the parent's session, cache and ephemeral nodes are never touched from the child."""

from __future__ import annotations

import multiprocessing.connection
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from sentinel import Sentinel
from sentinel.testing.helpers import wait_until

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
    writer.register_service("db", "p1", "10.0.0.1", 5432, label="a")
    writer.register_service("cache", "p1", "10.0.0.9", 6379, label="c")
    parent = make_client("app")
    mine = parent.register_service("web", "p1", "10.0.1.1", 8080, label="w")
    assert parent.get_service("db").label == "a"  # warm before the fork
    parent_session = parent.session_id

    def child(client: Sentinel, pipe: multiprocessing.connection.Connection) -> dict[str, Any]:
        started = time.monotonic()
        first = client.get_service("db").label  # the inherited snapshot, served at once
        first_lookup = time.monotonic() - started
        pipe.send({"first": first, "first_lookup": first_lookup})
        assert pipe.poll(REPLY_TIMEOUT)  # the parent has registered b after the fork
        pipe.recv()
        seen = wait_until(
            lambda: {e.label for e in client.get_services("db")} == {"a", "b"},
            timeout=PROPAGATION_BOUND,
        )
        return {
            "seen_after": seen,
            "never_loaded": client.get_service("cache").label,
            "session": client.session_id,
            "client_id": client.client_id,
            "state": client.connection_state,
            "staleness": client.staleness,
            "resyncs": client.cache_stats.resyncs,
            "registrations": len(client.registrations),
            "clients_db": sorted(client._zk.get_children("/clients/db")),
        }

    pid, pipe = _fork(parent, child)
    hello = _receive(pipe)
    assert hello["first"] == "a"
    assert hello["first_lookup"] < 1.0  # served, not loaded: no wait for a connection
    writer.register_service("db", "p1", "10.0.0.2", 5432, label="b")  # after the fork
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
    assert result["clients_db"] == ["app", f"app-{pid}"]  # each process announces itself

    # The parent: same session, its ephemeral node still its own, its cache still current.
    assert parent.session_id == parent_session
    assert parent.connection_state == "connected"
    _, stat = raw_zk.get(mine.path)
    assert stat.ephemeralOwner == parent_session
    assert parent.registrations == (mine,)
    assert wait_until(lambda: {e.label for e in parent.get_services("db")} == {"a", "b"})
    writer.register_service("db", "p1", "10.0.0.3", 5432, label="d")
    assert wait_until(lambda: len(parent.get_services("db")) == 3, timeout=PROPAGATION_BOUND)


def test_a_child_closing_its_inherited_client_leaves_the_parent_session_alone(make_client, raw_zk):
    parent = make_client("app")
    mine = parent.register_service("web", "p1", "10.0.1.1", 8080, label="w")
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
    writer.register_service("db", "p1", "10.0.0.1", 5432, label="a")
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
