"""Policies on live metrics against a real ZooKeeper: the paper's replica rule end to end."""

import json
import time

import pytest
from sentinel.balancers import RoundRobin
from sentinel.policies import AllUp, FreshMetrics, MinLag, Tagged

from sentinel.errors import (
    InstanceNotRegistered,
    InvalidName,
    NoInstanceAvailable,
    ValidationError,
)
from sentinel.events import InstancesChanged, MetricsChanged
from sentinel.feedback import OutlierDetection
from sentinel.testing.helpers import wait_until
from tests.integration.recorder import Recorder

pytestmark = pytest.mark.integration


def three_replicas(publisher):
    publisher.shard_maps.create("tenants", "directory", partitions=["p1"], buckets=4)
    publisher.shard_maps.assign("tenants", "acme", "p1")
    publisher.ensure_service("db", scheme="postgresql", shard_policy="tenants")
    for label in ("r1", "r2", "r3"):
        publisher.register(
            "db", "p1", f"10.0.0.{label[-1]}", 5432, scheme="postgresql", label=label
        )


def test_min_lag_follows_the_best_replica_as_metrics_change(make_client):
    publisher, collector = make_client("publisher"), make_client("collector")
    client = make_client("batch-engine")
    three_replicas(publisher)
    policy = MinLag(cutoff=30)
    lags = {"r1": 12.0, "r2": 3.0, "r3": 8.0}
    for label, lag in lags.items():
        collector.update_metrics("db", "p1", label, {"replication_lag": lag})
    recorder = Recorder()
    client.listen("db", recorder)
    assert client.get_service("db", "acme", policy=policy).label == "r2"

    rounds = [{"r2": 40.0}, {"r1": 1.0}, {"r3": 0.5}, {"r1": 31.0, "r3": 20.0}]
    for changes in rounds:
        recorder.events.clear()
        for label, lag in changes.items():
            lags[label] = lag
            collector.update_metrics("db", "p1", label, {"replication_lag": lag})
        for label, lag in changes.items():
            recorder.wait(
                lambda e, label=label, lag=lag: (
                    isinstance(e, MetricsChanged)
                    and any(
                        new.label == label and new.metrics["replication_lag"] == lag
                        for _, new in e.updated
                    )
                )
            )
        eligible = {k: v for k, v in lags.items() if v <= 30}
        expected = min(eligible, key=eligible.get)
        assert client.get_service("db", "acme", policy=policy).label == expected
    # Every replica now lags past the cut-off: the batch engine gets none rather than a bad one.
    collector.update_metrics("db", "p1", "r3", {"replication_lag": 99})
    recorder.wait(
        lambda e: (
            isinstance(e, MetricsChanged)
            and any(new.metrics.get("replication_lag") == 99 for _, new in e.updated)
        )
    )
    with pytest.raises(NoInstanceAvailable, match="MinLag"):
        client.get_service("db", "acme", policy=policy)


