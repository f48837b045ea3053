"""Selection policies, one by one and composed (no server)."""

import time

import pytest
from sentinel.policies import (
    AllUp,
    Chain,
    FreshMetrics,
    MinLag,
    MinMetric,
    SelectionPolicy,
    Tagged,
    Threshold,
    ZoneAffinity,
)

from sentinel.collector.config import DEFAULT_INTERVAL
from sentinel.errors import ValidationError
from sentinel.freshness import METRICS_MAX_AGE, STALE_AFTER_INTERVALS
from sentinel.plugins import load_policy
from sentinel.testing.helpers import wait_until
from tests.unit.endpoints import endpoint


def labels(endpoints):
    return [e.label for e in endpoints]


def lagging(*lags, **kwargs):
    return [
        endpoint(f"r{i}", metrics={"replication_lag": lag}, **kwargs) for i, lag in enumerate(lags)
    ]


@pytest.mark.parametrize(
    "policy",
    [
        AllUp(),
        MinLag(cutoff=5),
        MinMetric("queue"),
        Threshold("queue", below=1),
        FreshMetrics(10),
        ZoneAffinity("z1"),
        Tagged(role="replica"),
        AllUp() & MinLag(),
    ],
)
def test_every_policy_accepts_no_endpoints(policy):
    assert tuple(policy([])) == ()


def test_all_up_keeps_only_up():
    assert labels(
        AllUp()([endpoint("a"), endpoint("b", status="down"), endpoint("c", status="draining")])
    ) == ["a"]


def test_min_lag_picks_the_least_lagging_replica_under_the_cutoff():
    assert labels(MinLag(cutoff=10)(lagging(4, 2, 7))) == ["r1"]
    assert labels(MinLag(cutoff=10)(lagging(4))) == ["r0"]


def test_min_lag_returns_nothing_when_every_replica_is_past_the_cutoff():
    assert MinLag(cutoff=10)(lagging(11, 50, 10.5)) == ()


def test_min_lag_keeps_every_tie():
    assert labels(MinLag(cutoff=10)(lagging(3, 1, 1, 9))) == ["r1", "r2"]


def test_min_lag_reads_negative_lag_as_caught_up():
    assert labels(MinLag()(lagging(-2, 0, 1))) == ["r0", "r1"]


def test_missing_non_numeric_and_nan_metrics_are_never_eligible():
    replicas = [
        endpoint("nan", metrics={"replication_lag": float("nan")}),
        endpoint("missing"),
        endpoint("text", metrics={"replication_lag": "unknown"}),
        endpoint("flag", metrics={"replication_lag": True}),
        endpoint("ok", metrics={"replication_lag": 8}),
    ]
    assert labels(MinLag(cutoff=10)(replicas)) == ["ok"]
    assert MinLag(cutoff=10)(replicas[:4]) == ()


def test_stale_metrics_are_not_trusted():
    now = time.time()
    fresh = endpoint("fresh", metrics={"replication_lag": 5}, metrics_at=now - 1)
    stale = endpoint("stale", metrics={"replication_lag": 1}, metrics_at=now - 120)
    assert labels(MinLag(max_age=30)([fresh, stale])) == ["fresh"]
    assert labels(MinLag(max_age=None)([fresh, stale])) == ["stale"]  # the explicit opt-out
    assert labels(FreshMetrics(30)([fresh, stale, endpoint("none")])) == ["fresh"]


def test_metric_policies_distrust_stale_metrics_by_default():
    """Issue 24: an hour-old metric against a fresh one: the fresh replica is chosen though
    the old one has the lower lag (max_age defaulted to None: the old one won for ever)."""
    now = time.time()
    fresh = endpoint("fresh", metrics={"replication_lag": 5, "queue": 5}, metrics_at=now - 1)
    old = endpoint("old", metrics={"replication_lag": 0.1, "queue": 1}, metrics_at=now - 3600)
    assert METRICS_MAX_AGE == STALE_AFTER_INTERVALS * DEFAULT_INTERVAL == 30
    for policy in (MinLag(), MinLag(cutoff=10), MinMetric("queue"), FreshMetrics()):
        assert policy.max_age == METRICS_MAX_AGE
        assert labels(policy((fresh, old))) == ["fresh"], policy
        assert policy.stale((fresh, old)) == (old,)
    assert labels(Threshold("queue", below=10)((fresh, old))) == ["fresh"]
    assert MinLag(max_age=None).stale((fresh, old)) == ()


def test_an_age_limited_answer_is_kept_until_an_endpoint_grows_too_old():
    """The answer for one tuple is reused (no work per warm lookup) until the first fresh
    endpoint crosses the age limit; then it is recomputed."""
    now = time.time()
    ageing = endpoint("ageing", metrics={"replication_lag": 1}, metrics_at=now - 0.7)
    steady = endpoint("steady", metrics={"replication_lag": 2}, metrics_at=now + 60)
    replicas, policy = (ageing, steady), MinLag(max_age=1)
    assert labels(policy(replicas)) == ["ageing"]
    assert policy(replicas) is policy(replicas)  # kept, not recomputed
    wait_until(lambda: labels(policy(replicas)) == ["steady"], timeout=5)


