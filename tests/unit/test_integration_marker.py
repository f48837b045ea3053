"""A test that uses or starts a real server without the ``integration`` marker fails, so that
``-m "not integration"`` runs without ZooKeeper or PostgreSQL (tests/conftest.py's check)."""

from __future__ import annotations

import pytest

# The inner suite takes the check's hooks from tests/conftest.py; its `zookeeper` fixture is a
# stand-in (the check fails an unmarked test before its fixtures are set up), and its unmarked
# start is stopped by the check before a server process is launched.
SUITE = """
import pytest
from sentinel.testing.zookeeper import LocalZooKeeper

@pytest.fixture
def zookeeper():
    return "stand-in"

@pytest.fixture
def through_another(zookeeper):
    return zookeeper

def test_uses_the_fixture_unmarked(zookeeper):
    pass

def test_uses_it_through_another_fixture_unmarked(through_another):
    pass

@pytest.mark.integration
def test_uses_the_fixture_marked(zookeeper):
    assert zookeeper == "stand-in"

def test_starts_a_server_unmarked():
    server = LocalZooKeeper()
    try:
        server.start()
    finally:
        server.stop()
"""


def test_a_server_test_without_the_integration_marker_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "from tests.conftest import pytest_runtest_protocol, pytest_runtest_setup  # noqa: F401"
    )
    pytester.makeini("[pytest]\nmarkers =\n    integration: real servers\n")
    pytester.makepyfile(test_servers=SUITE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1, errors=2)  # errors: failed at set-up
    result.stdout.fnmatch_lines_random(
        [
            "*test_uses_the_fixture_unmarked uses the zookeeper fixture but has no integration"
            " marker*",
            "*test_uses_it_through_another_fixture_unmarked uses the zookeeper fixture but has no*",
            "*test_starts_a_server_unmarked starts a ZooKeeperServer but has no integration*",
        ]
    )
