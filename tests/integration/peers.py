"""Another user's process on this host, for the tests of who may reach the agent's socket."""

from __future__ import annotations

import subprocess

NOBODY = 65534


def run_as_nobody(code: str, *args: str) -> str:
    """Run ``code`` (with ``args``) in the system's Python as uid and gid 65534 (``nobody``),
    with nothing of this checkout's environment; what it printed, stripped."""
    result = subprocess.run(
        ["/usr/bin/python3", "-c", code, *args],
        user=NOBODY,
        group=NOBODY,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd="/",  # a directory that user may enter
        env={"PATH": "/usr/bin:/bin"},  # nothing of this checkout's environment
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()