def test_metrics_reach_endpoints_with_their_age_and_outlive_instances(make_client, raw_zk):
    publisher, collector, client = (make_client(n) for n in ("publisher", "collector", "app"))
    three_replicas(publisher)
    record = collector.update_metrics(
        "db", "p1", "r1", {"replication_lag": 2, "role": "hot"}, measured_at=1_000.0
    )
    assert json.loads(raw_zk.get("/metrics/db/p1:r1")[0]) == {
        "v": 1,
        "measured_at": 1000.0,
        "metrics": {"replication_lag": 2, "role": "hot"},
    }
    endpoints = {e.label: e for e in client.eligible_instances("db", "acme")}
    assert endpoints["r1"].metrics == record.values and endpoints["r1"].metrics_at == 1_000.0
    assert endpoints["r1"].metrics_age > 1e9
    assert endpoints["r2"].metrics == {} and endpoints["r2"].metrics_age is None
    with pytest.raises(NoInstanceAvailable, match="FreshMetrics"):  # measured in 1970
        client.eligible_instances("db", "acme", policy=FreshMetrics(60))
    # Metrics for an instance nobody registered are refused (issue 24): no orphan node.
    with pytest.raises(InstanceNotRegistered, match="'p1:r9' of service 'db'"):
        collector.update_metrics("db", "p1", "r9", {"replication_lag": 0})
    assert raw_zk.exists("/metrics/db/p1:r9") is None
    # Metrics outlive their instance: when it registers again they are attached as it appears.
    r9 = publisher.register("db", "p1", "10.0.0.9", 5432, label="r9")
    collector.update_metrics("db", "p1", "r9", {"replication_lag": 0})

    def cached_metrics() -> dict | None:
        return {e.label: dict(e.metrics) for e in client.cached_instances("db")}.get("r9")

    # The cache must have held r9 with its metrics, or "gone" below holds at once (it never
    # saw r9) and the registration after races the metrics' first read.
    assert wait_until(lambda: cached_metrics() == {"replication_lag": 0}) is not None
    publisher.deregister(r9)
    assert wait_until(lambda: cached_metrics() is None) is not None
    recorder = Recorder()
    client.listen("db", recorder)
    publisher.register("db", "p1", "10.0.0.9", 5432, label="r9")
    added = recorder.wait(lambda e: isinstance(e, InstancesChanged) and e.added)
    assert added.added[0].label == "r9"
    assert added.added[0].metrics == {"replication_lag": 0}
    assert client.get_service("db", "acme", policy=MinLag()).label == "r9"


def test_hostile_metrics_nodes_are_skipped_and_the_rest_served(make_client, raw_zk):
    publisher, collector, client = (make_client(n) for n in ("publisher", "collector", "app"))
    three_replicas(publisher)
    collector.update_metrics("db", "p1", "r1", {"replication_lag": 5})
    raw_zk.ensure_path("/metrics/db")
    raw_zk.create("/metrics/db/p1:r2", b"\x00garbage")
    raw_zk.create(
        "/metrics/db/p1:r3", b'{"v": 1, "measured_at": 1, "metrics": {"lag": "x", "bad name/": 1}}'
    )
    raw_zk.create("/metrics/db/no-colon", b'{"v": 1}')
    assert client.get_service("db", "acme", policy=MinLag()).label == "r1"
    assert client.cache_stats.decode_errors == 3
    # The instances whose metrics are broken are still served by metric-free lookups.
    assert {e.label for e in client.eligible_instances("db", "acme")} == {"r1", "r2", "r3"}
    # A repaired node is picked up through its watch.
    recorder = Recorder()
    client.listen("db", recorder)
    repaired = {"v": 1, "measured_at": time.time(), "metrics": {"replication_lag": 0}}
    raw_zk.set("/metrics/db/p1:r2", json.dumps(repaired).encode())
    recorder.wait(lambda e: isinstance(e, MetricsChanged))
    assert client.get_service("db", "acme", policy=MinLag()).label == "r2"


@pytest.mark.parametrize(
    ("metrics", "error", "fragment"),
    [
        ({"lag": float("nan")}, ValidationError, "finite"),
        ({"lag": float("inf")}, ValidationError, "finite"),
        ({"lag": [1]}, ValidationError, "number or a string"),
        ({"lag": None}, ValidationError, "number or a string"),
        ({"lag": True}, ValidationError, "number or a string"),
        ({"lag": "x" * 257}, ValidationError, "at most 256"),
        ({"bad/name": 1}, InvalidName, "metric"),
        ({f"m{i}": 1 for i in range(257)}, ValidationError, "at most 256"),
        ([("lag", 1)], ValidationError, "mapping"),
    ],
)
def test_bad_metrics_are_refused_and_nothing_is_written(
    make_client, raw_zk, metrics, error, fragment
):
    collector = make_client("collector")
    with pytest.raises(error, match=fragment):
        collector.update_metrics("db", "p1", "r1", metrics)
    assert raw_zk.exists("/metrics/db/p1:r1") is None


