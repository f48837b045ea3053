"""kazoo's own test suite run against this checkout's transport and protocol extension.

kazoo ships its tests in its wheel (``kazoo.tests``, harness in ``kazoo.testing``), so the
version Sentinel installs is the version whose suite runs: in a virtual environment of its own
(``.venv-kazoo``, built on first use and again when the kazoo version or ``requirements.txt``
changes), because kazoo's harness needs a pyOpenSSL that still has ``X509Extension`` and so a
cryptography older than ``sentinel.auth`` accepts. Each run starts kazoo's ensemble (its three
members, or one) from the ZooKeeper Sentinel's tests use
(:func:`sentinel.testing.zookeeper.find_installation`), on a block of free ports, with the
``kzplugin`` plug-in choosing the mode (stock, transport, ext).

``tests/kazoo_suite/test_kazoo_suite.py`` runs the ext mode in ``./run.sh test``, in the shards
of :func:`shards` (one test each, so that xdist workers run them side by side, each with its own
ensemble on ports of its own :func:`port_range`: three members for the tests of
:data:`MEMBER_LOSS`, one for every other), and compares each test's outcome with the stock run
recorded in ``stock.txt``. By hand (on three members)::

    .venv/bin/python -m tests.kazoo_suite.harness                  # stock, then ext, and the diff
    .venv/bin/python -m tests.kazoo_suite.harness --mode ext kazoo.tests.test_client -k queuing
    .venv/bin/python -m tests.kazoo_suite.harness --mode stock --record   # rewrite stock.txt
    .venv/bin/python -m tests.kazoo_suite.harness --prepare   # build .venv-kazoo only (run.sh)
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import os
import pkgutil
import random
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from sentinel.errors import ZooKeeperNotInstalled
from sentinel.testing.zookeeper import find_installation, short_lived_jvm_options
from tests.kazoo_suite import environment, testids

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STOCK = HERE / "stock.txt"
SUITE = ("kazoo.tests",)
MODES = ("stock", "transport", "ext")
PER_TEST_TIMEOUT = 240  # s, pytest-timeout inside kazoo's run (its slowest tests take ~30 s)
RUN_TIMEOUT = 1500  # s, the whole run (about 3.5 min on a quiet 2-core machine)
PORT_BLOCK = 30  # kazoo's harness numbers its 3 members' ports from one offset, 10 apart
# Below the kernel's ephemeral range (32768 up), where the project's own servers get theirs.
PORT_RANGE = range(20000, 32000)
# kazoo's tests that need its three members (entries as testids.within reads them): they stop
# members so that the rest keep or lose the quorum, or change the membership (testids, MEMBER
# and RECONFIG). They are a shard of their own on three members; every other test runs on one,
# which serves it alike (stock.txt holds for both) for about half the CPU (docs/testing-history.md,
# "kazoo's three members only where a test stops one").
MEMBER_LOSS = (
    "kazoo.tests.test_client::TestClient::test_update_host_list",
    "kazoo.tests.test_client::TestReconfig",
    "kazoo.tests.test_connection::TestReadOnlyMode",
)
# kazoo's tests that name a member and end on one as on three: the client of
# test_create_makepath_incompatible_acls only connects to the first member, and the
# request-queuing tests stop and restart the one member their client knows, the client's view
# the same whether the other two keep the session meanwhile or the member's own log does.
ONE_MEMBER_ENOUGH = (
    "kazoo.tests.test_client::TestClient::test_create_makepath_incompatible_acls",
    "kazoo.tests.test_client::TestClient::test_request_queuing_session_expired",
    "kazoo.tests.test_client::TestClient::test_request_queuing_session_recovered",
)
# What each shard of ./run.sh test runs: kazoo's modules or tests, a shard leaving out what another
# names under its own (MEMBER_LOSS out of test_client and test_connection), the longest (by
# --durations=0) spread so that the shards take about as long; the last shard is every other
# module. test_connection and test_sasl restart the ensemble with other settings: one shard.
SHARDS = (
    MEMBER_LOSS,
    (
        "kazoo.tests.test_client",
        "kazoo.tests.test_connection",
        "kazoo.tests.test_partitioner",
        "kazoo.tests.test_interrupt",
        "kazoo.tests.test_selectors_select",
        "kazoo.tests.test_counter",
        "kazoo.tests.test_sasl",
    ),
)
# The environment a run does not inherit: kazoo's tests read CI (one test runs only there, one
# waits longer there), so a run here and in CI must not differ by it.
NOT_INHERITED = ("CI", "PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")
FAILED = ("failed", "error")
# kazoo's timing tests fail on a loaded 2-core machine with stock kazoo too
# (docs/testing-history.md: the request-queuing tests about one run in two under load): a test
# that failed is run again, up to this many times, and counts as failed only if it failed every
# time.
RETRIES = 4


def kazoo_version() -> str:
    """The kazoo this checkout's environment installed: the one whose suite runs."""
    return importlib.metadata.version("kazoo")


