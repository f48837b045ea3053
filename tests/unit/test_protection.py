"""Protection from mass loss on values alone: when it starts, what it serves, its bounds in
count and time, and what a lookup pays (sentinel.cache.protection)."""

import threading
import time

import pytest

from sentinel.cache.protection import (
    MassLossProtection,
    Protection,
    Timers,
    eligible_verdict,
    unprotected_note,
)
from sentinel.cache.stats import CacheStats
from sentinel.cache.views import ServiceSnapshot
from sentinel.errors import ValidationError
from sentinel.registry.records import ServiceSpec
from tests.unit.endpoints import endpoint

SPEC = ServiceSpec("db", mark_departures=True)  # only such a service is protected


def _snapshot(labels, down=(), spec=SPEC):
    endpoints = {
        f"p1:{label}": endpoint(label, status="down" if label in down else "up") for label in labels
    }
    return ServiceSnapshot.first(spec, endpoints, {}, frozenset())


def _without(snapshot, *labels):
    return snapshot.updated(snapshot.invalid, endpoints={f"p1:{label}": None for label in labels})


class Clock:
    def __init__(self, monkeypatch):
        self.now = 1000.0
        monkeypatch.setattr(time, "monotonic", lambda: self.now)


@pytest.fixture
def wakes():
    return []


@pytest.fixture
def stats():
    return CacheStats()


def _protection(stats, wakes, **config):
    return Protection(MassLossProtection(**config), stats, lambda s, d: wakes.append((s, d)))


def test_losses_up_to_the_share_are_dropped_as_ever(stats, wakes):
    protection = _protection(stats, wakes, share=0.5)
    old = _snapshot("abcd")
    new = protection.apply("db", old, _without(old, "a", "b"), lost=("p1:a", "p1:b"))
    assert [e.label for e in new.up[None]] == ["c", "d"] and not new.protected  # 2 of 4: not more
    assert stats.protection_episodes == 0 and stats.protected == {}
    assert wakes == [("db", 10.0)]  # to forget them when the window ends


def test_more_than_the_share_lost_unmarked_is_served_marked_in_the_snapshot(stats, wakes):
    protection = _protection(stats, wakes, share=0.5, hold=30.0)
    old = _snapshot("abcd", down="d")
    new = protection.apply("db", old, _without(old, "a", "b", "d"), lost=("p1:a", "p1:b", "p1:d"))
    # In the indexes a lookup reads (no per-lookup work), never in the registry's list.
    assert [e.label for e in new.partitions[None]] == ["a", "b", "c", "d"]
    assert [(e.label, e.protected) for e in new.up["p1"]] == [
        ("a", True),
        ("b", True),
        ("c", False),
    ]  # a drained or down instance stays out, protected or not
    assert set(new.endpoints) == {"p1:c"} and set(new.protected) == {"p1:a", "p1:b", "p1:d"}
    assert stats.protection_episodes == 1 and stats.protected == {"db": 3}
    assert eligible_verdict(new.protected["p1:a"]).startswith("eligible, protected")
    assert eligible_verdict(new.endpoints["p1:c"]) == "eligible"


def test_marked_deletions_never_start_or_join_protection(stats, wakes):
    protection = _protection(stats, wakes, share=0.5)
    old = _snapshot("abcd")
    new = protection.apply("db", old, _without(old, "a", "b", "c"))  # deregistrations
    assert [e.label for e in new.up[None]] == ["d"] and not new.protected
    assert stats.protection_episodes == 0 and wakes == []


def test_a_protected_instance_registered_again_is_the_listed_one(stats, wakes):
    protection = _protection(stats, wakes, share=0.5)
    old = _snapshot("abc")
    held = protection.apply("db", old, _without(old, "a", "b"), lost=("p1:a", "p1:b"))
    back = endpoint("a", weight=2)
    new = protection.apply("db", held, held.updated(held.invalid, endpoints={"p1:a": back}))
    assert new.endpoints["p1:a"] == back and set(new.protected) == {"p1:b"}
    assert [e.label for e in new.up[None]] == ["a", "b", "c"]
    came = protection.apply("db", new, new.updated(new.invalid, endpoints={"p1:b": endpoint("b")}))
    assert not came.protected and not any(e.protected for e in came.up[None])
    assert stats.protected == {} and stats.protection_episodes == 1


