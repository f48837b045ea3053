"""Each built-in policy at the edge of what it accepts: a value at its bound, a metric exactly
``max_age`` old, an ineligible instance before eligible ones, a property that is absent rather
than ``None``, and the error that names a bad argument (no server)."""

import math
import types

import pytest
from sentinel.policies import FreshMetrics, MinLag, MinMetric, Tagged, Threshold, metrics

from tests.unit.endpoints import endpoint

NOW = 1_000_000.0  # a fixed clock: every age below is exact in binary floating point


def labels(endpoints):
    return [e.label for e in endpoints]


def queue(label, value, measured_at=NOW):
    return endpoint(label, metrics={"queue": value}, metrics_at=measured_at)


@pytest.fixture
def frozen_clock(monkeypatch):
    """The policies' clock stopped at NOW (their module reads ``time.time()``)."""
    monkeypatch.setattr(metrics, "time", types.SimpleNamespace(time=lambda: NOW))


def test_a_float_metric_is_compared_like_an_int():
    pool = (queue("int", 1), queue("half", 0.5), queue("big", 2.5))
    assert labels(MinMetric("queue", max_age=None)(pool)) == ["half"]
    assert labels(MinLag(metric="queue", max_age=None)(pool)) == ["half"]
    assert labels(Threshold("queue", above=0.75, max_age=None)(pool)) == ["int", "big"]


def test_a_value_equal_to_the_cutoff_is_eligible():
    pool = (queue("at", 10), queue("over", 10.5))
    assert labels(MinMetric("queue", cutoff=10, max_age=None)(pool)) == ["at"]
    assert labels(MinLag(cutoff=10, metric="queue", max_age=None)(pool)) == ["at"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (Threshold("queue", below=10, max_age=None), ["low", "mid"]),
        (Threshold("queue", above=1, max_age=None), ["high", "mid"]),
        (Threshold("queue", above=1, below=10, max_age=None), ["mid"]),
    ],
)
def test_threshold_skips_an_ineligible_instance_and_goes_on(policy, expected):
    # Each refused kind comes before an eligible one: no metric, too high, too low.
    pool = (endpoint("none"), queue("high", 10), queue("low", 1), queue("mid", 5))
    assert labels(policy(pool)) == expected


def test_an_endpoint_measured_exactly_max_age_ago_is_still_fresh(frozen_clock):
    edge = queue("edge", 1, measured_at=NOW - 30)
    older = queue("older", 0, measured_at=NOW - 30.5)
    for policy in (MinMetric("queue", max_age=30), FreshMetrics(30)):
        assert labels(policy((edge, older))) == ["edge"]
        assert labels(policy.select((edge, older))) == ["edge"]
        assert policy.stale((edge, older)) == (older,)
    assert labels(Threshold("queue", below=5, max_age=30)((edge, older))) == ["edge"]


def test_stale_judges_at_the_time_it_is_given():
    measured = queue("a", 1, measured_at=NOW)
    policy = MinMetric("queue", max_age=30)
    assert policy.stale((measured,), now=NOW + 30) == ()
    assert policy.stale((measured,), now=NOW + 30.5) == (measured,)
    assert policy.stale((endpoint("never"),), now=NOW + 3600) == ()  # nothing to distrust


def test_select_is_the_answer_at_this_moment(frozen_clock):
    fresh, stale = queue("fresh", 5, NOW - 1), queue("stale", 1, NOW - 60)
    assert MinMetric("queue", max_age=30).select((fresh, stale)) == (fresh,)
    assert MinLag(metric="queue", max_age=None).select((fresh, stale)) == (stale,)


def test_an_age_limited_memo_holds_at_most_64_tuples(frozen_clock):
    policy = MinMetric("queue", max_age=30)
    pools = [(queue(f"e{i}", i),) for i in range(65)]
    for pool in pools[:64]:
        assert policy(pool) == pool
    assert len(policy._windows) == 64
    assert policy(pools[64]) == pools[64]
    assert len(policy._windows) == 1  # full: cleared before the 65th is kept


def test_tagged_none_matches_a_property_set_to_none_not_an_absent_one():
    pool = (
        endpoint("set", properties={"role": None}),
        endpoint("absent", properties={"ssd": True}),
        endpoint("other", properties={"role": "replica"}),
    )
    assert labels(Tagged(role=None)(pool)) == ["set"]
    assert labels(Tagged(ssd=True, role=None)(pool)) == []


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: MinLag(cutoff="abc"), TypeError, "cutoff must be a number, got 'abc'"),
        (lambda: MinMetric("q", cutoff=math.inf), ValueError, "cutoff must be a finite number"),
        (lambda: MinLag(max_age=True), TypeError, "max_age must be a number, got True"),
        (lambda: FreshMetrics(None), TypeError, "max_age must be a number, got None"),
        (lambda: Threshold("q", below="x"), TypeError, "below must be a number, got 'x'"),
        (lambda: Threshold("q", above=math.nan), ValueError, "above must be a finite number"),
        (lambda: Threshold("q"), ValueError, "Threshold needs below=, above= or both"),
    ],
)
def test_a_bad_argument_is_named_when_the_policy_is_built(build, error, message):
    with pytest.raises(error) as info:
        build()
    assert str(info.value).startswith(message)
