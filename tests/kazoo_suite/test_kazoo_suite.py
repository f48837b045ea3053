"""kazoo's own test suite with Sentinel's transport and protocol extension on every client
(``harness.py``): each test ends as it does with stock kazoo (``stock.txt``)."""

from __future__ import annotations

import pytest

from tests.kazoo_suite import harness

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(harness.RUN_TIMEOUT * 2)
def test_kazoos_suite_ends_with_the_extension_as_it_does_stock(tmp_path):
    found, retried = harness.run_with_retries("ext", tmp_path)
    print(f"kazoo {harness.kazoo_version()}, ext mode: {harness.summary(found)}")
    print("run again (times):", retried or "none")
    differences = harness.differences(harness.read_expected(), found)
    assert not differences, f"logs in {tmp_path}:\n" + "\n".join(differences)
    # kzplugin's summary: the extension probed the suite's new connections.
    assert "'MultiRead'" in (tmp_path / "ext.log").read_text()
