"""``--dist loadgroup`` keeps a module with a module-scoped fixture on one xdist worker.

``tests/conftest.py`` marks such a module's tests with ``xdist_group``, so that its server
starts once; pytest-xdist 3.8 names the group in a way pytest 9.2 ignores, and the suite's
groups silently fell apart (each worker that ran one of a module's tests started its server).
Run here as ``./run.sh test`` runs the suite, on a made-up module, in a pytest of its own."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MODULE = """
import os
import pytest

@pytest.fixture(scope="module")
def server():
    with open("starts.txt", "a") as starts:
        starts.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.parametrize("n", range(6))
def test_on_the_server(server, n):
    with open("ran.txt", "a") as ran:
        ran.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def test_a_module_scoped_fixture_starts_once_on_two_workers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest("pytest_plugins = ['tests.conftest']")
    pytester.makepyfile(test_module=MODULE)
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder", "-p", "no:cacheprovider"
    )  # fmt: skip
    result.assert_outcomes(passed=6)
    ran = (pytester.path / "ran.txt").read_text().split()
    assert len(ran) == 6 and len(set(ran)) == 1, ran
    assert (pytester.path / "starts.txt").read_text().split() == ran[:1]
