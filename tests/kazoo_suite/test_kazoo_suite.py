"""kazoo's own test suite with Sentinel's transport and protocol extension on every client
(``harness.py``): each test ends as it does with stock kazoo (``stock.txt``).

The suite runs in shards of its modules (:func:`harness.shards`), one test each, so that xdist
workers run them side by side; each shard's ensemble takes its ports from a range of its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.kazoo_suite import harness

SHARDS = harness.shards()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(harness.RUN_TIMEOUT * 2)
@pytest.mark.parametrize("shard", range(len(SHARDS)), ids=lambda shard: f"shard{shard}")
def test_kazoos_suite_ends_with_the_extension_as_it_does_stock(shard, tmp_path):
    modules = SHARDS[shard]
    ports = harness.port_range(shard, len(SHARDS))
    members = harness.ensemble_size(modules)
    found, retried = harness.run_with_retries(
        "ext", tmp_path, modules, ports=ports, members=members
    )
    print(f"kazoo {harness.kazoo_version()}, ext mode, {members} member(s), {', '.join(modules)}:")
    print(harness.summary(found))
    print("run again (times):", retried or "none")
    expected = harness.read_expected(modules=modules)
    differences = harness.differences(expected, found)
    assert not differences, f"logs in {tmp_path}:\n" + "\n".join(differences)
    # kzplugin's summary: the extension probed the suite's new connections.
    assert "'MultiRead'" in (tmp_path / "ext.log").read_text()


def test_the_shards_hold_every_module_of_kazoos_suite_once():
    modules = [module for shard in SHARDS for module in shard]
    assert len(modules) == len(set(modules))
    recorded = {test.split("::")[0] for test in harness.read_expected()}
    assert recorded <= set(modules)
    assert all(SHARDS), SHARDS


def test_shards_side_by_side_draw_their_ports_from_ranges_that_do_not_overlap():
    ranges = [harness.port_range(shard, len(SHARDS)) for shard in range(len(SHARDS))]
    ports = [port for block in ranges for port in block]
    assert len(ports) == len(set(ports))
    assert set(ports) <= set(harness.PORT_RANGE)
    assert all(len(block) > 10 * harness.PORT_BLOCK for block in ranges)


def test_only_the_member_loss_modules_need_kazoos_three_members():
    """A kazoo release whose tests stop a member elsewhere fails here, not on one member."""
    import kazoo.tests

    package = Path(kazoo.tests.__file__).parent
    touching = {
        f"kazoo.tests.{path.stem}"
        for path in package.glob("test_*.py")
        if re.search(r"cluster\[\s*\d", path.read_text())
    }
    assert touching <= harness.MEMBER_LOSS, touching - harness.MEMBER_LOSS
    assert [harness.ensemble_size(shard) for shard in SHARDS] == [3, 1]
