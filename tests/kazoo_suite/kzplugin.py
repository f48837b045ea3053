"""pytest plug-in for kazoo's own suite (``-p kzplugin``): run it as Sentinel's clients run.

``KZ_MODE`` says what every ``KazooClient`` the suite builds gets:

- ``stock``: kazoo as shipped (nothing patched).
- ``transport``: :class:`sentinel.zk.transport.PollHandler` as the default handler, as
  ``sentinel.connection.client_arguments`` gives every client.
- ``ext`` (the default): that handler and :mod:`sentinel.zk.watches` installed on each client.

The handler is swapped where kazoo names it: ``kazoo.client`` (the default of
``KazooClient(handler=None)``) and ``kazoo.handlers.threading`` (tests that import the class by
name). Before every test an autouse fixture asserts that a new client has what the mode gives,
and the terminal summary counts the clients built and the requests the extension sent before
kazoo's on new connections (its probe and SetWatches2 packets). With ``KZ_OUTCOMES`` set, each
test's outcome is written there as JSON, keyed by the id ``--pyargs`` takes
(``kazoo.tests.test_client::TestClient::test_create``); ``KZ_LEAVE_OUT`` names entries
(``kazoo.tests.test_client::TestReconfig``, :func:`tests.kazoo_suite.testids.within`) whose
tests are deselected. The ``sentinel`` package is
imported from the checkout (``PYTHONPATH``); ``sentinel.zk`` needs kazoo and the standard library
only, so the harness's own cryptography (older, for pyOpenSSL) is never in its way.
"""

import collections
import json
import os

import kazoo.client
import kazoo.handlers.threading as kazoo_threading
import pytest
from kazoo.protocol.connection import ConnectionHandler

from tests.kazoo_suite import testids

MODES = ("stock", "transport", "ext")
MODE = os.environ.get("KZ_MODE", "ext")
if MODE not in MODES:
    raise pytest.UsageError(f"KZ_MODE={MODE!r}: one of {', '.join(MODES)}")

STOCK_HANDLER = kazoo_threading.SequentialThreadingHandler
CLIENTS = collections.Counter()  # handler type (and "extended") of every client the suite built
PRIMING = collections.Counter()  # type of each request the extension sent on a new connection

if MODE != "stock":
    from sentinel.zk.transport import PollHandler

    kazoo.client.SequentialThreadingHandler = PollHandler
    kazoo_threading.SequentialThreadingHandler = PollHandler

if MODE == "ext":
    from sentinel.zk import kazoo_internals, watches

    _exchange = kazoo_internals.HookedConnection.exchange

    def _counting_exchange(self, requests, timeout, xid):
        PRIMING.update(type(request).__name__ for request in requests)
        return _exchange(self, requests, timeout, xid)

    kazoo_internals.HookedConnection.exchange = _counting_exchange

_init = kazoo.client.KazooClient.__init__


def _recording_init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    if MODE == "ext":
        watches.install(self)
        CLIENTS["extended"] += 1
    CLIENTS[type(self.handler).__name__] += 1


kazoo.client.KazooClient.__init__ = _recording_init


@pytest.fixture(autouse=True)
def _assert_mode():
    client = kazoo.client.KazooClient("127.0.0.1:1")  # never started
    if MODE == "stock":
        assert type(client.handler) is STOCK_HANDLER
        assert type(client._connection) is ConnectionHandler
    else:
        assert isinstance(client.handler, PollHandler)
        assert isinstance(kazoo_threading.SequentialThreadingHandler(), PollHandler)
    if MODE == "ext":
        # kazoo's own connection class left in place would be the extension falling back.
        assert isinstance(client._connection, kazoo_internals.HookedConnection), type(
            client._connection
        )
        CLIENTS["extended"] -= 1
    CLIENTS[type(client.handler).__name__] -= 1  # the probe is not the suite's
    yield


def _test_id(item):
    """The id ``--pyargs`` takes to run the test again alone."""
    return "::".join([item.module.__name__, *([item.cls.__name__] if item.cls else []), item.name])


def pytest_collection_modifyitems(config, items):
    leave_out = os.environ.get("KZ_LEAVE_OUT", "").split()
    kept, left = [], []
    for item in items:
        (left if testids.within(_test_id(item), leave_out) else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


OUTCOMES = {}  # test id -> passed, skipped, failed (its call) or error (its set-up or teardown)
_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    test = _test_id(item)
    if report.skipped:
        outcome = "skipped"
    elif report.failed:
        outcome = "failed" if report.when == "call" else "error"
    else:
        outcome = "passed"
    if _RANK[outcome] >= _RANK[OUTCOMES.get(test, "passed")]:
        OUTCOMES[test] = outcome
    return report


def pytest_sessionfinish(session):
    if os.environ.get("KZ_OUTCOMES"):
        with open(os.environ["KZ_OUTCOMES"], "w") as out:
            json.dump(OUTCOMES, out, indent=0, sort_keys=True)


def pytest_report_header(config):
    return f"kzplugin: KZ_MODE={MODE}"


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(
        f"kzplugin: mode {MODE}; clients built by the suite: {dict(CLIENTS)}; requests the "
        f"extension sent before kazoo's on new connections: {dict(PRIMING)}"
    )
