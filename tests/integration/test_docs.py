"""The README's examples run as written."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def quick_start() -> str:
    block = re.search(r"## Quick start\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README has no Quick start python block"
    return block.group(1)


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_readme_quick_start_runs_and_prints_what_it_says():
    assert run_python(quick_start()).strip() == "postgresql://10.0.0.5:5432"


def test_readme_quick_start_runs_twice_against_one_server(zookeeper, namespace):
    """As against ``sentinel zk start``: the second run finds what the first one created."""
    code = quick_start()
    # The test's server and a namespace of its own in place of the example's fresh server.
    edits = {
        "LocalZooKeeper() as zk": "contextlib.nullcontext(types.SimpleNamespace("
        f"connect_string={zookeeper.connect_string!r})) as zk",
        "hosts=zk.connect_string,": f"hosts=zk.connect_string, namespace={namespace!r},",
    }
    for old, new in edits.items():
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    code = "import contextlib, types\n" + code
    for _ in range(2):
        assert run_python(code).strip() == "postgresql://10.0.0.5:5432"


def test_the_jvm_registry_example_runs_and_prints_what_it_says():
    """docs/interop.md's example: Spring-shaped replicas in a Curator registry, routed by
    a shard map on their payload and the least lag."""
    doc = README.parent / "docs" / "interop.md"
    blocks = [b for b in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S) if "MinLag" in b]
    assert len(blocks) == 1, "docs/interop.md has one example with MinLag"
    assert run_python(blocks[0]).strip() == "postgresql://10.0.1.2:5432"