def ensure_venv() -> Path:
    """The suite's interpreter in ``.venv-kazoo`` with the kazoo this checkout installed
    (:mod:`tests.kazoo_suite.environment`)."""
    return environment.ensure(kazoo_version())


def shards() -> list[tuple[str, ...]]:
    """kazoo's tests (modules such as ``kazoo.tests.test_client``, classes or tests) in
    ``len(SHARDS) + 1`` shards: those :data:`SHARDS` names, then every other module the
    installed kazoo ships or ``stock.txt`` records, so that every test is in exactly one shard
    (:func:`selects`) whatever a kazoo release adds, and a module it no longer ships fails its
    shard rather than going unnoticed."""
    import kazoo.tests  # the release .venv-kazoo installs: harness.ensure_venv pins it to ours

    taken = {entry for shard in SHARDS for entry in shard if "::" not in entry}
    shipped = {
        f"kazoo.tests.{module.name}"
        for module in pkgutil.iter_modules(kazoo.tests.__path__)
        if module.name.startswith("test_")
    }
    recorded = {test.split("::")[0] for test in read_expected()}
    return [*SHARDS, tuple(sorted((shipped | recorded) - taken))]


def left_out(shard: Sequence[str]) -> tuple[str, ...]:
    """What ``shard`` leaves out: the entries another of :data:`SHARDS` names under its own."""
    return tuple(
        entry
        for other in SHARDS
        if tuple(other) != tuple(shard)
        for entry in other
        if testids.within(entry, shard)
    )


def selects(shard: Sequence[str], test: str) -> bool:
    """Whether ``shard`` runs kazoo's test ``test``: under one of its entries and not left out."""
    return testids.within(test, shard) and not testids.within(test, left_out(shard))


def ensemble_size(shard: Sequence[str]) -> int:
    """Members of the ensemble ``shard`` runs on: kazoo's three for the tests that need them
    (:data:`MEMBER_LOSS`), else one."""
    return 3 if set(MEMBER_LOSS).intersection(shard) else 1


def port_range(shard: int, count: int) -> range:
    """The part of :data:`PORT_RANGE` that shard ``shard`` of ``count`` takes its ports from:
    shards run side by side never draw the same block."""
    width = len(PORT_RANGE) // count
    first = PORT_RANGE.start + shard * width
    return range(first, first + width)