def test_the_hold_bounds_each_instance_from_its_loss(stats, wakes, monkeypatch):
    clock = Clock(monkeypatch)
    protection = _protection(stats, wakes, share=0.5, window=10.0, hold=30.0)
    old = _snapshot("abc")
    held = protection.apply("db", old, _without(old, "a", "b"), lost=("p1:a", "p1:b"))
    assert wakes[-1] == ("db", 30.0)
    clock.now += 29.9
    assert set(protection.apply("db", held, held).protected) == {"p1:a", "p1:b"}
    clock.now += 0.1
    after = protection.apply("db", held, held)
    assert not after.protected and [e.label for e in after.up[None]] == ["c"]
    assert stats.protected == {}


def test_losses_spread_wider_than_the_window_never_add_up(stats, wakes, monkeypatch):
    clock = Clock(monkeypatch)
    protection = _protection(stats, wakes, share=0.5, window=10.0)
    current = _snapshot("abcd")
    for label in "abc":  # one crash every 11 s: never more than one loss in the window
        current = protection.apply("db", current, _without(current, label), lost=(f"p1:{label}",))
        clock.now += 11.0
        current = protection.apply("db", current, current)
    assert not current.protected and stats.protection_episodes == 0


def test_forgetting_a_service_drops_its_state_and_its_gauge(stats, wakes):
    protection = _protection(stats, wakes, share=0.5)
    old = _snapshot("abc")
    protection.apply("db", old, _without(old, "a", "b"), lost=("p1:a", "p1:b"))
    assert stats.protected == {"db": 2}
    protection.forget("db")
    assert stats.protected == {}


def test_a_service_whose_spec_does_not_mark_is_never_protected(stats, wakes):
    # Its publishers delete plainly: every vanish looks unmarked, deregistrations included.
    protection = _protection(stats, wakes, share=0.5)
    old = _snapshot("abcd", spec=ServiceSpec("db"))
    lost = ("p1:a", "p1:b", "p1:c")
    new = protection.apply("db", old, _without(old, "a", "b", "c"), lost=lost)
    assert [e.label for e in new.up[None]] == ["d"] and not new.protected
    assert stats.protection_episodes == 0 and stats.protected == {} and wakes == []
    # A spec that stops marking in an episode ends it: nothing is held from then on.
    old = _snapshot("abcd")
    held = protection.apply("db", old, _without(old, "a", "b", "c"), lost=lost)
    assert set(held.protected) == set(lost) and stats.protected == {"db": 3}
    plain = protection.apply("db", held, held.rebuilt(spec=ServiceSpec("db")))
    assert not plain.protected and [e.label for e in plain.up[None]] == ["d"]
    assert stats.protected == {}


def test_explain_says_when_configured_protection_does_not_apply():
    config = MassLossProtection()
    note = unprotected_note(config, ServiceSpec("db"))
    assert note is not None and "ensure_service('db', mark_departures=True)" in note
    assert unprotected_note(config, SPEC) is None  # it applies
    assert unprotected_note(None, ServiceSpec("db")) is None  # not configured


def test_nothing_lost_and_nothing_held_returns_the_snapshot_itself(stats, wakes):
    protection = _protection(stats, wakes)
    old = _snapshot("ab")
    new = _without(old, "a")
    assert protection.apply("db", old, new) is new


@pytest.mark.parametrize(
    ("field", "value"),
    [("share", 1.0), ("share", -0.1), ("window", 0), ("hold", -1), ("hold", True)],
)
def test_settings_out_of_range_are_refused(field, value):
    with pytest.raises(ValidationError, match=field):
        MassLossProtection(**{field: value})


def test_a_wake_up_for_the_same_time_is_one_timer_and_close_cancels_them():
    fired = threading.Event()
    timers = Timers(lambda service: fired.set())
    timers.wake("db", 60.0)
    first = timers._timers["db"][0]
    timers.wake("db", 60.0)  # a change during the episode: the hold ends when it did
    assert timers._timers["db"][0] is first
    timers.wake("db", 0.0)  # another time: replaces it, and fires
    assert first.finished.is_set() and fired.wait(10)
    timers.wake("other", 60.0)
    pending = timers._timers["other"][0]
    timers.close()
    assert pending.finished.is_set() and not timers._timers
    timers.wake("late", 0.0)  # after close: ignored
    assert not timers._timers
