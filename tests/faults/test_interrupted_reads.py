"""A change whose read the connection's loss interrupted still reaches the cache.

A watch event arrives, the cache sends the read of the changed node, and the connection drops
before the reply: kazoo fails the read with ``ConnectionLoss``. When a reply to an earlier
request came in after the change (every reply carries the server's latest zxid), the client's
last zxid is past the change; the session resumes on the next connection, the persistent
watches stay, and the server reports only what changed after that zxid: nothing reports this
change again. The read must be retried after the reconnection, or the cache keeps the old
content until the node changes again.

The link holds the reader's requests while it lets ZooKeeper's events and replies through: an
earlier request is held, the change's event arrives and its read queues behind that request,
the earlier request alone is let through and answered, then the link is cut with the read
unanswered. In both watch modes.
"""

from __future__ import annotations

import pytest
from kazoo.protocol.serialization import GetData

from sentinel.testing.helpers import cached_view, registry_view, wait_until
from tests.faults.conftest import relayed_reader
from tests.integration.nodes import instance, metrics

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def _reading(zk, path: str) -> bool:
    """Whether ``zk`` has sent a read of ``path`` that has no reply yet."""
    return any(
        isinstance(request, GetData) and request.path.endswith(path)
        for request, *_ in list(zk._pending)
    )


@pytest.mark.parametrize("persistent", [False, True], ids=["one-shot", "persistent"])
@pytest.mark.parametrize("node", ["instance", "metrics"])
def test_a_read_cut_off_by_the_connection_is_retried_after_it(
    make_client, raw_zk, proxy, persistent, node
):
    nodes = [instance("a"), metrics("a", 1)]
    writer, reader = relayed_reader(make_client, raw_zk, proxy, persistent, nodes)

    path, data = instance("a", weight=3) if node == "instance" else metrics("a", 3)
    resyncs = reader.cache_stats.resyncs
    proxy.pause(to_client=False)  # events and replies come through; requests wait
    earlier = reader.session.zk.exists_async("/")
    assert wait_until(lambda: proxy.held() == 1)
    changed = raw_zk.set(path, data)
    assert wait_until(lambda: _reading(reader.session.zk, path)), "the reader never read the node"
    proxy.let_through(1)
    earlier.get(timeout=10)
    assert reader.session.zk.last_zxid >= changed.mzxid  # so a resumed session reports nothing
    proxy.cut()
    assert wait_until(lambda: reader.connection_state != "connected")
    proxy.resume()
    proxy.restore()
    assert wait_until(lambda: reader.cache_stats.resyncs > resyncs, timeout=20)
    assert wait_until(lambda: cached_view(reader, "api") == registry_view(writer, "api")), (
        cached_view(reader, "api"),
        registry_view(writer, "api"),
    )