def zookeeper_environment(ports: range = PORT_RANGE, members: int = 3) -> dict[str, str]:
    """kazoo's harness settings for the ZooKeeper the project's tests run, an ensemble of
    ``members``, on free ports drawn from ``ports``."""
    installation = find_installation()
    if installation.kind != "java" or not installation.classpath or not installation.java:
        raise ZooKeeperNotInstalled(
            f"kazoo's harness runs ZooKeeper from its jars; found {installation.source}"
        )
    main = "org.apache.zookeeper.version.VersionInfoMain"
    printed = subprocess.run(
        [installation.java, "-cp", installation.classpath, main],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    # "Apache ZooKeeper, version 3.8.0 2024-12-29 17:54 UTC" (releases add "-1" and the like)
    version = printed.split("version", 1)[1].split()[0].split("-")[0]
    return {
        "ZOOKEEPER_CLASSPATH": installation.classpath,
        "ZOOKEEPER_VERSION": version,
        "ZOOKEEPER_PORT_OFFSET": str(free_port_block(ports=ports)),
        "ZOOKEEPER_CLUSTER_SIZE": str(members),
    }


def free_port_block(size: int = PORT_BLOCK, ports: range = PORT_RANGE) -> int:
    """The first of ``size`` consecutive free loopback ports in ``ports``, chosen at random, so
    that runs side by side never share kazoo's default offset."""
    chooser = random.Random()
    for _ in range(500):
        first = chooser.randrange(ports.start, ports.stop - size)
        if all(_free(port) for port in range(first, first + size)):
            return first
    raise OSError(f"no {size} consecutive free ports between {ports.start} and {ports.stop}")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run(
    mode: str,
    directory: Path,
    tests: Sequence[str] = SUITE,
    pytest_args: Sequence[str] = (),
    name: str | None = None,
    ports: range = PORT_RANGE,
    members: int = 3,
    leave_out: Sequence[str] = (),
) -> dict[str, str]:
    """Run kazoo's ``tests`` (modules or test ids under ``--pyargs``) but those under
    ``leave_out`` in ``mode``, its ensemble of ``members`` on a block of ``ports``; return each
    test's outcome by id
    (``kazoo.tests.test_client::TestClient::test_create``: passed, skipped, failed, or error in
    its set-up or teardown), none if the run died before its end. The log is
    ``directory/<name>.log`` (``name`` defaults to the mode)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    python = ensure_venv()
    name = name or mode
    found = directory / f"{name}.json"
    env = {key: value for key, value in os.environ.items() if key not in NOT_INHERITED}
    env.update(zookeeper_environment(ports, members), KZ_MODE=mode, KZ_OUTCOMES=str(found))
    env.update(KZ_LEAVE_OUT=" ".join(leave_out))
    # kazoo's ensemble JVMs (its harness takes no JVM options) run as the project's own test
    # servers do (tests/conftest.py), and with their collector.
    options = (*short_lived_jvm_options(), "-XX:+UseSerialGC")
    env.update(JAVA_TOOL_OPTIONS=" ".join(options))
    env.update(PYTHONPATH=f"{HERE}{os.pathsep}{ROOT}")
    command = [
        str(python), "-m", "pytest", "-c", os.devnull, "--rootdir", str(directory),
        "-p", "kzplugin", "-p", "no:cacheprovider", f"--timeout={PER_TEST_TIMEOUT}",
        "-q", "-rfE", *pytest_args, "--pyargs", *tests,
    ]  # fmt: skip
    with (directory / f"{name}.log").open("w") as log:
        # Outside the checkout and with no configuration file, so the project's conftest and
        # pytest settings stay out of kazoo's run.
        subprocess.run(
            command, cwd=directory, env=env, stdout=log, stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT, check=False,
        )  # fmt: skip
    return json.loads(found.read_text()) if found.exists() else {}


def run_with_retries(
    mode: str,
    directory: Path,
    tests: Sequence[str] = SUITE,
    pytest_args: Sequence[str] = (),
    ports: range = PORT_RANGE,
    members: int = 3,
    leave_out: Sequence[str] = (),
) -> tuple[dict[str, str], dict[str, int]]:
    """:func:`run`, then the failed tests again, alone together (``RETRIES`` rounds at most,
    each with those still failing); returns the outcomes, a test that passed again counted as
    passed, and how many times each failed test was run again."""
    found = run(
        mode, directory, tests, pytest_args, ports=ports, members=members, leave_out=leave_out
    )
    retried: dict[str, int] = {}
    for attempt in range(1, RETRIES + 1):
        failed = [test for test, outcome in found.items() if outcome in FAILED]
        if not failed:
            break
        again = run(
            mode, directory, failed, pytest_args, f"{mode}-{attempt}", ports, members, leave_out
        )
        for test in failed:
            retried[test] = attempt
            if again.get(test) == "passed":
                found[test] = "passed"
    return found, retried


def read_expected(path: Path = STOCK, shard: Sequence[str] | None = None) -> dict[str, str]:
    """The recorded stock outcomes: ``outcome test-id`` a line, ``#`` comments; only those
    ``shard`` runs (:func:`selects`) when given."""
    expected = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            outcome, test = line.split(maxsplit=1)
            if shard is None or selects(shard, test):
                expected[test] = outcome
    return expected


def write_expected(found: Mapping[str, str], path: Path = STOCK) -> None:
    """Record a stock run's outcomes (see :func:`read_expected`)."""
    lines = [
        f"# kazoo {kazoo_version()}'s own suite, stock mode: each test's outcome.",
        "# Written by `.venv/bin/python -m tests.kazoo_suite.harness --mode stock --record`.",
        *(f"{outcome} {test}" for test, outcome in sorted(found.items())),
    ]
    path.write_text("\n".join(lines) + "\n")


def differences(expected: Mapping[str, str], found: Mapping[str, str]) -> list[str]:
    """``test: stock outcome -> this run's`` for every test whose outcome differs."""
    return [
        f"{test}: {expected.get(test, 'missing')} -> {found.get(test, 'missing')}"
        for test in sorted(expected.keys() | found.keys())
        if expected.get(test, "missing") != found.get(test, "missing")
    ]


def summary(found: Mapping[str, str]) -> str:
    """``316 passed, 177 skipped`` and so on."""
    counts = collections.Counter(found.values())
    return ", ".join(f"{counts[kind]} {kind}" for kind in ("passed", "skipped", *FAILED))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.kazoo_suite.harness", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--mode", choices=MODES, action="append", help="default: stock, ext")
    parser.add_argument("--record", action="store_true", help="write the stock run to stock.txt")
    parser.add_argument(
        "--prepare", action="store_true", help="only build .venv-kazoo if it is missing or stale"
    )
    parser.add_argument("tests", nargs="*", default=list(SUITE), help="kazoo test modules or ids")
    options, pytest_args = parser.parse_known_args(argv)
    if options.prepare:
        print(f"kazoo's suite runs with {ensure_venv()}")
        return 0
    directory = Path(tempfile.mkdtemp(prefix="kazoo-suite-"))
    results = {}
    for mode in options.mode or ("stock", "ext"):
        results[mode], retried = run_with_retries(mode, directory, options.tests, pytest_args)
        print(f"{mode}: {summary(results[mode])} (logs in {directory})")
        print(f"  run again (times): {retried or 'none'}")
    if options.record:
        write_expected(results["stock"])
    baseline = results.get("stock") or read_expected()
    for mode, found in results.items():
        if list(options.tests) != list(SUITE):  # a part of the suite: only its tests compared
            baseline = {test: outcome for test, outcome in baseline.items() if test in found}
        if mode != "stock":
            print(f"{mode} against stock:", *differences(baseline, found) or ["none"], sep="\n  ")
    return int(any(outcome in FAILED for found in results.values() for outcome in found.values()))


if __name__ == "__main__":
    sys.exit(main())
