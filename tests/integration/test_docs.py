"""The README's examples run as written."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_quick_start_runs_and_prints_what_it_says():
    block = re.search(r"## Quick start\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README has no Quick start python block"
    result = subprocess.run(
        [sys.executable, "-c", block.group(1)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "postgresql://10.0.0.5:5432"
