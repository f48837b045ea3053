"""``.wheelhouse``: a wheel of each of the project's dependencies (and theirs), which
``tests/integration/test_wheel.py`` installs from with ``--no-index``.

pip builds them there from the package index (``pip wheel``; pure-sasl is published as a
source archive only) when missing, and again when pyproject.toml's dependencies or the
interpreter change, under a file lock. Standard library only: ``./run.sh test`` starts it
(``python -m tests.wheelhouse``) beside the rest of its set-up, since on a fresh clone it
mostly waits on the index, and the test then finds it made (or waits on the lock)::

    .venv/bin/python -m tests.wheelhouse
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELHOUSE = ROOT / ".wheelhouse"
PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check", "-q")


def ensure_wheelhouse() -> Path:
    """``.wheelhouse`` with a wheel of each dependency (and theirs), made when missing or when
    the dependencies changed."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    stamp = hashlib.sha256("\n".join([sys.version, *dependencies]).encode()).hexdigest()
    with open(f"{WHEELHOUSE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (WHEELHOUSE / ".stamp").exists() and (WHEELHOUSE / ".stamp").read_text() == stamp:
            return WHEELHOUSE
        WHEELHOUSE.mkdir(exist_ok=True)
        subprocess.run([*PIP, "wheel", "-w", str(WHEELHOUSE), *dependencies], check=True)
        (WHEELHOUSE / ".stamp").write_text(stamp)
    return WHEELHOUSE


if __name__ == "__main__":
    ensure_wheelhouse()
