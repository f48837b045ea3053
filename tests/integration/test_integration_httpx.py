"""SentinelTransport against real HTTP servers on loopback, registered in a real ZooKeeper."""

import asyncio
import collections
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sentinel.balancers.load import PowerOfTwoChoices
from sentinel.balancers.weighted import WeightedRandom

from sentinel.errors import ServiceNotFound
from sentinel.integrations.httpx import AsyncSentinelTransport, SentinelTransport
from sentinel.testing.helpers import wait_until
from sentinel.testing.httpserver import LoopbackHTTPServer

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


class Counting(httpx.BaseTransport):
    """httpx's own transport, noting the port of every request it sends."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.ports: list[int | None] = []
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.ports.append(request.url.port)
        self.requests.append(request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def servers():
    """Start loopback HTTP servers by name; all are stopped after the test."""
    started = []

    def start(name, **kwargs):
        server = LoopbackHTTPServer(name, **kwargs).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def register(publisher, service, servers, partition="p1", **kwargs):
    for server in servers:
        publisher.register(
            service, partition, "127.0.0.1", server.port, label=server.name, **kwargs
        )


def names(http, url, count, **kwargs):
    return collections.Counter(http.get(url, **kwargs).json()["name"] for _ in range(count))


def endpoint_of(client, service, label):
    return next(e for e in client.cached_instances(service) if e.label == label)


def test_requests_are_spread_by_the_balancer_and_keep_path_and_query(make_client, servers):
    publisher, client = make_client("publisher"), make_client("reader")
    a, b, c = servers("a"), servers("b"), servers("c")
    register(publisher, "api", [a, b, c])
    with httpx.Client(transport=SentinelTransport(client)) as http:
        answer = http.get("http://api.sentinel/items/7?sort=desc").json()
        assert answer["path"] == "/items/7?sort=desc"
        port = {"a": a.port, "b": b.port, "c": c.port}[answer["name"]]
        assert answer["headers"]["host"] == f"127.0.0.1:{port}"
        # The default balancer, round robin: exactly a third each.
        assert names(http, "http://api.sentinel/", 90) == {"a": 30, "b": 30, "c": 30}

    heavy = servers("heavy")
    publisher.register("weighted", "p1", "127.0.0.1", heavy.port, label="heavy", weight=3)
    register(publisher, "weighted", [servers("light")])
    transport = SentinelTransport(client, balancer=WeightedRandom(seed=7))
    with httpx.Client(transport=transport) as http:
        shares = names(http, "http://weighted.sentinel/", 400)
    assert 0.65 < shares["heavy"] / 400 < 0.85  # weights 3:1, so 0.75


def test_a_killed_instance_costs_at_most_the_retries_and_is_reported_down(make_client, servers):
    publisher, client = make_client("publisher"), make_client("reader")
    a, b, c = servers("a"), servers("b"), servers("c")
    register(publisher, "api", [a, b, c])
    counting = Counting()
    with httpx.Client(transport=SentinelTransport(client, counting, retries=2)) as http:
        assert set(names(http, "http://api.sentinel/", 9)) == {"a", "b", "c"}
        b.stop()  # still registered: its process died, its session has not expired yet
        del counting.ports[:]
        answered = names(http, "http://api.sentinel/", 60)
    assert answered["b"] == 0 and answered.total() == 60  # no request failed
    failed = counting.ports.count(b.port)
    # Three failures (the feedback's default) mark it down; later lookups skip it.
    assert 1 <= failed <= client.feedback.detection.consecutive_failures
    assert len(counting.ports) == 60 + failed  # each failure cost one retry, nothing more
    assert client.feedback.is_down(endpoint_of(client, "api", "b"))
    assert not client.feedback.is_down(endpoint_of(client, "api", "a"))


def test_an_instance_answering_5xx_is_ejected_by_default(make_client, servers):
    """As Envoy's consecutive_5xx: three 503s in a row from b eject it, with no option given;
    ``server_errors_fail=False`` counts transport errors only."""
    publisher, client = make_client("publisher"), make_client("reader")
    a, b, c = servers("a"), servers("b", status=503), servers("c")
    register(publisher, "api", [a, b, c])
    with httpx.Client(transport=SentinelTransport(client)) as http:
        answered = names(http, "http://api.sentinel/", 30)
    assert answered["b"] == client.feedback.detection.consecutive_failures
    assert client.feedback.is_down(endpoint_of(client, "api", "b"))
    other = make_client("lenient")
    with httpx.Client(transport=SentinelTransport(other, server_errors_fail=False)) as http:
        assert names(http, "http://api.sentinel/", 30) == dict.fromkeys("abc", 10)
    assert not other.feedback.is_down(endpoint_of(other, "api", "b"))


def test_a_post_is_never_retried_and_retries_are_bounded(make_client, servers):
    publisher, client = make_client("publisher"), make_client("reader")
    a, b, c = servers("a"), servers("b"), servers("c")
    register(publisher, "api", [a, b, c])
    b.stop()
    counting = Counting()
    with httpx.Client(transport=SentinelTransport(client, counting)) as http:
        outcomes = []
        for _ in range(3):  # round robin: one of the three goes to b
            try:
                outcomes.append(http.post("http://api.sentinel/", content=b"x").json()["name"])
            except httpx.ConnectError:
                outcomes.append("refused")
        assert sorted(outcomes) == ["a", "c", "refused"]
        assert len(counting.ports) == 3  # sent once each
        # An idempotent request with a body goes to another endpoint, body and all.
        answers = [http.put("http://api.sentinel/", content=b"y").json() for _ in range(3)]
        assert {x["name"] for x in answers} == {"a", "c"}
        assert all(x["headers"]["content-length"] == "1" for x in answers)
        a.stop()
        c.stop()
        del counting.ports[:]
        with pytest.raises(httpx.ConnectError):
            http.get("http://api.sentinel/")
        # One attempt per live instance (at most 1 + retries): none is tried twice.
        assert len(counting.ports) == len(set(counting.ports)) <= 3


def test_the_transport_retries_as_every_integration_does_when_none_other_is_left(
    make_client, servers
):
    """One retry route (sentinel.integrations.retry.Route): with every eligible endpoint failed
    once, the next attempt is the policy's pick among them all again, as the PostgreSQL
    ``connect`` of its only replica makes its three attempts there."""
    publisher, client = make_client("publisher"), make_client("reader")
    only = servers("only")
    register(publisher, "api", [only])
    counting = Counting()
    with httpx.Client(transport=SentinelTransport(client, counting, retries=2)) as http:
        assert names(http, "http://api.sentinel/", 1) == {"only": 1}
        only.stop()  # still registered: its process died, its session has not expired yet
        del counting.ports[:]
        with pytest.raises(httpx.ConnectError):  # the library's own error, as before
            http.get("http://api.sentinel/")
    assert counting.ports == [only.port] * 3  # 1 + retries attempts
    # Its three failures ejected it (the only instance: served in panic, and said so).
    assert client.feedback.is_down(endpoint_of(client, "api", "only"))


def test_latency_feedback_shifts_load_away_from_a_slow_instance(make_client, servers):
    publisher, client = make_client("publisher"), make_client("reader")
    fast = [servers("fast-1"), servers("fast-2")]
    # Slower by far than a loaded machine's noise: with a 50 ms delay the fast ones looked as
    # slow in CI on four workers (46 of 150 requests went to the slow one).
    register(publisher, "api", [*fast, servers("slow", delay=0.5)])
    url = "http://api.sentinel/"
    balancer = PowerOfTwoChoices(feedback=client.feedback, seed=3)
    with httpx.Client(transport=SentinelTransport(client, balancer=balancer)) as http:
        started = time.monotonic()
        shares = names(http, url, 150)
        # Without the reported latencies every instance would get a third; the slow one gets
        # its first tries (each instance is measured), then one only when the machine's noise
        # makes a fast one look slower still.
        assert shares["slow"] / 150 < 0.1
        assert shares["fast-1"] > 40 and shares["fast-2"] > 40
        slow = client.feedback.latency(endpoint_of(client, "api", "slow"))
        # Measured at 0.5 s or more, then decayed for at most the time since the first request.
        decayed = math.exp(-(time.monotonic() - started) / client.feedback.decay_time)
        assert slow is not None and slow >= 0.5 * decayed
        # A new instance is tried, measured, and gets its share.
        register(publisher, "api", [servers("fast-3")])
        assert wait_until(lambda: len(client.cached_instances("api")) == 4)
        assert names(http, url, 90)["fast-3"] >= 15


def test_unknown_hosts_pass_through_untouched(make_client, servers):
    make_client("publisher").ensure_namespace()  # an initialised namespace without the service
    client = make_client("reader")
    direct = servers("direct")
    counting = Counting()
    with httpx.Client(transport=SentinelTransport(client, counting)) as http:
        answer = http.get(
            f"http://127.0.0.1:{direct.port}/x?y=1", headers={"X-Sentinel-Key": "kept"}
        ).json()
        assert answer["name"] == "direct" and answer["path"] == "/x?y=1"
        assert answer["headers"]["x-sentinel-key"] == "kept"
        assert counting.requests[0].url.host == "127.0.0.1"
        assert client.lookup_counts == {}  # never resolved anything
        with pytest.raises(ServiceNotFound):
            http.get("http://missing.sentinel/")


def test_the_shard_key_selects_the_partition(make_client, servers):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.shard_maps.ensure("tenants", "directory", partitions=["p1", "p2"])
    publisher.shard_maps.assign_many("tenants", {"acme": "p1", "globex": "p2"})
    publisher.ensure_service("orders", shard_policy="tenants")
    register(publisher, "orders", [servers("p1-a"), servers("p1-b")], partition="p1")
    register(publisher, "orders", [servers("p2-a")], partition="p2")
    with httpx.Client(transport=SentinelTransport(client)) as http:
        by_extension = names(
            http, "http://orders.sentinel/", 6, extensions={"sentinel_key": "acme"}
        )
        assert by_extension == {"p1-a": 3, "p1-b": 3}
        answer = http.get("http://orders.sentinel/", headers={"X-Sentinel-Key": "globex"}).json()
        assert answer["name"] == "p2-a"
        assert "x-sentinel-key" not in answer["headers"]  # the key is not forwarded
        both = http.get(
            "http://orders.sentinel/",
            headers={"X-Sentinel-Key": "globex"},
            extensions={"sentinel_key": "acme"},
        )
        assert both.json()["name"].startswith("p1-")  # the extension wins
    transport = SentinelTransport(client, suffix=".mesh", key_header="X-Tenant")
    with httpx.Client(transport=transport) as http:
        answer = http.get("http://orders.mesh/", headers={"X-Tenant": "globex"}).json()
        assert answer["name"] == "p2-a" and "x-tenant" not in answer["headers"]


def test_the_async_transport_spreads_retries_and_reports(make_client, servers):
    publisher, client = make_client("publisher"), make_client("reader")
    a, b, c = servers("a"), servers("b"), servers("c")
    register(publisher, "api", [a, b, c])

    async def main():
        async with httpx.AsyncClient(transport=AsyncSentinelTransport(client)) as http:
            first = [(await http.get("http://api.sentinel/")).json()["name"] for _ in range(30)]
            b.stop()
            refused = 0
            for _ in range(3):  # round robin: one goes to b, and a POST is not retried
                try:
                    await http.post("http://api.sentinel/", content=b"x")
                except httpx.ConnectError:
                    refused += 1
            assert refused == 1
            answers = await asyncio.gather(*(http.get("http://api.sentinel/") for _ in range(30)))
            return first, [r.json()["name"] for r in answers]

    first, after = asyncio.run(main())
    assert collections.Counter(first) == {"a": 10, "b": 10, "c": 10}
    assert len(after) == 30 and "b" not in after
    assert client.feedback.is_down(endpoint_of(client, "api", "b"))


@pytest.mark.parametrize(
    ("index", "printed"), [(0, ["a", "b", "a", "acme->p1", "down:True"]), (1, ["fast"])]
)
def test_the_documented_examples_run_and_print_what_they_say(index, printed):
    section = DOC.read_text().split("## HTTP (httpx)")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "docs/integrations.md: two python examples under ## HTTP (httpx)"
    # No time-out of its own: a ZooKeeper server, HTTP servers and dozens of requests take
    # longer the busier the machine (docs/testing-history.md, "Flaky tests found and fixed"); a hang
    # is the suite's time-out's.
    result = subprocess.run([sys.executable, "-c", blocks[index]], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == printed
