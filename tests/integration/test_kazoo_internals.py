"""sentinel.zk.kazoo_internals: the extension checks the kazoo it runs on, and on a kazoo whose
private names differ from those it was written for it overrides nothing (plain kazoo) with one
warning, and a Sentinel client on it still resolves and follows changes."""

import warnings

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.connection import ConnectionHandler

from sentinel.testing.helpers import wait_until
from sentinel.zk import kazoo_internals
from sentinel.zk.kazoo_internals import HookedConnection, KazooCompatibilityWarning
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