def test_min_metric_on_any_metric():
    relays = [endpoint(f"m{i}", metrics={"queue": q}) for i, q in enumerate([30, 5, 12])]
    assert labels(MinMetric("queue")(relays)) == ["m1"]
    assert labels(MinMetric("queue", cutoff=4)(relays)) == []


def test_threshold_bounds_are_strict():
    relays = [endpoint(f"m{q}", metrics={"queue": q}) for q in (1, 5, 10)]
    assert labels(Threshold("queue", below=10)(relays)) == ["m1", "m5"]
    assert labels(Threshold("queue", above=1)(relays)) == ["m5", "m10"]
    assert labels(Threshold("queue", above=1, below=10)(relays)) == ["m5"]
    with pytest.raises(ValueError):
        Threshold("queue")


def test_zone_affinity_with_and_without_fallback():
    pool = [endpoint("a", zone="z1"), endpoint("b", zone="z2"), endpoint("c")]
    assert labels(ZoneAffinity("z2")(pool)) == ["b"]
    assert labels(ZoneAffinity("z9")(pool)) == ["a", "b", "c"]
    assert ZoneAffinity("z9", fallback=False)(pool) == ()


def test_tagged_matches_every_property():
    pool = [
        endpoint("a", properties={"role": "replica", "ssd": True}),
        endpoint("b", properties={"role": "replica"}),
        endpoint("c", properties={"role": None}),
    ]
    assert labels(Tagged(role="replica")(pool)) == ["a", "b"]
    assert labels(Tagged(role="replica", ssd=True)(pool)) == ["a"]
    assert labels(Tagged(role=None)(pool)) == ["c"]


def test_policies_compose_with_and_and_with_plain_callables():
    far = endpoint("far", zone="z2", metrics={"replication_lag": 0})
    pool = [*lagging(1, 2, 3, zone="z1"), far]
    chained = ZoneAffinity("z1", fallback=False) & MinLag(cutoff=5)
    assert isinstance(chained, Chain)
    assert labels(chained(pool)) == ["r0"]
    assert labels(MinLag()(pool)) == ["far"]
    assert labels((AllUp() & (lambda eps: eps[-1:]))(pool)) == ["far"]


def test_a_user_policy_is_ten_lines():
    class EvenPorts(SelectionPolicy):
        def select(self, endpoints):
            return tuple(e for e in endpoints if e.port % 2 == 0)

    assert labels(EvenPorts()([endpoint("a")])) == ["a"]
    assert "EvenPorts" in repr(EvenPorts())
    assert repr(MinLag(cutoff=5)) == "MinLag(metric='replication_lag', cutoff=5, max_age=30.0)"


def test_pure_policies_reuse_their_answer_for_the_same_tuple_only():
    calls = []

    class Counting(SelectionPolicy):
        pure = True

        def select(self, endpoints):
            calls.append(len(endpoints))
            return tuple(endpoints[:1])

    policy, first, second = Counting(), tuple(lagging(1, 2)), tuple(lagging(3))
    assert policy(first) == policy(first) == first[:1]
    assert calls == [2]
    assert policy(second) == second[:1] and calls == [2, 1]
    assert MinLag(max_age=None).pure and not MinLag().pure and not MinLag(max_age=5).pure
    assert not FreshMetrics(5).pure
    assert (AllUp() & MinLag(max_age=None)).pure and not (AllUp() & (lambda e: e)).pure


def test_a_time_limited_policy_is_evaluated_every_time():
    replicas = tuple(lagging(1, 2))
    policy = MinLag(max_age=30)
    assert labels(policy(replicas)) == ["r0"]
    stale = tuple(
        endpoint(e.label, metrics=dict(e.metrics), metrics_at=time.time() - 60) for e in replicas
    )
    assert policy(stale) == ()


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("min_lag", {"cutoff": "abc"}),
        ("min_lag", {"cutoff": float("nan")}),
        ("min_lag", {"max_age": True}),
    ],
)
def test_a_policy_refuses_arguments_that_are_not_numbers_when_built(name, arguments):
    with pytest.raises(ValidationError, match="must be a"):
        load_policy(name, **arguments)


def test_a_policy_shows_its_arguments_not_its_memo_or_purity():
    pool = tuple(lagging(1, 9))
    policy = MinLag(cutoff=5, max_age=None)  # pure: it keeps a memo once called
    chain = AllUp() & policy
    assert labels(policy(pool)) == ["r0"] and chain(pool) is chain(pool)
    assert repr(policy) == "MinLag(metric='replication_lag', cutoff=5, max_age=None)"
    assert repr(chain) == (
        "Chain(policies=(AllUp(), MinLag(metric='replication_lag', cutoff=5, max_age=None)))"
    )
