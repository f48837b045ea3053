"""The virtual environment kazoo's suite runs in (``.venv-kazoo``), in two layers.

The base (the interpreter, ``requirements.txt`` and a kazoo that ``pyproject.toml`` admits)
needs nothing of the project installed, so this module uses the standard library alone:
``./run.sh test`` builds the base with the system's ``python3`` while the project's own
environment installs (both mostly wait on downloads)::

    python3 tests/kazoo_suite/environment.py

Then the harness makes sure the kazoo is the one the project installed (:func:`ensure`): the
same release, almost always, so nothing is installed then. The base is rebuilt when the
interpreter's version, ``requirements.txt`` or the project's kazoo requirement changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VENV = ROOT / ".venv-kazoo"
REQUIREMENTS = HERE / "requirements.txt"
# pip's own notices stay out of the run's output; its errors do not.
PIP = ("-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile")


def _stamp(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _current(path: Path, stamp: str) -> bool:
    return path.exists() and path.read_text() == stamp


def project_kazoo() -> str:
    """The project's kazoo requirement (``kazoo>=2.11,<2.12``), from ``pyproject.toml``."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        dependencies = tomllib.load(file)["project"]["dependencies"]
    return next(d for d in dependencies if d.replace(" ", "").startswith(("kazoo>", "kazoo=")))


def ensure_base() -> Path:
    """The suite's interpreter with ``requirements.txt`` and the project's kazoo requirement
    installed, built when missing or out of date (under a file lock: one build at a time)."""
    python = VENV / "bin" / "python"
    kazoo = project_kazoo()
    stamp = _stamp(sys.version, REQUIREMENTS.read_text(), kazoo)
    with open(f"{VENV}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and _current(VENV / ".base", stamp):
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([python, *PIP, kazoo, "-r", str(REQUIREMENTS)], check=True)
        installed = subprocess.run(
            [python, "-c", "import importlib.metadata as m; print(m.version('kazoo'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        (VENV / ".kazoo").write_text(f"kazoo=={installed}")
        (VENV / ".base").write_text(stamp)
    return python


def ensure(kazoo_version: str) -> Path:
    """The suite's interpreter with the base and ``kazoo==kazoo_version`` installed (the
    base's own kazoo, unless the project's environment resolved another release)."""
    python = ensure_base()
    wanted = f"kazoo=={kazoo_version}"
    with open(f"{VENV}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _current(VENV / ".kazoo", wanted):
            subprocess.run([python, *PIP, wanted], check=True)
            (VENV / ".kazoo").write_text(wanted)
    return python


if __name__ == "__main__":
    ensure_base()
