"""sentinel.zk.kazoo_internals: the extension checks the kazoo it runs on, and on a kazoo whose
private names differ from those it was written for it overrides nothing (plain kazoo) with one
warning, and a Sentinel client on it still resolves and follows changes."""

import socket
import threading
import warnings

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionDropped
from kazoo.protocol.connection import ConnectionHandler

from sentinel.testing.helpers import wait_until
from sentinel.zk import kazoo_internals
from sentinel.zk.kazoo_internals import HookedConnection, KazooCompatibilityWarning
from sentinel.zk.transport import PollHandler
from sentinel.zk.watches import install


def _other_parameters(monkeypatch: pytest.MonkeyPatch) -> str:
    # kazoo works as before; one method the extension overrides takes other parameters
    stock = ConnectionHandler._read_response

    def _read_response(self, header, data, position):
        return stock(self, header, data, position)

    monkeypatch.setattr(ConnectionHandler, "_read_response", _read_response)
    return "ConnectionHandler._read_response(self, header, data, position)"


def _other_version(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(kazoo_internals, "KAZOO_VERSION", "2.12.0")
    return "kazoo 2.12.0 is not 2.11.x"


@pytest.fixture(params=[_other_parameters, _other_version], ids=["parameters", "version"])
def other_kazoo(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """kazoo as the extension does not know it; what the warning must name."""
    monkeypatch.setattr(kazoo_internals, "_warned", set())  # this process may have warned
    return request.param(monkeypatch)


def _compatibility_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, KazooCompatibilityWarning)]


def test_the_installed_kazoo_is_the_one_the_extension_knows():
    client = KazooClient("127.0.0.1:1")  # never started
    found = kazoo_internals.check(client)
    assert found.hooks == () and found.calls == ()
    with warnings.catch_warnings():
        warnings.simplefilter("error", KazooCompatibilityWarning)
        watches = install(client)
    assert isinstance(client._connection, HookedConnection)
    assert install(client) is watches


def test_a_missing_private_name_leaves_kazoo_untouched_with_one_warning_naming_it(monkeypatch):
    monkeypatch.setattr(kazoo_internals, "_warned", set())
    monkeypatch.delattr(ConnectionHandler, "_read_header")
    clients = [KazooClient("127.0.0.1:1") for _ in range(2)]  # never started
    stock_connections = [client._connection for client in clients]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watches = [install(client) for client in clients]
    (message,) = _compatibility_warnings(caught)
    assert "ConnectionHandler._read_header missing" in message
    assert kazoo_internals.KAZOO_VERSION in message
    for client, connection, ours in zip(clients, stock_connections, watches, strict=True):
        assert client._connection is connection and type(connection) is ConnectionHandler
        assert not {"_call", "_reset_watchers", "_session_callback"} & set(vars(client))
        assert ours.fallback and not ours.supported


def test_a_client_already_started_is_refused():
    client = KazooClient("127.0.0.1:1")
    client._state = "CONNECTING"  # as start() leaves it, without a server to reach
    with pytest.raises(RuntimeError, match="before the client's start"):
        install(client)


@pytest.mark.integration
def test_on_a_kazoo_of_other_internals_sentinel_runs_as_plain_kazoo_and_follows_changes(
    other_kazoo, make_client
):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        publisher = make_client("publisher")
        reader = make_client("reader")  # asks for persistent watches: gets kazoo's one-shot
    (message,) = _compatibility_warnings(caught)  # one, for both clients
    assert other_kazoo in message
    zk = reader.session.zk
    assert type(zk._connection) is ConnectionHandler
    assert not {"_call", "_reset_watchers", "_session_callback"} & set(vars(zk))
    assert reader.session.watches.fallback
    publisher.register("api", "p1", "h1", 80, label="a")
    assert reader.get_service("api").label == "a"
    publisher.register("api", "p2", "h2", 80, label="b")
    assert wait_until(lambda: [e.label for e in reader.eligible_instances("api")] == ["a", "b"])
    first = publisher.register("api", "p3", "h3", 80, label="c")
    assert wait_until(lambda: len(reader.eligible_instances("api")) == 3)
    publisher.deregister(first)
    assert wait_until(lambda: [e.label for e in reader.eligible_instances("api")] == ["a", "b"])


@pytest.mark.integration
def test_a_ready_socket_is_read_and_written_without_a_select_before_each_call(
    make_client, monkeypatch
):
    """kazoo asks select before every send and recv (four per request and reply: the write,
    the connection loop's wake-up, the reply's length, its body); on plain TCP the hooked
    connection only waits in its loop, and goes to kazoo's waiting code when it would block."""
    zk = make_client("reader").session.zk
    zk.exists("/")
    calls = []
    stock = zk.handler.select

    def select(*args, **kwargs):
        calls.append(args)
        return stock(*args, **kwargs)

    monkeypatch.setattr(zk.handler, "select", select)
    for _ in range(50):
        zk.exists("/")
    # one per reply in the loop, give or take a ping or a body that came after its length
    assert len(calls) <= 2 * 50, f"{len(calls)} selects for 50 round trips"


class _Client:
    use_ssl = False


def _connection(sock) -> HookedConnection:
    """A hooked connection on ``sock`` with only what its reads and writes use."""
    connection = HookedConnection.__new__(HookedConnection)
    connection.client = _Client()
    connection.handler = PollHandler()
    connection._socket = sock
    sock.setblocking(False)  # as kazoo's connection sets it
    return connection


def test_a_message_that_arrives_in_parts_is_read_whole_by_kazoos_waiting_read():
    a, b = socket.socketpair()
    with a, b:
        connection = _connection(a)
        b.sendall(b"head")
        later = threading.Timer(0.05, b.sendall, (b"-tail",))
        later.start()
        assert connection._read(9, 5.0) == b"head-tail"  # the rest waited for
        later.join()
        later = threading.Timer(0.05, b.sendall, (b"next",))
        later.start()
        assert connection._read(4, 5.0) == b"next"  # nothing there yet: kazoo's read waits
        later.join()
        b.close()
        with pytest.raises(ConnectionDropped):
            connection._read(1, 5.0)


def test_a_write_the_socket_cannot_take_at_once_is_finished_by_kazoos_waiting_write():
    a, b = socket.socketpair()
    with a, b:
        connection = _connection(a)
        message = bytes(range(256)) * 16_384  # 4 MiB: more than a socket buffer holds
        received = bytearray()

        def drain():
            while len(received) < len(message):
                received.extend(b.recv(65536))

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        connection._write(message, 10.0)
        reader.join(10)
        assert bytes(received) == message
