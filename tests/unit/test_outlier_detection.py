"""Passive ejection (sentinel.feedback): the rules that eject, the ejection time, the cap, panic,
and the lookup path's memo. No server, no sleep: time is a ManualClock."""

import collections
import logging
import math
import random
import sys
import threading

import pytest

from sentinel.feedback import InstanceFeedback, OutlierDetection
from sentinel.testing.helpers import ManualClock, wait_until
from tests.unit.endpoints import endpoint


def fleet(size, partition="p1"):
    return tuple(endpoint(f"e{i}", partition) for i in range(size))


def fail(feedback, instance, times=3):
    for _ in range(times):
        feedback.report(instance, ok=False)


def test_consecutive_failures_eject_and_a_success_resets_the_streak():
    clock = ManualClock()
    feedback = InstanceFeedback(clock=clock)
    ten = fleet(10)
    fail(feedback, ten[0], 2)
    feedback.report(ten[0], ok=True)
    fail(feedback, ten[0], 2)
    assert not feedback.is_down(ten[0])  # 2, a success, 2: never 3 in a row
    feedback.report(ten[0], ok=False)
    assert feedback.is_down(ten[0]) and not feedback.is_down(ten[1])
    assert feedback.admit(ten) == ten[1:]


def test_a_low_success_rate_ejects_once_enough_calls_are_counted():
    clock = ManualClock()
    detection = OutlierDetection(consecutive_failures=100, min_requests=20)
    feedback = InstanceFeedback(detection, clock=clock)
    flaky = fleet(10)[4]
    rng = random.Random(41)
    outcomes = [rng.random() < 0.3 for _ in range(40)]  # 30 % succeed, seeded
    assert sum(outcomes[:19]) * 100 < 50 * 19  # under the bound, but too few calls yet
    for ok in outcomes[:19]:
        feedback.report(flaky, ok=ok)
    assert not feedback.is_down(flaky)
    for ok in outcomes[19:]:
        feedback.report(flaky, ok=ok)
        if feedback.is_down(flaky):
            break
    assert feedback.is_down(flaky)
    # A healthy rate over the same volume never ejects; nor does a window that has passed.
    steady = fleet(10)[5]
    for i in range(200):
        feedback.report(steady, ok=i % 10 != 0)  # 90 % succeed
    assert not feedback.is_down(steady)


def test_the_ejection_time_grows_with_each_ejection_in_a_row_is_capped_and_decays():
    clock = ManualClock()
    detection = OutlierDetection(base_ejection_time=30, max_ejection_time=75, interval=10)
    feedback = InstanceFeedback(detection, clock=clock)
    bad = fleet(10)[0]
    for expected in (30, 60, 75, 75):  # base times the ejections in a row, at most 75
        fail(feedback, bad)
        clock.advance(expected - 0.1)
        assert feedback.is_down(bad), expected
        clock.advance(0.1)
        assert not feedback.is_down(bad), expected
    # Healthy for three intervals: the multiplier (4) falls by three, so the next is 2 times 30.
    clock.advance(30)
    fail(feedback, bad)
    clock.advance(59.9)
    assert feedback.is_down(bad)
    clock.advance(0.1)
    assert not feedback.is_down(bad)


def test_at_most_max_ejection_percent_is_ejected_the_earliest_first():
    clock = ManualClock()
    feedback = InstanceFeedback(OutlierDetection(max_ejection_percent=20), clock=clock)
    ten = fleet(10)
    for i in (7, 2, 5):  # ejected in this order
        fail(feedback, ten[i])
        clock.advance(1)
    verdict = feedback.verdict(ten)
    assert [e.label for e in verdict.ejected] == ["e2", "e7"]  # 20 % of 10, in fleet order
    assert [e.label for e in verdict.spared] == ["e5"]  # over the cap: served
    assert not verdict.panic and ten[5] in verdict.admitted and len(verdict.admitted) == 8
    # A partition smaller than the share still ejects one; 0 % ejects none.
    assert [e.label for e in feedback.verdict(ten[6:9]).ejected] == ["e7"]
    none = InstanceFeedback(OutlierDetection(max_ejection_percent=0), clock=clock)
    fail(none, ten[0])
    assert none.admit(ten) is ten


def test_every_instance_failing_is_panic_served_whole_and_said_once_per_episode(caplog):
    clock = ManualClock()
    feedback = InstanceFeedback(clock=clock)
    ten = fleet(10)
    with caplog.at_level(logging.WARNING, logger="sentinel.feedback"):
        for instance in ten:
            fail(feedback, instance)
        for _ in range(1000):
            assert feedback.admit(ten) is ten  # every up instance, not a copy
        clock.advance(31)  # every ejection has ended
        assert feedback.admit(ten) is ten
        assert feedback.verdict(ten).panic is False
    assert feedback.panic_episodes == {"db": 1}
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("panic in db partition p1: 10 of 10 up instances are ejected")
    assert said[1].startswith("panic over in db partition p1")
    # A second episode is a second count, and a partition of another service is its own.
    for instance in ten:
        fail(feedback, instance)
    other = tuple(endpoint(f"o{i}", service="api") for i in range(2))
    for instance in other:
        fail(feedback, instance)
    assert feedback.verdict(ten).panic and feedback.verdict(other).panic
    assert feedback.panic_episodes == {"db": 2, "api": 1}
    assert feedback.census([ten, other]) == (0, 2)