def test_the_largest_allowed_metrics_are_accepted(make_client, raw_zk):
    # 256 metrics of 256-character strings is the most the validation allows (~100 KB),
    # well under the 512 KB value limit, so valid metrics never fail on size.
    collector = make_client("collector")
    collector.register("db", "p1", "10.0.0.1", 5432, label="r1")
    largest = {f"metric-{i:03d}-{'n' * 110}": "x" * 256 for i in range(256)}
    collector.update_metrics("db", "p1", "r1", largest)
    assert len(json.loads(raw_zk.get("/metrics/db/p1:r1")[0])["metrics"]) == 256


def test_reported_failures_take_an_instance_out_for_a_while(make_client):
    """With no cap and no panic (the rule before passive ejection had them), every failing
    instance is skipped, and a partition can be left with none."""
    publisher = make_client("publisher")
    uncapped = OutlierDetection(
        consecutive_failures=2, base_ejection_time=0.5, max_ejection_percent=100, panic_threshold=0
    )
    client = make_client("app", feedback=uncapped)
    publisher.register("api", "p1", "h1", 80, label="a")
    publisher.register("api", "p1", "h2", 80, label="b")
    bad = next(e for e in client.eligible_instances("api") if e.label == "a")
    client.report(bad, ok=False)
    client.report(bad, ok=False)
    assert {client.get_service("api").label for _ in range(6)} == {"b"}
    client.report(next(e for e in client.eligible_instances("api") if e.label == "b"), ok=False)
    client.report(next(e for e in client.eligible_instances("api") if e.label == "b"), ok=False)
    with pytest.raises(NoInstanceAvailable, match="2 ejected for reported failures"):
        client.get_service("api")
    # After down_for, both come back by themselves.
    assert wait_until(lambda: _eligible(client, "api") == 2, timeout=5)


def _eligible(client, service):
    try:
        return len(client.eligible_instances(service))
    except NoInstanceAvailable:
        return 0


def test_policy_and_balancer_accept_their_registered_names(make_client):
    """Issue 24: the names the CLI takes work from the API too (they raised TypeError)."""
    publisher, collector, client = (make_client(n) for n in ("publisher", "collector", "app"))
    three_replicas(publisher)
    for label, lag in (("r1", 5), ("r2", 1), ("r3", 3)):
        collector.update_metrics("db", "p1", label, {"replication_lag": lag})
    wait_until(lambda: client.get_service("db", "acme", policy=MinLag()).label == "r2")
    assert client.get_service("db", "acme", policy="min_lag").label == "r2"
    assert [e.label for e in client.eligible_instances("db", "acme", policy="min_lag")] == ["r2"]
    assert [e.label for e in client.explain("db", "acme", policy="min_lag").eligible] == ["r2"]
    picked = {client.get_service("db", "acme", balancer="round_robin").label for _ in range(3)}
    assert picked == {"r1", "r2", "r3"}


@pytest.mark.parametrize(
    ("arguments", "fragment", "known"),
    [
        ({"policy": MinLag}, "policy=the class MinLag (pass an instance: MinLag(...))", "min_lag"),
        ({"policy": 42}, "policy=42 of type int", "min_lag"),
        ({"policy": "min_lagg"}, "policy='min_lagg', which no plug-in registers", "min_lag"),
        ({"balancer": 42}, "balancer=42 of type int", "round_robin"),
        ({"balancer": RoundRobin}, "balancer=the class RoundRobin", "round_robin"),
        ({"balancer": "fastest"}, "balancer='fastest', which no plug-in", "round_robin"),
    ],
)
def test_a_policy_or_balancer_neither_an_instance_nor_a_name_is_a_validation_error(
    make_client, arguments, fragment, known
):
    """Issue 24: a TypeError or AttributeError before, for the class a 1 KB endpoint dump."""
    publisher, client = make_client("publisher"), make_client("app")
    three_replicas(publisher)
    lookups = [lambda: client.get_service("db", "acme", **arguments)]
    if "policy" in arguments:
        lookups += [
            lambda: client.eligible_instances("db", "acme", **arguments),
            lambda: client.explain("db", "acme", **arguments),
        ]
    for lookup in lookups:
        with pytest.raises(ValidationError) as raised:
            lookup()
        message = str(raised.value)
        assert fragment in message
        assert "instance" in message and "name of a registered" in message and known in message
        assert "10.0.0." not in message and "Endpoint(" not in message  # no endpoint dump


