"""The client's telemetry, scraped over HTTP from a registry the application chose."""

import time

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

from sentinel.errors import NoInstanceAvailable, ServiceNotFound
from sentinel.events import MetricsChanged
from sentinel.testing.helpers import TcpProxy, expire_session, wait_until
from tests.integration.exposition import scrape
from tests.integration.recorder import Recorder

pytestmark = pytest.mark.integration


@pytest.fixture
def exported():
    """A registry of the test's own, served over HTTP; yields (registry, port)."""
    registry = CollectorRegistry()
    server, _ = start_http_server(0, "127.0.0.1", registry=registry)
    yield registry, server.server_port
    server.shutdown()
    server.server_close()


def lookups(samples, service, result, client="app"):
    key = (
        "sentinel_lookups_total",
        (("client", client), ("result", result), ("service", service)),
    )
    return samples.get(key, 0)


# The slow link of the propagation check: each chunk to or from the app waits this long.
LINK_DELAY = 0.2


@pytest.fixture
def link(zookeeper):
    """A relay to ZooKeeper that can be slowed; closed after the clients (set up before them)."""
    proxy = TcpProxy("127.0.0.1", zookeeper.members[0].client_port)
    yield proxy
    proxy.close()


def test_lookup_counters_move_and_cache_events_are_exported(link, exported, make_client, raw_zk):
    registry, port = exported
    publisher = make_client("publisher")
    publisher.ensure_service("api")
    publisher.register("api", "p1", "10.0.0.1", 80, label="a1")
    # The app reaches ZooKeeper through a relay that can be slowed (after this, nothing
    # changes "api" until the metrics update below: the snapshot loaded here stays).
    app = make_client("app", hosts=link.address, prometheus_registry=registry)
    loading = time.time()
    app.get_service("api")
    loaded = time.time()
    before = scrape(port)
    for _ in range(25):
        app.get_service("api")
    app.eligible_instances("api")
    with pytest.raises(ServiceNotFound):
        app.get_service("missing")
    with pytest.raises(NoInstanceAvailable):
        app.get_service("api", policy=lambda endpoints: ())
    scraping = time.time()
    after = scrape(port)
    scraped = time.time()
    assert lookups(after, "api", "ok") - lookups(before, "api", "ok") == 26
    assert lookups(after, "missing", "service_not_found") == 1
    assert lookups(after, "api", "no_instance") == 1
    client = (("client", "app"),)
    assert after[("sentinel_zookeeper_connection_state", (*client, ("state", "connected")))] == 1
    assert after[("sentinel_zookeeper_connection_state", (*client, ("state", "lost")))] == 0
    # Seconds since the snapshot was built, between the lookup that loaded it and the scrape:
    # milliseconds (about a thousand times more) or a clock other than time.time() fail.
    age = after[("sentinel_cache_snapshot_age_seconds", (*client, ("service", "api")))]
    assert scraping - loaded <= age <= scraped - loading, (age, scraped - loading)

    # A change made elsewhere: watch events, the propagation histogram, then a decode error.
    recorder = Recorder()
    app.listen("api", recorder)
    delays = ("sentinel_propagation_delay_seconds_count", (("section", "metrics"),))
    delay_sum = ("sentinel_propagation_delay_seconds_sum", (("section", "metrics"),))
    link.delay = LINK_DELAY  # the change reaches the app at least LINK_DELAY after its mtime
    publisher.update_metrics("api", "p1", "a1", {"queue": 3})
    recorder.wait(lambda e: isinstance(e, MetricsChanged))
    link.delay = 0.0
    raw_zk.create("/services/api/p1:garbage", b"\xff not json")
    assert wait_until(
        lambda: scrape(port).get(("sentinel_cache_decode_errors_total", client), 0) >= 1, 10
    )
    final = scrape(port)
    assert final[("sentinel_cache_watch_events_total", client)] > after.get(
        ("sentinel_cache_watch_events_total", client), 0
    )
    # The histogram is process-wide: compare what this test's writes added (a delay, not a
    # timestamp), whatever the tests before it observed. The app's observations waited for the
    # slow link: at least LINK_DELAY in all (a delay clamped to 0 fails), and about 5 times it
    # each (measured: 2 observations, 2.07 s; the notification queues behind the link's other
    # chunks), so at most 10 times it each (a unit off by 1000 fails).
    observed = final[delays] - after.get(delays, 0)
    added = final[delay_sum] - after.get(delay_sum, 0)
    assert observed >= 1
    assert LINK_DELAY <= added <= observed * 10 * LINK_DELAY, (added, observed)


def test_off_switch_exports_nothing(exported, make_client):
    _, port = exported
    silent = make_client("silent", prometheus_registry=None)
    silent.ensure_service("api")
    silent.register("api", "p1", "10.0.0.1", 80)
    for _ in range(5):
        silent.get_service("api")
    assert silent.lookup_counts[("api", "ok")] == 5  # still counted, for the application
    assert scrape(port) == {}  # nothing registered itself into this registry
    labels = {"client": "silent", "service": "api", "result": "ok"}
    assert REGISTRY.get_sample_value("sentinel_lookups_total", labels) is None


def test_a_closed_client_leaves_the_exposition(exported, make_client):
    registry, port = exported
    app = make_client("leaving", prometheus_registry=registry)
    app.ensure_service("api")
    assert ("sentinel_cache_staleness_seconds", (("client", "leaving"),)) in scrape(port)
    app.close()
    assert ("sentinel_cache_staleness_seconds", (("client", "leaving"),)) not in scrape(port)


def test_a_session_expiry_is_counted_and_the_state_recovers(exported, make_client):
    registry, port = exported
    app = make_client("expiring", prometheus_registry=registry)
    client = (("client", "expiring"),)
    expire_session(app)

    def recovered():
        samples = scrape(port)
        lost = samples.get(
            ("sentinel_zookeeper_session_events_total", (*client, ("event", "lost")))
        )
        state = ("sentinel_zookeeper_connection_state", (*client, ("state", "connected")))
        return lost == 1 and samples[state] == 1

    assert wait_until(recovered, 20)
