"""The "write your own" examples in docs/policies.md work as printed."""

import re
from pathlib import Path

from tests.unit.endpoints import endpoint

DOC = Path(__file__).resolve().parents[2] / "docs" / "policies.md"


def example(class_name):
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        if f"class {class_name}" in block:
            namespace = {}
            exec(block, namespace)
            return namespace[class_name]
    raise AssertionError(f"docs/policies.md has no example of {class_name}")


def test_the_policy_example_filters_and_is_reused():
    WithCapacity = example("WithCapacity")
    pool = (
        endpoint("a", metrics={"free_slots": 1}),
        endpoint("b", metrics={"free_slots": 4}),
        endpoint("c"),
    )
    policy = WithCapacity(2)
    assert [e.label for e in policy(pool)] == ["b"]
    assert policy(pool) is policy(pool)  # pure: the answer is kept for the same tuple


def test_the_balancer_example_picks_the_lowest_label():
    LowestLabelFirst = example("LowestLabelFirst")
    assert LowestLabelFirst().pick([endpoint("b"), endpoint("a")]).label == "a"
