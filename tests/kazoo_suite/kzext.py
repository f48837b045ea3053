"""pytest plug-in for kazoo's own suite: install ``sentinel.zk.protocol`` on every KazooClient.

Loaded after the shared suite's ``kzpatch`` (``run.sh`` here adds ``-p kzext``). In the patched
mode (``KZ_HANDLER=poll``) every client built gets the protocol extension; before each test an
autouse fixture asserts that a new client has it, and the summary counts the requests the
extension sent before any of kazoo's (the 3.6 probe and the SetWatches2 packets). In the stock
mode, or with ``KZEXT=off``, it does nothing: kazoo as shipped, or with the transport alone.
"""

import collections
import importlib.util
import os
import sys

import kazoo.client
import pytest

# KZEXT=off: the patched mode swaps the transport only, as the shared harness alone does.
ACTIVE = os.environ.get("KZ_HANDLER") == "poll" and os.environ.get("KZEXT") != "off"
PRIMING = collections.Counter()  # type of each request the extension sent on a new connection

if ACTIVE:
    # By file path, as kzpatch loads the transport: sentinel/__init__ needs a cryptography the
    # harness's pyOpenSSL cannot have; zkprotocol.py imports only kazoo and the standard library.
    _path = os.path.join(os.environ.get("SENTINEL_SRC", "."), "sentinel", "zkprotocol.py")
    _spec = importlib.util.spec_from_file_location("sentinel.zk.protocol", _path)
    zkprotocol = importlib.util.module_from_spec(_spec)
    sys.modules["sentinel.zk.protocol"] = zkprotocol
    _spec.loader.exec_module(zkprotocol)

    _exchange = zkprotocol._Connection._exchange

    def _counting_exchange(self, requests, timeout):
        PRIMING.update(type(request).__name__ for request in requests)
        return _exchange(self, requests, timeout)

    zkprotocol._Connection._exchange = _counting_exchange

    _init = kazoo.client.KazooClient.__init__

    def _installing_init(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        zkprotocol.install(self)

    kazoo.client.KazooClient.__init__ = _installing_init


@pytest.fixture(autouse=True)
def _assert_extension_installed():
    if ACTIVE:
        client = kazoo.client.KazooClient("127.0.0.1:1")  # never started
        assert isinstance(client._connection, zkprotocol._Connection)
    yield


def pytest_terminal_summary(terminalreporter):
    state = "installed on every client" if ACTIVE else "not installed"
    terminalreporter.write_line(
        f"kzext: zkprotocol {state}; requests sent before kazoo's on new connections: "
        f"{dict(PRIMING)}"
    )
