"""Suggestions for a mistyped name: only names that exist, the fewest typing mistakes away."""

from __future__ import annotations

import pytest

from sentinel.errors import NamespaceNotFound
from sentinel.suggestions import close_matches, did_you_mean, likely_typos, typos


@pytest.mark.parametrize(
    ("a", "b", "mistakes"),
    [
        ("esat", "east", 1),  # two neighbours swapped
        ("esat", "west", 2),
        ("kitten", "sitting", 3),
        ("", "abc", 3),
        ("abc", "", 3),
        ("same", "same", 0),
        ("/sentinal", "/sentinel", 1),
    ],
)
def test_typos_counts_each_typing_mistake_once(a, b, mistakes):
    assert typos(a, b) == typos(b, a) == mistakes


def test_close_matches_keeps_only_the_closest_and_never_the_name_itself():
    assert close_matches("esat", ["east", "west"]) == ("east",)
    assert close_matches("wset", ["east", "west", "wset"]) == ("west",)
    assert close_matches("/sentinal", ["/sentinel", "/zookeeper", "/kafka"]) == ("/sentinel",)
    assert close_matches("zzzz", ["east", "west"]) == ()
    assert close_matches("east", []) == ()
    assert did_you_mean(("a", "b")) == "did you mean 'a' or 'b'?" and did_you_mean(()) == ""


def test_a_likely_typo_is_a_mistake_per_four_characters_at_most():
    assert likely_typos("sentinal", ["sentinel", "kafka"]) == ("sentinel",)
    assert likely_typos("orders-new", ["orders"]) == ()  # a name of its own
    assert likely_typos("b", ["a"]) == ()


def test_a_missing_namespace_suggests_the_one_meant_or_else_creating_it():
    """Creating it is suggested only when no namespace beside it looks like what was meant;
    when none could be listed, after the advice to check the name."""
    typo = NamespaceNotFound("/sentinal", "zk:2181", ["/sentinel", "/kafka", "/other/sentinel"])
    assert typo.suggestions == ("/sentinel",)
    assert str(typo) == (
        "namespace /sentinal does not exist on ZooKeeper zk:2181 (reading never creates it); "
        "did you mean '/sentinel'?"
    )
    create = "create it with `sentinel init --zk zk:2181 --namespace /staging`"
    own = NamespaceNotFound("/staging", "zk:2181", ["/sentinel"])
    assert own.suggestions == () and str(own).endswith(f"creates it): {create}")
    unlisted = NamespaceNotFound("/staging", "zk:2181")
    assert "check the name" in str(unlisted) and str(unlisted).endswith(create)
    nested = NamespaceNotFound("/team/sentinal", "zk:2181", ["/team/sentinel", "/sentinel"])
    assert nested.suggestions == ("/team/sentinel",)
