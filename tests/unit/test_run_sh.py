"""``./run.sh demo`` installs what the demo needs and no test tool; ``./run.sh test`` the rest.

Read from pyproject.toml's extras and from run.sh's dry run (``RUN_SH_DRY_RUN=1``: it says
what it would install and run, and does neither), so nothing is installed here.
"""

import os
import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "sentinel-discovery"
TEST_TOOLS = {"pytest", "pytest-timeout", "hypothesis", "ruff", "mypy", "gunicorn", "mkdocs"}


def requirements(extra: str) -> set[str]:
    """The distributions an extra brings, its references to the project's other extras
    (``sentinel-discovery[spark,postgres]``) followed."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names: set[str] = set()
    for requirement in extras[extra]:
        name, _, rest = re.match(r"([A-Za-z0-9_.-]+)(\[([^\]]*)\])?", requirement).groups()
        if name == PROJECT:
            for inner in rest.split(","):
                names |= requirements(inner.strip())
        else:
            names.add(name.lower())
    return names


def dry_run(command: str) -> str:
    result = subprocess.run(
        [str(ROOT / "run.sh"), command],
        env={**os.environ, "RUN_SH_DRY_RUN": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stderr


def test_the_demo_extra_holds_what_the_demo_imports_and_no_test_tool():
    demo = requirements("demo")
    assert {"pyspark", "psycopg", "psycopg-pool"} <= demo
    assert demo & TEST_TOOLS == set()


def test_the_test_extra_holds_the_demo_and_the_test_tools():
    test = requirements("test")
    assert requirements("demo") <= test  # the suite runs the demo
    assert test >= TEST_TOOLS


def test_run_sh_demo_installs_only_the_demo_extra_and_says_why():
    said = dry_run("demo")
    assert "would install .[demo] (what the demo needs: Spark for its job" in said
    assert ".[test]" not in said
    assert "would run .venv/bin/sentinel demo" in said


def test_run_sh_test_installs_the_test_extra():
    said = dry_run("test")
    assert "would install .[test] (the test tools:" in said
    assert "would run .venv/bin/python -m pytest" in said
