"""Suggestions for a mistyped name: only names that exist, the fewest typing mistakes away."""

from __future__ import annotations

import pytest

from sentinel.suggestions import close_matches, did_you_mean, typos


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