def test_the_partition_outside_panic_keeps_its_ejections():
    clock = ManualClock()
    feedback = InstanceFeedback(clock=clock)
    four = fleet(4)
    fail(feedback, four[0])
    fail(feedback, four[1])  # 2 of 4 flagged: half left, not under the 50 % threshold
    verdict = feedback.verdict(four)
    assert not verdict.panic and len(verdict.ejected) == 1 and len(verdict.spared) == 1
    fail(feedback, four[2])  # 1 of 4 left: panic
    assert feedback.verdict(four).panic
    assert feedback.census([four]) == (0, 1)


def test_a_warm_admit_is_the_decision_made_once_per_change():
    clock = ManualClock()
    feedback = InstanceFeedback(clock=clock)
    ten, other = fleet(10), fleet(5, "p2")
    fail(feedback, ten[3])
    first = feedback.admit(ten)
    assert feedback.admit(ten) is first  # the kept decision, not a new tuple
    assert feedback.admit(other) is other  # a partition without ejection: its own tuple
    clock.advance(30)  # the ejection ends: decided again, with it back
    assert feedback.admit(ten) == ten
    # An equal tuple that is another object (an older snapshot's) is decided on its own.
    fail(feedback, ten[3])
    assert feedback.admit(tuple(ten)) == feedback.admit(ten)


def test_the_old_rule_is_one_setting_away():
    """max_ejection_percent=100 and panic_threshold=0: every failing instance is skipped, as
    before the cap (and a partition can be left with none)."""
    feedback = InstanceFeedback(
        OutlierDetection(max_ejection_percent=100, panic_threshold=0), clock=ManualClock()
    )
    ten = fleet(10)
    for instance in ten:
        fail(feedback, instance)
    assert feedback.admit(ten) == ()


def test_lookups_racing_reports_see_whole_decisions_and_each_episode_once(caplog):
    """Four threads look up without a lock while the main thread ejects every instance and time
    passes: each lookup gets a non-empty part of the partition, and the panic in between is
    counted and said once, whichever thread sees it first (thread switches forced often)."""
    clock = ManualClock()
    feedback = InstanceFeedback(clock=clock)
    ten = fleet(10)
    stop, failures, lookups = threading.Event(), [], collections.Counter()

    labels = {e.label for e in ten}

    def look(name):
        while not stop.is_set():
            try:
                admitted = feedback.admit(ten)
                if not admitted or not {e.label for e in admitted} <= labels:
                    failures.append(admitted)
            except Exception as exc:  # a thread's error, shown by the assertion below
                failures.append(exc)
                return
            lookups[name] += 1

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=look, args=(i,)) for i in range(4)]
    try:
        with caplog.at_level(logging.WARNING, logger="sentinel.feedback"):
            for thread in threads:
                thread.start()
            for instance in ten:
                fail(feedback, instance)
            assert wait_until(lambda: feedback.panic_episodes == {"db": 1}, timeout=30)
            clock.advance(31)
            said = caplog.records
            assert wait_until(
                lambda: any(r.getMessage().startswith("panic over") for r in said), timeout=30
            )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        sys.setswitchinterval(switch)
    assert failures == [] and len(lookups) == 4
    assert feedback.panic_episodes == {"db": 1}
    assert [r.getMessage().split(" in db")[0] for r in caplog.records] == ["panic", "panic over"]


def test_records_of_instances_gone_for_good_are_forgotten_and_no_ejection_changes():
    # Issue 53: a record per instance ever reported grew for months of churn. A record that
    # holds nothing a new one would not goes once its instance is unreported for ten minutes;
    # one still ejected stays, and its next ejection still counts the one before.
    clock = ManualClock()
    detection = OutlierDetection(base_ejection_time=700, max_ejection_time=5000)
    feedback = InstanceFeedback(detection, clock=clock)
    steady, bad = endpoint("steady", "p1"), endpoint("bad", "p1")
    fail(feedback, bad)  # ejected for 700 s, longer than the records' horizon
    clock.advance(650)
    feedback.report(steady, latency=0.01)  # a sweep: bad is unreported but ejected
    assert feedback.is_down(bad)
    clock.advance(55)
    assert not feedback.is_down(bad)
    fail(feedback, bad)  # the second ejection in a row: twice as long
    clock.advance(1399)
    assert feedback.is_down(bad)
    clock.advance(1)
    assert not feedback.is_down(bad)
    for hour in range(1000):  # an instance an hour, reported once, failing or not, then gone
        feedback.report(endpoint(f"gone{hour}", "p1"), ok=hour % 2 == 0, latency=0.02)
        feedback.report(steady, latency=0.01)
        clock.advance(3600)
    assert len(feedback._instances) <= 3  # steady, the last one gone, at most one more
    assert feedback.latency(endpoint("gone0", "p1")) is None
    # The last one is still remembered, its estimate decayed for the hour since its report.
    decayed = 0.02 * math.exp(-3600 / feedback.decay_time)
    assert feedback.latency(endpoint("gone999", "p1")) == pytest.approx(decayed, rel=1e-9)
