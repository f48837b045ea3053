"""A short chaos run (``python -m benchmarks.chaos``): every kind of fault at least once,
random churn, the invariants checked all along; none may be violated."""

from __future__ import annotations

import pytest

from benchmarks.chaos import FAULTS, break_resync, run
from sentinel.cache import RegistryCache
from sentinel.cache.config import CacheConfig
from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.zk.watches import PersistentWatches

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.faults]


def test_a_short_chaos_run_violates_no_invariant():
    outcome = run(seconds=45, seed=11, checkpoint_every=25)
    assert set(outcome.faults) == set(FAULTS), outcome.faults
    assert outcome.checked > 1000, "too few lookups were checked against the bound to mean much"
    assert len(outcome.checkpoints) >= 2
    # One example a line, in full (a list would be cut short): the timelines explain them.
    assert not outcome.violations, "\n".join(outcome.examples)
    assert not outcome.lookup_errors, outcome.lookup_errors
    assert outcome.readers_alive and all(outcome.readers_alive.values()), outcome.readers_alive
    assert len(outcome.reader_lookups) == len(outcome.readers_alive)
    assert min(outcome.reader_lookups.values()) >= 1000, outcome.reader_lookups


@pytest.mark.parametrize("broken", [False, True], ids=["intact", "broken"])
def test_the_broken_client_misses_what_was_deregistered_while_it_was_away(
    broken, make_client, zookeeper, monkeypatch
):
    """``--broken-client`` breaks the client (``break_resync``): a reader whose session
    resumed after a cut link never hears of the deregistration made meanwhile, where the
    intact one does. Disabling the cache's re-sync alone stopped doing this when the
    connection took over a resumed session's re-sync, and the self-check then found 0
    violations. The reader's watch still works afterwards: a registration made after the
    re-sync is heard by both, and once it is, the intact reader has applied the earlier
    deregistration too (the server reported it first, on the same connection)."""
    if broken:  # patched for this test only
        monkeypatch.setattr(RegistryCache, "_resync", RegistryCache._resync)
        monkeypatch.setattr(PersistentWatches, "_resync_paths", PersistentWatches._resync_paths)
        break_resync()
    writer = make_client("writer", announce=False)
    writer.ensure_service("api")
    away = writer.register("api", "p1", "127.0.0.1", 8000, label="away")
    writer.register("api", "p1", "127.0.0.1", 8001, label="stays")
    proxy = TcpProxy("127.0.0.1", zookeeper.members[0].client_port)
    try:
        reader = make_client(
            "reader",
            hosts=proxy.address,
            announce=False,
            cache=CacheConfig(resync_jitter=0),
            persistent_watches=True,
        )
        reader.prefetch("api")

        def labels() -> set[str]:
            return {e.label for e in reader.cached_instances("api")}

        assert labels() == {"away", "stays"}
        resyncs = reader.cache_stats.resyncs
        proxy.cut()
        assert wait_until(lambda: reader.connection_state == "suspended", timeout=15)
        writer.deregister(away)
        proxy.restore()
        assert wait_until(lambda: reader.cache_stats.resyncs > resyncs, timeout=15)
        assert reader.cache_stats.session_events.get("lost", 0) == 0  # the session resumed
        # The re-sync is counted when the session is told CONNECTED, which can come before the
        # connection has sent its SetWatches2: a write meanwhile would find no watch of the
        # reader's on the server. A read of the reader's own is answered only after it.
        reader.read_service("api")
        writer.register("api", "p1", "127.0.0.1", 8002, label="after")
        assert wait_until(lambda: "after" in labels(), timeout=15)
        assert labels() == ({"away", "stays", "after"} if broken else {"stays", "after"})
    finally:
        proxy.close()
