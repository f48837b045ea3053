"""A service's failover rule as a value, and the return home's hold-down on values alone
(a stopped clock): the partitions held, when the hold starts again, when it ends."""

from __future__ import annotations

import pytest

from sentinel.cache.return_home import ReturnHome
from sentinel.cache.views import ServiceSnapshot
from sentinel.errors import DecodeError, ValidationError
from sentinel.registry.failover import DEFAULT_RETURN_AFTER, LOCAL_ONLY, Failover
from sentinel.registry.records import ServiceSpec
from tests.unit.endpoints import endpoint

SPEC = ServiceSpec("db", shard_policy="tenants")


def test_the_text_form_the_spec_document_and_the_value_agree():
    rule = Failover.parse("nearest:2,west,north;service=db-ro;warm;return_after=5")
    assert rule == Failover(("west", "north"), 2, "db-ro", True, 5.0)
    assert Failover.from_document(rule.to_document()) == rule
    assert Failover.parse("local") == LOCAL_ONLY and LOCAL_ONLY.local_only
    assert Failover.parse("west").to_document() == {"regions": ["west"]}
    assert rule.describe() == "nearest 2 by round-trip time then west, north as 'db-ro'"
    spec = ServiceSpec("db", failover=rule)
    assert ServiceSpec.from_bytes("db", "/services/db", spec.to_bytes("/services/db")) == spec
    # a spec without a rule is written as before
    assert b"failover" not in ServiceSpec("db").to_bytes("/services/db")
    assert Failover().return_after == DEFAULT_RETURN_AFTER


@pytest.mark.parametrize(
    "text",
    [
        "",
        "nearest:x",
        "west;hot",
        "west;return_after=-1",
        "west;return_after=nan",
        "west,west",
        "nearest:65",
        "we st",
        "west;service=a/b",
    ],
)
def test_a_bad_rule_is_refused(text):
    with pytest.raises(ValidationError):
        Failover.parse(text)


@pytest.mark.parametrize(
    "document",
    [
        [],
        {"regions": "west"},
        {"nearest": True},
        {"warm": 1},
        {"extra": 1},
        {"return_after": 1e9},
        {"regions": [1]},
    ],
)
def test_a_spec_with_a_bad_rule_is_a_decode_error(document):
    import json

    data = json.dumps({"v": 1, "scheme": "http", "failover": document}).encode()
    with pytest.raises(DecodeError):
        ServiceSpec.from_bytes("db", "/services/db", data)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _snapshot(*names: str) -> ServiceSnapshot:
    return ServiceSnapshot.first(SPEC, {n: endpoint(n[3:], n[:2]) for n in names}, {}, frozenset())


def test_a_partition_away_is_held_until_local_has_been_up_for_return_after():
    clock, wakes = Clock(), []
    home = ReturnHome(lambda service, delay: wakes.append((service, delay)), clock)
    empty = _snapshot("p1:a")
    assert home.apply("db", empty) is empty  # nothing away: untouched
    assert home.away("db", "p2", 2.0) and not home.away("db", "p2", 2.0)  # one episode
    assert home.apply("db", empty).held == frozenset()  # nothing up in p2 yet
    back = home.apply("db", _snapshot("p1:a", "p2:b"))
    assert back.held == {"p2"} and back.up["p2"] == () and back.up["p1"] != ()
    assert back.partitions["p2"] != ()  # still listed: explain() names it
    assert wakes == [("db", 2.0)] and home.holding("db", "p2") == 2.0
    clock.now += 1.5
    assert home.apply("db", back).held == {"p2"}  # reapplied on the held one: still held
    # gone again within the hold: the hold starts again from its next return
    assert home.apply("db", _snapshot("p1:a")).held == frozenset()
    clock.now += 10
    again = home.apply("db", _snapshot("p1:a", "p2:b"))
    assert again.held == {"p2"} and home.holding("db", "p2") == 2.0
    clock.now += 2.0
    released = home.apply("db", again)
    assert released.held == frozenset() and [e.label for e in released.up["p2"]] == ["b"]
    assert not home.is_away("db", "p2")
    assert home.apply("db", released) is released


def test_a_change_to_a_held_snapshot_rebuilds_it_whole():
    home = ReturnHome(lambda *_: None, Clock())
    home.away("db", "p2", 5.0)
    held = home.apply("db", _snapshot("p1:a", "p2:b"))
    # an instance added and one removed while held: the index is right when the hold ends
    changed = held.updated(frozenset(), endpoints={"p2:c": endpoint("c", "p2"), "p2:b": None})
    assert changed.held == {"p2"} and changed.up["p2"] == ()
    assert [e.label for e in changed.partitions["p2"]] == ["c"]
    home.forget("db")
    assert [e.label for e in home.apply("db", changed).up["p2"]] == ["c"]


def test_a_new_rule_sets_the_holds_wait_and_a_local_only_rule_ends_them():
    clock = Clock()
    home = ReturnHome(lambda *_: None, clock)
    home.away("db", "p2", 60.0)
    held = home.apply("db", _snapshot("p1:a", "p2:b"))
    assert held.held == {"p2"} and home.holding("db", "p2") == 60.0
    home.rule_changed("db", 5.0)  # another rule naming regions: its return_after counts
    assert home.holding("db", "p2") == 5.0
    clock.now += 4.0
    assert home.apply("db", held).held == {"p2"}
    clock.now += 1.0
    assert home.apply("db", held).held == frozenset()
    home.away("db", "p2", 60.0)
    held = home.apply("db", _snapshot("p1:a", "p2:b"))
    assert held.held == {"p2"}
    home.rule_changed("db", None)  # no other region: nothing to wait for
    assert not home.is_away("db", "p2") and home.apply("db", held).held == frozenset()
    home.rule_changed("other", 5.0)  # a service never away: nothing to change
    assert not home.is_away("other", None)
