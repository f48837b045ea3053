"""kazoo's own test suite with Sentinel's transport and protocol extension on every client
(``harness.py``): each test ends as it does with stock kazoo (``stock.txt``).

The suite runs in shards (:func:`harness.shards`): the tests that need kazoo's three members
on three, every other on one, one pytest test each, so that xdist workers run them side by
side; each shard's ensemble takes its ports from a range of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kazoo_suite import harness, testids

SHARDS = harness.shards()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(harness.RUN_TIMEOUT * 2)
@pytest.mark.parametrize("shard", range(len(SHARDS)), ids=lambda shard: f"shard{shard}")
def test_kazoos_suite_ends_with_the_extension_as_it_does_stock(shard, tmp_path):
    tests = SHARDS[shard]
    ports = harness.port_range(shard, len(SHARDS))
    members = harness.ensemble_size(tests)
    leave_out = harness.left_out(tests)
    found, retried = harness.run_with_retries(
        "ext", tmp_path, tests, ports=ports, members=members, leave_out=leave_out
    )
    print(f"kazoo {harness.kazoo_version()}, ext mode, {members} member(s), {', '.join(tests)}")
    print("left out:", ", ".join(leave_out) or "nothing")
    print(harness.summary(found))
    print("run again (times):", retried or "none")
    expected = harness.read_expected(shard=tests)
    differences = harness.differences(expected, found)
    assert not differences, f"logs in {tmp_path}:\n" + "\n".join(differences)
    # kzplugin's summary: the extension probed the suite's new connections.
    assert "'MultiRead'" in (tmp_path / "ext.log").read_text()


def test_the_shards_hold_every_test_of_kazoos_suite_once():
    for test in harness.read_expected():
        holding = [shard for shard in range(len(SHARDS)) if harness.selects(SHARDS[shard], test)]
        assert len(holding) == 1, (test, holding)
    modules = [entry for shard in SHARDS for entry in shard if "::" not in entry]
    assert len(modules) == len(set(modules))
    assert all(SHARDS), SHARDS
    # A shard's own entries are never left out of it, and only what another shard names is.
    assert all(not set(harness.left_out(shard)) & set(shard) for shard in SHARDS)
    assert harness.left_out(harness.MEMBER_LOSS) == ()
    assert set(harness.left_out(SHARDS[1])) == set(harness.MEMBER_LOSS)


def test_shards_side_by_side_draw_their_ports_from_ranges_that_do_not_overlap():
    ranges = [harness.port_range(shard, len(SHARDS)) for shard in range(len(SHARDS))]
    ports = [port for block in ranges for port in block]
    assert len(ports) == len(set(ports))
    assert set(ports) <= set(harness.PORT_RANGE)
    assert all(len(block) > 10 * harness.PORT_BLOCK for block in ranges)


def test_only_the_member_loss_tests_need_kazoos_three_members():
    """A kazoo release with another test that names a member (``self.cluster[n]``) or changes
    the membership fails here until it is listed as needing three members or reviewed as
    ending alike on one; and every test run on three needs them. Tests that stock skips end
    skipped on any ensemble."""
    import kazoo.tests

    package = Path(kazoo.tests.__file__).parent
    run = [test for test, outcome in harness.read_expected().items() if outcome != "skipped"]
    uses = testids.ensemble_uses(package, run)
    needing = {test for test, used in uses.items() if used}
    on_three = {test for test in run if testids.within(test, harness.MEMBER_LOSS)}
    assert needing - on_three == set(harness.ONE_MEMBER_ENOUGH), needing - on_three
    assert all(uses[test] for test in on_three), [test for test in on_three if not uses[test]]
    assert all(
        any(testids.within(test, [entry]) for test in on_three) for entry in harness.MEMBER_LOSS
    )
    sizes = [harness.ensemble_size(shard) for shard in SHARDS]
    assert sizes == [3] + [1] * (len(SHARDS) - 1), sizes


def test_the_member_scan_follows_helpers_set_ups_base_classes_and_imported_functions(tmp_path):
    """What the guard above reads: a member named in a helper, a base class's ``setUp``, a
    function of another module, is the test's."""
    (tmp_path / "test_a.py").write_text(
        "from kazoo.testing import KazooTestCase\n"
        "class Base(KazooTestCase):\n"
        "    def _kill(self):\n"
        "        victim = self.cluster[2]\n"
        "        victim.stop()\n"
        "class TestA(Base):\n"
        "    def test_kills(self):\n"
        "        self._kill()\n"
        "    def test_reads(self):\n"
        "        self.client.get('/')\n"
        "def helper(client):\n"
        "    client.reconfig(joining=None, leaving='1', new_members=None)\n"
        "def test_function():\n"
        "    helper(None)\n"
    )
    (tmp_path / "test_b.py").write_text(
        "from kazoo.tests import test_a\n"
        "from kazoo.tests.test_a import Base, helper\n"
        "class TestB(test_a.TestA):\n"
        "    pass\n"
        "class TestC(Base):\n"
        "    def setUp(self):\n"
        "        self._kill()\n"
        "    def test_plain(self):\n"
        "        pass\n"
        "def test_imported():\n"
        "    helper(None)\n"
        "def test_attribute():\n"
        "    test_a.helper(None)\n"
    )
    uses = testids.ensemble_uses(
        tmp_path,
        [
            "kazoo.tests.test_a::TestA::test_kills",
            "kazoo.tests.test_a::TestA::test_reads",
            "kazoo.tests.test_a::test_function",
            "kazoo.tests.test_b::TestB::test_kills",
            "kazoo.tests.test_b::TestB::test_reads",
            "kazoo.tests.test_b::TestC::test_plain",
            "kazoo.tests.test_b::test_imported",
            "kazoo.tests.test_b::test_attribute",
        ],
    )
    member, reconfig = {testids.MEMBER}, {testids.RECONFIG}
    assert uses == {
        "kazoo.tests.test_a::TestA::test_kills": member,
        "kazoo.tests.test_a::TestA::test_reads": set(),
        "kazoo.tests.test_a::test_function": reconfig,
        "kazoo.tests.test_b::TestB::test_kills": member,
        "kazoo.tests.test_b::TestB::test_reads": set(),
        "kazoo.tests.test_b::TestC::test_plain": member,
        "kazoo.tests.test_b::test_imported": reconfig,
        "kazoo.tests.test_b::test_attribute": reconfig,
    }
