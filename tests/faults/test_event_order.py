"""A replacement (a new instance registered, then the old one removed) never leaves the cache
with nothing while the read of the new one is on its way.

With persistent watches, a creation's event has its node's read sent at once and is applied
when the reply is in, while a deletion is applied from its event alone: applied as they
arrived, the deletion of the old instance overtook the creation of the new one, and for one
round trip (a loaded machine's milliseconds, or as long as a stalled link) the snapshot held
neither, a state the registry never had: lookups failed with "has no live instance". Events
are applied in the order the server sent them.

The link holds the reader's requests (the new instance's read among them) while ZooKeeper's
events come through; both events arrive, then the link lets the requests through. Every
change the reader's listeners hear is recorded: the cache must never have served an empty
service. In both watch modes.
"""

from __future__ import annotations

import pytest

from sentinel.events import InstancesChanged
from sentinel.testing.helpers import cached_view, registry_view, wait_until
from tests.faults.conftest import relayed_reader
from tests.integration.nodes import instance

pytestmark = [pytest.mark.integration, pytest.mark.faults]


@pytest.mark.parametrize("persistent", [False, True], ids=["one-shot", "persistent"])
def test_a_replacement_never_leaves_the_cache_empty(make_client, raw_zk, proxy, persistent):
    old_path, old_data = instance("old")
    writer, reader = relayed_reader(make_client, raw_zk, proxy, persistent, [(old_path, old_data)])
    served = [{"old"}]

    def record(event: object) -> None:
        if isinstance(event, InstancesChanged):
            labels = (served[-1] - {e.label for e in event.removed}) | {
                e.label for e in event.added
            }
            served.append(labels)

    reader.listen("api", record)
    events = reader.cache_stats.watch_events
    proxy.pause(to_client=False)  # events and replies come through; requests wait
    raw_zk.create(*instance("new"))
    raw_zk.delete(old_path)
    # Both events are in (a creation and a deletion; one-shot: the parent's children and the
    # old node's deletion): whatever the reader applies from them alone, it has queued.
    assert wait_until(lambda: reader.cache_stats.watch_events >= events + 2, timeout=10)
    proxy.resume()
    assert wait_until(lambda: served[-1] == {"new"}, timeout=10), served
    assert all(served), f"the cache served an empty service: {served}"
    assert cached_view(reader, "api") == registry_view(writer, "api")
    assert reader.get_service("api").label == "new"
