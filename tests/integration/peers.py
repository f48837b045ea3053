"""Another user's process on this host, for the tests of who may reach the agent's socket."""

from __future__ import annotations

import subprocess

NOBODY = 65534


def as_user(uid: int, gid: int, groups: tuple[int, ...] = ()) -> list[str]:
    """The command prefix that runs a program as ``uid``/``gid`` with only ``groups``.

    ``setpriv`` switches after exec. subprocess's own ``user=``/``group=`` switch between fork
    and exec, so the child is forked rather than vforked and runs the at-fork handlers of what
    the parent has loaded: a pytest worker that has run gRPC tests has gRPC's, and such a child
    died of SIGSEGV before its exec in CI (``epoll_wait error: Bad file descriptor``). With
    nothing to switch, subprocess starts the child by vfork, which runs no handler.
    """
    wanted = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", wanted]


def run_as_nobody(code: str, *args: str) -> str:
    """Run ``code`` (with ``args``) in the system's Python as uid and gid 65534 (``nobody``),
    with nothing of this checkout's environment; what it printed, stripped."""
    result = subprocess.run(
        [*as_user(NOBODY, NOBODY), "/usr/bin/python3", "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd="/",  # a directory that user may enter
        env={"PATH": "/usr/bin:/bin"},  # nothing of this checkout's environment
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()
