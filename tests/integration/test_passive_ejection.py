"""Passive ejection with a cap, against a real ZooKeeper (and real HTTP servers): a dependency
failing on every instance leaves callers served, in panic, and says so; one bad instance among
ten is ejected and comes back, for longer on a repeat. Time is a ManualClock: nothing sleeps."""

import collections
import logging

import httpx
import pytest
from prometheus_client import CollectorRegistry

from sentinel.feedback import InstanceFeedback
from sentinel.integrations.httpx import SentinelTransport
from sentinel.testing.helpers import ManualClock
from tests.integration.test_integration_httpx import register, servers  # noqa: F401

pytestmark = pytest.mark.integration


def test_a_dependency_failing_on_every_instance_leaves_callers_served_in_panic(
    make_client,
    servers,  # noqa: F811
    caplog,
):
    """Each of four instances answers 503 (its own dependency is down) and the transport counts
    5xx as failures: the default feedback ejects the first, spares the second over the cap,
    then, with fewer than half unflagged, spreads every call over all four. Before the cap,
    the twelfth call raised NoInstanceAvailable: every instance was marked down."""
    registry = CollectorRegistry()
    publisher = make_client("publisher")
    client = make_client("reader", prometheus_registry=registry)
    fleet = [servers(name, status=503) for name in "abcd"]
    register(publisher, "api", fleet)
    transport = SentinelTransport(client, server_errors_fail=True)
    with (
        caplog.at_level(logging.WARNING, logger="sentinel.feedback"),
        httpx.Client(transport=transport) as http,
    ):
        first = [http.get("http://api.sentinel/") for _ in range(40)]
        steady = [http.get("http://api.sentinel/") for _ in range(40)]
    assert {r.status_code for r in first + steady} == {503}  # answers, not NoInstanceAvailable
    # In panic, round robin over every instance the registry has up: ten calls each.
    assert collections.Counter(r.json()["name"] for r in steady) == dict.fromkeys("abcd", 10)
    explanation = client.explain("api")
    assert explanation.panic and len(explanation.eligible) == 4
    assert "panic" in explanation.steps[1].name and explanation.steps[1].excluded == ()
    panics = [r.getMessage() for r in caplog.records if "panic" in r.getMessage()]
    assert len(panics) == 1, panics  # once for the episode, not once per call
    assert panics[0].startswith("panic in api partition p1: 3 of 4 up instances are ejected")
    labels = {"client": "reader", "service": "api"}
    assert registry.get_sample_value("sentinel_feedback_panic_episodes_total", labels) == 1
    assert registry.get_sample_value("sentinel_feedback_panic_partitions", labels) == 1
    assert registry.get_sample_value("sentinel_feedback_ejected_instances", labels) == 0


def test_one_bad_instance_among_ten_is_ejected_comes_back_and_is_ejected_longer_next_time(
    make_client,
):
    clock = ManualClock()
    registry = CollectorRegistry()
    publisher = make_client("publisher")
    for i in range(10):
        publisher.register("api", "p1", f"10.0.0.{i}", 8080, label=f"i{i}")
    feedback = InstanceFeedback(clock=clock)
    client = make_client("reader", feedback=feedback, prometheus_registry=registry)
    assert len(client.eligible_instances("api")) == 10
    bad = next(e for e in client.cached_instances("api") if e.label == "i3")
    labels = {"client": "reader", "service": "api"}

    def served(calls=90):
        return collections.Counter(client.get_service("api").label for _ in range(calls))

    for ejection_time in (30, 60):  # the second ejection in a row lasts twice as long
        for _ in range(3):
            client.report(bad, ok=False)
        assert served() == {f"i{i}": 10 for i in range(10) if i != 3}
        assert client.explain("api").verdicts[bad.name] == "ejected"
        assert not client.explain("api").panic
        assert registry.get_sample_value("sentinel_feedback_ejected_instances", labels) == 1
        clock.advance(ejection_time - 0.5)
        assert "i3" not in served()
        clock.advance(0.5)
        assert served(100) == {f"i{i}": 10 for i in range(10)}  # back, by itself
        assert registry.get_sample_value("sentinel_feedback_ejected_instances", labels) == 0
    assert registry.get_sample_value("sentinel_feedback_panic_episodes_total", labels) == 0