def test_an_hour_old_metric_loses_to_a_fresh_one_and_is_shown_stale(make_client, cli_in_process):
    """Issue 24: MinLag trusted metrics of any age by default, so a replica whose collector
    stopped an hour ago at lag 0.1 s stayed the one chosen. Now the fresh replica is chosen,
    and explain() and `sentinel resolve` give the old one the verdict "stale"."""
    publisher, collector, client = (make_client(n) for n in ("publisher", "collector", "app"))
    three_replicas(publisher)
    collector.update_metrics(
        "db", "p1", "r1", {"replication_lag": 0.1}, measured_at=time.time() - 3600
    )
    collector.update_metrics("db", "p1", "r2", {"replication_lag": 5})
    collector.update_metrics("db", "p1", "r3", {"replication_lag": 9})
    wait_until(lambda: all(e.metrics for e in client.eligible_instances("db", "acme")))
    assert client.get_service("db", "acme", policy=MinLag()).label == "r2"
    assert client.get_service("db", "acme", policy="min_lag").label == "r2"
    explanation = client.explain("db", "acme", MinLag())
    verdicts = {name.rsplit(":", 1)[1]: v for name, v in explanation.verdicts.items()}
    assert verdicts["r1"] == "stale" and verdicts["r2"] == "eligible"
    assert verdicts["r3"].startswith("excluded by MinLag(")
    assert [e.label for e in explanation.eligible] == ["r2"]
    chained = client.explain("db", "acme", MinLag() & AllUp() & Tagged())  # nested chains
    assert {n.rsplit(":", 1)[1]: v for n, v in chained.verdicts.items()} == verdicts
    # Trusting metrics of any age is still possible, and explicit.
    assert client.get_service("db", "acme", policy=MinLag(max_age=None)).label == "r1"
    # When nothing is fresh the error says so, rather than routing to an old value.
    with pytest.raises(NoInstanceAvailable, match=r"\(3 with stale metrics: check their"):
        client.get_service("db", "acme", policy=MinLag(max_age=0.001))
    resolved = cli_in_process("resolve", "db", "acme", "--policy", "min_lag", "--json")
    assert resolved.returncode == 0, resolved.stderr
    answer = json.loads(resolved.stdout)
    assert {i["label"]: i["verdict"] for i in answer["instances"]}["r1"] == "stale"
    assert [p["label"] for p in answer["picks"]] == ["r2"]
    table = cli_in_process("resolve", "db", "acme", "--policy", "min_lag").stdout
    assert any(
        line.startswith("p1") and "r1" in line and line.rstrip().endswith("stale")
        for line in table.splitlines()
    )


def test_doctor_calls_stale_what_the_policies_exclude(make_client, cli_in_process):
    """Issue 24: doctor's threshold was 300 s while policies trusted any age; both are now
    METRICS_MAX_AGE, so a 45-second-old metric is stale to both."""
    publisher, collector = make_client("publisher"), make_client("collector")
    three_replicas(publisher)
    collector.update_metrics("db", "p1", "r1", {"replication_lag": 1}, measured_at=time.time() - 45)
    collector.update_metrics("db", "p1", "r2", {"replication_lag": 2})
    result = cli_in_process("doctor", "--json")
    stale = [f["detail"] for f in json.loads(result.stdout) if f["check"] == "stale metrics"]
    assert len(stale) == 1 and stale[0].startswith("db p1:r1: measured 4"), stale
    wait_until(
        lambda: sum(bool(e.metrics) for e in publisher.eligible_instances("db", "acme")) == 2
    )
    assert [e.label for e in MinLag().stale(publisher.eligible_instances("db", "acme"))] == ["r1"]
