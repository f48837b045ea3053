"""``./run.sh demo`` installs what the demo needs and no test tool; ``./run.sh test`` the rest.

Read from pyproject.toml's extras and from run.sh's dry run (``RUN_SH_DRY_RUN=1``: it says
what it would install and run, and does neither), so nothing is installed here.
"""

import ast
import os
import re
import shutil
import subprocess
import sys
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


# The distribution each third-party module an example imports comes from.
DISTRIBUTIONS = {
    "grpc": "grpcio",
    "grpc_health": "grpcio-health-checking",
    "envoy": "xds-protos",
    "kazoo": "kazoo",
    "cachetools": "cachetools",
    "cryptography": "cryptography",
    "prometheus_client": "prometheus-client",
    "yaml": "pyyaml",
    "shtab": "shtab",
    "puresasl": "pure-sasl",
}


def imported_distributions(source: str, seen: set[str] | None = None) -> set[str]:
    """The distributions ``source``'s module-level imports need, following the project's own
    modules (``sentinel.testing.grpcserver`` imports ``grpc_health``)."""
    seen = set() if seen is None else seen
    needed: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            if top == "sentinel":
                if module in seen:
                    continue
                seen.add(module)
                path = ROOT / Path(*module.split("."))
                file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
                needed |= imported_distributions(file.read_text(), seen)
            elif top not in sys.stdlib_module_names and top != "__future__":
                needed.add(DISTRIBUTIONS.get(top, top))
    return needed


def test_the_grpc_and_xds_extras_hold_what_docs_grpc_examples_import():
    """Each Python example of docs/grpc.md runs after ``pip install -e '.[grpc]'`` (the xDS
    client's after ``.[xds]``): the core's dependencies and the extra's cover its imports."""
    core = {
        re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower()
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    examples = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "grpc.md").read_text(), re.S)
    checked = 0
    for example in examples:
        try:
            needed = imported_distributions(example)
        except SyntaxError:  # a fragment (`stub.Charge(...)`), not a program
            continue
        extra = "xds" if "xds:///" in example else "grpc"
        assert needed <= core | requirements(extra), (extra, needed - core - requirements(extra))
        checked += 1
    assert checked >= 3


def test_run_sh_test_installs_the_node_grpc_client_when_npm_is_there():
    said = dry_run("test")
    if shutil.which("npm") is None:
        assert "npm not found; the Node xDS client's test skips" in said
    else:
        assert "would install tests/peers/node's Node packages (npm ci)" in said


def test_the_test_extra_holds_every_other_but_the_benchmarks():
    """What README.md says of ``./run.sh test``'s .venv: every extra's imports are there."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra in set(extras) - {"test", "benchmarks"}:
        assert requirements(extra) <= requirements("test"), extra
