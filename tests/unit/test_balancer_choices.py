"""What each built-in balancer chooses, on exact values: nginx's own sequence, the period cap of
smooth weighted round robin, the weights a weighted balancer sees, the pairs the power of two
choices compares, seeds that reproduce a run, and keys spread by rendezvous hashing (no
server)."""

import collections
import itertools

import pytest
from sentinel.balancers import (
    PowerOfTwoChoices,
    Random,
    SmoothWeightedRoundRobin,
    Sticky,
    WeightedRandom,
)

from sentinel.rendezvous import rendezvous_score
from tests.unit.endpoints import endpoint


def pool(*weights):
    return tuple(endpoint(f"e{i}", weight=w) for i, w in enumerate(weights))


def picks(balancer, endpoints, n):
    return [balancer.pick(endpoints).label for _ in range(n)]


def test_smooth_wrr_gives_nginxs_own_sequence():
    # The example of the nginx change that brought the algorithm: weights { 5, 1, 1 } give
    # { a, a, b, a, c, a, a } (a tie goes to the first).
    endpoints = tuple(endpoint(label, weight=w) for label, w in zip("abc", (5, 1, 1), strict=True))
    assert picks(SmoothWeightedRoundRobin(), endpoints, 14) == list("aabacaa" * 2)


def test_smooth_wrr_never_picks_a_zero_weight_among_others():
    assert collections.Counter(picks(SmoothWeightedRoundRobin(), pool(1, 0, 2), 30)) == {
        "e0": 10,
        "e2": 20,
    }


def test_smooth_wrr_keeps_large_integer_weights_exact():
    # 600 and 601 share no factor: one period is 1201 picks, no scaling needed.
    sequence = picks(SmoothWeightedRoundRobin(), pool(600, 601), 2402)
    assert sequence[:1201] == sequence[1201:]
    assert collections.Counter(sequence[:1201]) == {"e0": 600, "e1": 601}


def test_a_period_over_100000_picks_is_scaled_down_to_100000():
    sequence = picks(SmoothWeightedRoundRobin(), pool(100_000, 1), 200_000)
    assert sequence[:100_000] == sequence[100_000:]  # the period is exactly 100,000
    assert collections.Counter(sequence[:100_000]) == {"e0": 99_999, "e1": 1}


def test_scaling_keeps_every_non_zero_weight_at_least_once_per_period():
    # 1,000,000 : 1 scaled to 100,000 picks would round the small weight to 0; it stays 1.
    sequence = picks(SmoothWeightedRoundRobin(), pool(1_000_000, 1, 0), 200_002)
    assert sequence[:100_001] == sequence[100_001:]
    assert collections.Counter(sequence[:100_001]) == {"e0": 100_000, "e1": 1}


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ((0.25, 0.5), [0.25, 0.5]),  # a sum under 1 is still a sum over 0
        ((2, 3), [2.0, 3.0]),
        ((0, 0), [1.0, 1.0]),  # all zero: all equal
    ],
)
def test_weighted_random_sees_the_static_weights(weights, expected):
    assert WeightedRandom().weights(pool(*weights)) == expected


def test_weighted_random_by_metric_divides_by_one_plus_the_load():
    relays = (
        endpoint("int", weight=2, metrics={"queue": 3}),
        endpoint("float", metrics={"queue": 0.25}),
        endpoint("negative", metrics={"queue": -5}),  # read as no load
    )
    assert WeightedRandom("queue").weights(relays) == [0.5, 0.8, 1.0]
    # Every weight small: the sum is under 1 and the weights are kept as they are.
    busy = (endpoint("a", metrics={"queue": 9}), endpoint("b", metrics={"queue": 3}))
    assert WeightedRandom("queue").weights(busy) == [0.1, 0.25]


def test_weighted_random_with_no_endpoint_reporting_the_metric_uses_the_static_weights():
    assert WeightedRandom("queue").weights(pool(2, 3)) == [2.0, 3.0]


def test_power_of_two_reads_a_float_metric_and_no_load_as_zero():
    measured = endpoint("m", metrics={"queue": 0.5})
    assert PowerOfTwoChoices("queue").load(measured) == 0.5
    assert PowerOfTwoChoices().load(measured) == 0.0  # no metric, no feedback


def test_power_of_two_compares_two_distinct_endpoints_and_every_pair_comes_up():
    pairs = collections.Counter()

    class Recording(PowerOfTwoChoices):
        def pick(self, endpoints):
            self.seen = []
            super().pick(endpoints)
            pairs[frozenset(self.seen)] += 1

        def load(self, endpoint):
            self.seen.append(endpoint.label)
            return 0.0

    balancer, endpoints = Recording(seed=11), pool(1, 1, 1, 1, 1)
    for _ in range(2000):
        balancer.pick(endpoints)
    expected = {
        frozenset(pair) for pair in itertools.combinations(["e0", "e1", "e2", "e3", "e4"], 2)
    }
    assert set(pairs) == expected  # never one endpoint against itself


@pytest.mark.parametrize(
    "build",
    [
        lambda: Random(seed=21),
        lambda: WeightedRandom(seed=21),
        lambda: WeightedRandom("queue", seed=21),
        lambda: PowerOfTwoChoices(seed=21),
    ],
)
def test_the_same_seed_makes_the_same_choices(build):
    endpoints = pool(1, 2, 3, 4, 5, 6)
    assert picks(build(), endpoints, 100) == picks(build(), endpoints, 100)


def test_sticky_sends_a_key_to_its_highest_rendezvous_score_and_spreads_keys():
    endpoints = pool(1, 1, 1, 1)
    chosen = {}
    for key in (f"tenant-{i}" for i in range(200)):
        label = Sticky(key).pick(endpoints).label
        best = max(endpoints, key=lambda e: rendezvous_score(key, e.name))
        assert label == best.label
        chosen[key] = label
    assert set(chosen.values()) == {"e0", "e1", "e2", "e3"}
