"""What users install: the wheel's contents, and what a type checker sees of the public API."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "typecheck" / "typed_usage.py"
# The typed example, the plug-in contracts and the plug-in packages, checked as a user's code
# is; the rest of the library is followed for its types but not held to --strict here.
CHECKED = [
    EXAMPLE,
    ROOT / "sentinel" / "__init__.py",
    ROOT / "sentinel" / "aio.py",
    ROOT / "sentinel" / "strategies.py",
    ROOT / "sentinel" / "rendezvous.py",
    ROOT / "sentinel" / "memo.py",
    ROOT / "sentinel" / "telemetry.py",
    ROOT / "policies",
    ROOT / "balancers",
]


def package_dirs() -> dict[str, str]:
    """The packages pyproject.toml installs from another folder: installed name to folder."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(config["tool"]["setuptools"].get("package-dir", {}))


def mypy(*paths: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """mypy as a user runs it; ``cache`` is the test's own (fresh) incremental cache, so a
    second run re-checks only its own files instead of the whole import graph again.

    No time-out of its own: its first run's wall time grows with the machine's load, past the
    one this had (docs/testing-history.md, "Flaky tests found and fixed"); a hang is the suite's
    time-out's (it prints the stacks), and mypy's speed on a busy machine is not tested."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(cache),
            "--follow-imports=silent",  # as for an installed package: its own errors are not ours
            "--config-file",
            str(ROOT / "pyproject.toml"),
            *map(str, paths),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def run_python(code: str) -> str:
    """``code`` in a fresh interpreter (nothing imported yet); its output."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def test_importing_a_submodule_does_not_import_the_client():
    loaded = run_python(
        "import sys, sentinel.errors, sentinel.strategies, sentinel.rendezvous\n"
        "print(' '.join(sorted(sys.modules)))"
    ).split()
    assert "sentinel.strategies" in loaded
    plugins = ("sentinel.policies", "sentinel.balancers")
    assert not [m for m in loaded if m in ("sentinel.client", "sentinel.cache", *plugins)]
    assert not [m for m in loaded if m == "kazoo" or m.startswith("kazoo.")]


def test_the_package_exports_what_users_touch_on_first_use():
    out = run_python(
        "import sys, sentinel\n"
        "from sentinel import Sentinel, Endpoint, Registration, SentinelError\n"
        "print(Sentinel.__module__, Endpoint.__module__, Registration.__module__)\n"
        "print(all(getattr(sentinel, n) is not None for n in sentinel.__all__))\n"
        "print(set(sentinel.__all__) <= set(dir(sentinel)))\n"
        "from sentinel import errors  # a submodule, not an export\n"
        "print(errors.__name__)\n"
        "try:\n"
        "    sentinel.NotExported\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    ).splitlines()
    assert out == [
        "sentinel.client sentinel.registry.endpoint sentinel.publisher",
        "True",
        "True",
        "sentinel.errors",
        "module 'sentinel' has no attribute 'NotExported'",
    ]
    import sentinel

    assert {"ResolutionError", "InstancesChanged", "TlsConfig", "__version__"} <= set(
        sentinel.__all__
    )


def test_mypy_strict_passes_on_the_typed_example_and_fails_on_a_wrong_use(tmp_path):
    cache = tmp_path / "mypy-cache"
    checked = mypy(*CHECKED, cache=cache)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    wrong = tmp_path / "wrong_usage.py"
    wrong.write_text(
        "from sentinel import Endpoint, NotExported, Sentinel\n"  # line 1: no such export
        "\n"
        "\n"
        "def port_text(endpoint: Endpoint) -> str:\n"
        '    return endpoint.port + "x"\n'  # line 5: int + str
        "\n"
        "\n"
        "def count(sentinel: Sentinel) -> int:\n"
        '    return sentinel.get_service("billing-db")\n'  # line 9: an Endpoint is not an int
    )
    refused = mypy(wrong, cache=cache)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    lines = {int(line.split(":")[1]) for line in refused.stdout.splitlines() if ": error:" in line}
    assert lines == {1, 5, 9}, refused.stdout


# What the built-ins that take required arguments are given; the rest are built bare.
BUILT_IN_ARGUMENTS = {
    "min_metric": {"metric": "cpu"},
    "threshold": {"metric": "cpu", "below": 0.9},
    "fresh_metrics": {"max_age": 30},
    "zone_affinity": {"zone": "eu-1"},
    "sticky": {"key": "tenant-42"},
}


def test_an_application_with_its_own_policies_and_balancers_modules_loads_every_built_in(
    tmp_path,
):
    # "policies" and "balancers" are common module names in an application: the built-ins must
    # load by name from a script in a directory that has both (its directory is sys.path[0]).
    (tmp_path / "policies.py").write_text('OWN = "the application policies"\n')
    (tmp_path / "balancers.py").write_text('OWN = "the application balancers"\n')
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    wanted = {
        group: {name: BUILT_IN_ARGUMENTS.get(name, {}) for name in declared[group]}
        for group in ("sentinel.policies", "sentinel.balancers")
    }
    script = tmp_path / "app.py"
    script.write_text(
        "import json, sys\n"
        "from sentinel.plugins import load_balancer, load_policy\n"
        "wanted = json.loads(sys.argv[1])\n"
        "for load, group in ((load_policy, 'sentinel.policies'), "
        "(load_balancer, 'sentinel.balancers')):\n"
        "    for name, arguments in wanted[group].items():\n"
        "        print(name, type(load(name, **arguments)).__module__)\n"
        "import balancers, policies\n"
        "print(policies.OWN, balancers.OWN, sep='; ')\n"
    )
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(wanted)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    *loaded, own = done.stdout.splitlines()
    assert [line.split()[0] for line in loaded] == [
        *wanted["sentinel.policies"],
        *wanted["sentinel.balancers"],
    ]
    assert all(line.split()[1].startswith("sentinel.") for line in loaded), loaded
    # ... and the application's own modules are still the ones its imports find.
    assert own == "the application policies; the application balancers"


def build_wheel(tmp_path: Path) -> Path:
    """The wheel of this checkout, built in ``tmp_path`` (tests/integration/test_wheel.py
    installs it)."""
    # A copy of the sources, so that the build's scratch files never land in the worktree.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("sentinel", "policies", "balancers", "benchmarks"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    # The backend pyproject.toml names, called as pip calls it (PEP 517), in a fresh
    # interpreter; pip itself adds seconds of start-up and a metadata pass the wheel does
    # not need. The venv's setuptools: no index needed.
    backend = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["build-backend"]
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys, {backend} as backend; backend.build_wheel(sys.argv[1])",
            str(tmp_path / "dist"),
        ],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=120,
    )
    [wheel] = (tmp_path / "dist").glob("*.whl")
    return wheel


def test_the_wheel_ships_the_library_and_py_typed_but_not_the_benchmarks(tmp_path):
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"sentinel"}  # an application's own "policies" module shadows nothing of ours
    assert "sentinel/py.typed" in names
    # Every module of the source, at its installed name: the explicit package list misses none.
    folders = {"sentinel": "sentinel", **package_dirs()}
    expected = {
        f"{package.replace('.', '/')}/{path.relative_to(ROOT / folder).as_posix()}"
        for package, folder in folders.items()
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert {name for name in names if name.endswith(".py")} == expected
    assert "sentinel/policies/metrics.py" in expected and "sentinel/balancers/load.py" in expected
    # The dashboard's templates and static files are package data: each one ships.
    ui = ROOT / "sentinel" / "ui"
    data = {
        f"sentinel/ui/{path.relative_to(ui).as_posix()}"
        for folder in ("templates", "static")
        for path in (ui / folder).iterdir()
    }
    assert {"sentinel/ui/templates/base.html", "sentinel/ui/static/live.js"} <= data
    assert data <= set(names)
