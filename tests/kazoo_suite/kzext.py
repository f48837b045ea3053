"""pytest plug-in for kazoo's own suite: ``sentinel.zk.protocol`` on every KazooClient.

Loaded after the shared suite's ``kzpatch`` (``run.sh`` here adds ``-p kzext`` and puts the
staged ``sentinel.zk`` modules on the path). In the patched mode (``KZ_HANDLER=poll``) every
client built gets the protocol extension from here; in the extension mode (``KZ_HANDLER=ext``)
``kzpatch`` installs it. In both, an autouse fixture asserts before each test that a new
client has the extension's hooks (not the fallback a kazoo of other internals would get), and
the summary counts the requests the extension sent before any of kazoo's (the 3.6 probe and
the SetWatches2 packets). In the stock mode, or with ``KZEXT=off`` in the patched one, it does
nothing: kazoo as shipped, or with the transport alone.
"""

import collections
import os

import kazoo.client
import pytest

MODE = os.environ.get("KZ_HANDLER")
# KZEXT=off: the patched mode swaps the transport only, as the shared harness alone does.
INSTALLS = MODE == "poll" and os.environ.get("KZEXT") != "off"
ACTIVE = INSTALLS or MODE == "ext"
PRIMING = collections.Counter()  # type of each request the extension sent on a new connection

if ACTIVE:
    # Staged by run.sh as modules that import only kazoo, the standard library and each other
    # (sentinel/__init__ needs a cryptography the harness's pyOpenSSL cannot have).
    from sentinel.zk import kazoo_internals
    from sentinel.zk import protocol as zkprotocol

    _exchange = kazoo_internals.HookedConnection.exchange

    def _counting_exchange(self, requests, timeout, xid):
        PRIMING.update(type(request).__name__ for request in requests)
        return _exchange(self, requests, timeout, xid)

    kazoo_internals.HookedConnection.exchange = _counting_exchange

if INSTALLS:
    _init = kazoo.client.KazooClient.__init__

    def _installing_init(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        zkprotocol.install(self)

    kazoo.client.KazooClient.__init__ = _installing_init


@pytest.fixture(autouse=True)
def _assert_extension_installed():
    if ACTIVE:
        client = kazoo.client.KazooClient("127.0.0.1:1")  # never started
        assert isinstance(client._connection, kazoo_internals.HookedConnection)
    yield


def pytest_terminal_summary(terminalreporter):
    state = "installed on every client" if ACTIVE else "not installed"
    terminalreporter.write_line(
        f"kzext: sentinel.zk.protocol {state}; requests sent before kazoo's on new "
        f"connections: {dict(PRIMING)}"
    )
