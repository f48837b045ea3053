"""docs/getting-started.md works as written: its commands and its files, in its order.

The page's Python blocks are files (their first line names them, ``# tenants.py``), its
``console`` blocks are commands and its ``text`` blocks what the files print; this test runs
them against a development server of its own (``sentinel zk start`` in a temporary state
directory), as a newcomer would, and compares what they print with the page.
"""

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a dev server of its own

PAGE = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"
BIN = Path(sys.executable).parent


def files() -> dict[str, str]:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    return {block.splitlines()[0].removeprefix("# "): block for block in blocks}


def outputs() -> list[list[str]]:
    """The page's ``text`` blocks: what each file prints, in the page's order."""
    blocks = re.findall(r"```text\n(.*?)```", PAGE.read_text(), re.S)
    return [block.splitlines() for block in blocks]


def commands() -> list[str]:
    blocks = re.findall(r"```console\n(.*?)```", PAGE.read_text(), re.S)
    return [line[2:] for block in blocks for line in block.splitlines() if line.startswith("$ ")]


@pytest.fixture
def newcomer(tmp_path, monkeypatch):
    """A working directory holding the page's files, and the environment of its shell."""
    for name, text in files().items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "SENTINEL_ZK"}
    env["SENTINEL_STATE_DIR"] = str(tmp_path / "state")
    # The in-process Spark job resolves its hosts from the same place as the shell.
    monkeypatch.delenv("SENTINEL_ZK", raising=False)
    monkeypatch.setenv("SENTINEL_STATE_DIR", env["SENTINEL_STATE_DIR"])
    yield tmp_path, env
    subprocess.run([BIN / "sentinel", "zk", "stop"], env=env, capture_output=True, check=False)


def shell(command: str, cwd: Path, env: dict[str, str], expect: int = 0) -> str:
    """Run one of the page's commands; ``sentinel`` and ``python`` are this environment's."""
    program, *args = command.split()
    if program == "python":
        program = sys.executable
    elif program == "sentinel":
        program = str(BIN / "sentinel")
    else:
        raise AssertionError(f"the page runs {program!r}: teach this test to run it")
    result = subprocess.run(
        [program, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == expect, (command, result.stdout, result.stderr)
    return result.stdout


def test_file_names_cannot_collide_with_packaging():
    """A file saved at the root of a checkout named like a packaging file (setup.py,
    pyproject.toml, ...) or like one of the project's packages would break `pip install -e .`
    or shadow the package."""
    reserved = {"setup.py", "setup.cfg", "pyproject.toml", "conftest.py", "noxfile.py"}
    root = PAGE.parents[1]
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    for name in files():
        assert name not in reserved, name
        assert Path(name).stem not in packages | {"sentinel"}, name


def test_the_first_hour_runs_as_written(newcomer, spark):
    cwd, env = newcomer
    printed = outputs()
    listed = commands()
    assert listed[0].startswith("pip install")  # the install: this environment has it
    assert listed[1:3] == ["sentinel zk start", "sentinel zk status"]
    for command in listed[1:3]:
        shell(command, cwd, env)

    assert shell("python tenants.py", cwd, env).splitlines() == printed[0] == ["p2"]
    assert shell("python tenants.py", cwd, env).splitlines() == ["p2"]  # idempotent, as it says

    publisher = subprocess.Popen(
        [sys.executable, "publish.py"], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert publisher.stdout.readline().rstrip("\n") == printed[1][0]
        assert printed[1][0].startswith("published 3 replicas")
        assert (
            shell("python resolve.py", cwd, env).splitlines()
            == printed[2]
            == [
                "postgresql://127.0.0.1:5434",
                "replica-b 0.5",
                "['replica-a', 'replica-b']",
                "['replica-b']",
            ]
        )

        # job.py in this process, on the suite's SparkSession (getOrCreate returns it).
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            exec(compile(files()["job.py"], "job.py", "exec"), {"__name__": "__main__"})
        assert (
            output.getvalue().splitlines()
            == printed[3]
            == [str([("acme", "replica-b"), ("globex", "replica-c"), ("initech", "replica-c")])]
        )

        operator = listed[3:8]
        assert operator[-1] == "sentinel watch orders-db"
        listing, instances, resolved, doctor = (shell(c, cwd, env) for c in operator[:-1])
        assert "orders-db" in listing and "p1:2 p2:1" in listing
        assert "replication_lag=0.5" in instances and "replica-c" in instances
        assert "picked (1 call): replica-b" in resolved
        assert "0 problem(s)" in doctor

        # watch until Ctrl-C; stopping publish.py (Ctrl-C) takes the three replicas away.
        watch = subprocess.Popen(
            [BIN / "sentinel", *operator[-1].split()[1:]],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert watch.stderr.readline().startswith("watching orders-db")
            publisher.send_signal(signal.SIGINT)
            assert publisher.wait(timeout=30) == 0
            assert publisher.stdout.readline().rstrip("\n") == printed[1][1]
            departures = [watch.stdout.readline().split()[2:4] for _ in range(3)]
            assert sorted(departures) == [
                ["-", "p1:replica-a"],
                ["-", "p1:replica-b"],
                ["-", "p2:replica-c"],
            ]
            watch.send_signal(signal.SIGINT)
            assert watch.wait(timeout=30) == 0
        finally:
            watch.kill()
            watch.wait()
    finally:
        publisher.kill()
        publisher.wait()

    assert listed[8:] == ["sentinel zk stop"]
    shell("sentinel zk stop", cwd, env)
    shell("sentinel zk status", cwd, env, expect=1)


def test_the_publisher_stops_cleanly_on_sigterm(newcomer):
    """publish.py under SIGTERM (systemd's and Kubernetes' stop signal) leaves as it does on
    Ctrl-C: it closes its session, so its instances are gone when it has exited, not a session
    timeout (10 s) later. Without its handler, SIGTERM would kill it (exit -15) and
    `sentinel ls` would still list the three replicas."""
    cwd, env = newcomer
    printed = outputs()[1]
    shell("sentinel zk start", cwd, env)
    shell("python tenants.py", cwd, env)
    publisher = subprocess.Popen(
        [sys.executable, "publish.py"], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert publisher.stdout.readline().rstrip("\n") == printed[0]
        assert "replica-a" in shell("sentinel ls orders-db", cwd, env)
        signalled = time.monotonic()
        publisher.send_signal(signal.SIGTERM)
        assert publisher.wait(timeout=30) == 0
        exited = time.monotonic() - signalled
        assert publisher.stdout.readline().rstrip("\n") == printed[1]
        listing = shell("sentinel ls orders-db", cwd, env)
        assert "replica-" not in listing, listing
        assert exited < 10.0, f"it took {exited:.1f} s, as long as a session expiry"
    finally:
        publisher.kill()
        publisher.wait()
