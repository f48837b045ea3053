"""What a user installs, used as a user uses it: the wheel of this checkout installed with only
its dependencies into a fresh virtual environment (``python -m venv``: no system site packages,
nothing of the test environment, no ``PYTHONPATH``), then ``sentinel --help``, a lookup against
a ZooKeeper server the test starts, and ``mypy --strict`` on a user's file that imports every
name the public modules export (their ``__all__``, tests/unit/test_exported_members.py).

The dependencies are installed from wheels kept in ``.wheelhouse`` with ``--no-index``
(``tests/wheelhouse.py``: built from the package index when missing or stale; ``./run.sh test``
starts that build beside its set-up). After that nothing is downloaded, and the environment
installs in seconds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from sentinel.testing.zookeeper import LocalZooKeeper
from tests.unit.test_exported_members import directives, doc_imports
from tests.unit.test_packaging import build_wheel
from tests.wheelhouse import PIP, ensure_wheelhouse

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Where the optional integrations' imports come from (dns: dnspython, for the agent's DNS
# server): a module that needs one of these is not importable with the dependencies alone, by
# design (pyproject.toml's extras).
EXTRAS_ONLY = {"dns", "grpc", "grpc_health", "httpx", "psycopg", "psycopg_pool", "pyspark"}


def user_environment() -> dict[str, str]:
    """The environment of a user's shell: nothing that points Python at this checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtual environment with the wheel and its dependencies, and nothing else."""
    work = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(work)
    house = ensure_wheelhouse()
    # No pip of its own (ensurepip costs seconds): the test environment's installer installs
    # into it, uv where ./run.sh installed it (a tenth of pip's CPU: 0.3 s against 3.1 s, the
    # same files), else pip. Either installs the same wheels, from the wheelhouse alone.
    env = user_environment()  # with this checkout on the path, pip finds it installed already
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], check=True)
    python = work / "venv" / "bin" / "python"
    uv = Path(sys.executable).with_name("uv")
    installer = [str(uv), "pip", "install", "-q"] if uv.exists() else [*PIP, "install"]
    install = [*installer, "--python", str(python), "--no-index", "--find-links", str(house)]
    subprocess.run([*install, str(wheel)], check=True, timeout=300, env=env)
    yield work / "venv"


def run(venv: Path, *command: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / command[0]), *command[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=user_environment(),
        cwd=venv.parent,  # not this checkout: its sentinel/ folder would shadow the wheel's
        **kwargs,
    )


def in_venv(venv: Path, code: str) -> str:
    done = run(venv, "python", "-c", textwrap.dedent(code))
    assert done.returncode == 0, done.stderr
    return done.stdout


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_environment_holds_the_wheel_and_its_dependencies_only(venv):
    found = json.loads(
        in_venv(
            venv,
            """
            import importlib.metadata as m, json, sentinel
            print(json.dumps({
                "requires": {d.metadata["Name"]: d.requires or [] for d in m.distributions()},
                "file": sentinel.__file__,
                "version": m.version("sentinel-discovery"),
            }))
            """,
        )
    )
    requires = {canonical(name): deps for name, deps in found["requires"].items()}
    # What sentinel-discovery requires, and what that requires, for this interpreter (the
    # venv's is this one), no extra.
    needed, todo = set(), ["sentinel-discovery"]
    while todo:
        name = todo.pop()
        needed.add(name)
        for requirement in map(Requirement, requires[name]):
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo += (
                    [canonical(requirement.name)]
                    if canonical(requirement.name) not in needed
                    else []
                )
    assert set(requires) == needed
    assert {"kazoo", "cryptography", "pure-sasl", "shtab"} <= needed
    assert found["file"].startswith(str(venv)), found["file"]  # the wheel's, not this checkout's
    assert found["version"] == PROJECT["version"] == "1.0.0rc1"


def test_the_command_prints_its_help(venv):
    done = run(venv, "sentinel", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: sentinel")
    assert "resolve" in done.stdout


def test_a_lookup_against_a_real_server(venv):
    with LocalZooKeeper() as zk:
        out = in_venv(
            venv,
            f"""
            from sentinel import Sentinel
            with Sentinel(hosts={zk.connect_string!r}, client_id="wheel-user",
                          namespace="/wheel") as s:
                s.ensure_service("billing-db", scheme="postgresql")
                s.register("billing-db", "p1", "10.0.0.5", 5432, scheme="postgresql")
                print(s.get_service("billing-db").uri)
            """,
        )
        listed = run(venv, "sentinel", "ls", "--zk", zk.connect_string, "--namespace", "/wheel")
    assert out.strip() == "postgresql://10.0.0.5:5432"
    assert listed.returncode == 0, listed.stderr
    assert "billing-db" in listed.stdout


def test_mypy_strict_passes_on_a_user_file_importing_every_public_name(venv, tmp_path):
    # The modules the docs import from and the reference names (tests/unit/
    # test_exported_members.py, without its model of the code: a name that is not a module,
    # sentinel.Sentinel, fails to import as itself).
    named = sorted({*doc_imports(), *directives()})
    modules = json.loads(
        in_venv(
            venv,
            f"""
            import importlib, json
            found = {{}}
            for name in {named!r}:
                try:
                    found[name] = list(importlib.import_module(name).__all__)
                except ModuleNotFoundError as exc:
                    if exc.name != name:
                        found[name] = exc.name.split(".")[0]
            print(json.dumps(found))
            """,
        )
    )
    # Only the integrations with an extra of their own need more than the dependencies.
    missing = {name: top for name, top in modules.items() if isinstance(top, str)}
    assert set(missing.values()) <= EXTRAS_ONLY, missing
    assert "sentinel.integrations.grpc" in missing and "sentinel.errors" not in missing
    imports = [
        f"from {name} import {', '.join(sorted(names))}"
        for name, names in sorted(modules.items())
        if isinstance(names, list) and names
    ]
    user = tmp_path / "user.py"
    user.write_text(
        "\n".join(imports)
        + textwrap.dedent("""


            def lookup(client: Sentinel, key: str) -> str:
                try:
                    return client.get_service("billing-db", key, policy=MinLag()).uri
                except ResolutionError as exc:
                    return f"none: {exc.service}"
            """)
    )
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "from sentinel import Sentinel\n\nport: str = Sentinel().get_service('x').port\n"
    )
    mypy = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--python-executable",
        str(venv / "bin" / "python"),
    ]
    mypy += ["--cache-dir", str(tmp_path / "cache"), "--config-file", os.devnull]
    checked = subprocess.run(
        [*mypy, str(user)], capture_output=True, text=True, cwd=tmp_path, env=user_environment()
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # ... and the types are the installed package's: a wrong use is refused.
    refused = subprocess.run(
        [*mypy, str(wrong)], capture_output=True, text=True, cwd=tmp_path, env=user_environment()
    )
    assert refused.returncode == 1 and "wrong.py:3: error" in refused.stdout, refused.stdout
