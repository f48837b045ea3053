"""Shared fixtures: one real ZooKeeper for the session, a fresh namespace for each test."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import io
import json
import logging
import os
import select
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from kazoo.client import KazooClient

from sentinel import Sentinel
from sentinel.cache.config import CacheConfig
from sentinel.errors import PostgresNotInstalled
from sentinel.testing import spark as spark_launcher
from sentinel.testing import zookeeper as zookeeper_launcher
from sentinel.testing.postgres import LocalPostgres
from sentinel.testing.zookeeper import CLIENT_COMPILER_ONLY, LocalZooKeeper, ZooKeeperServer

WATCHES_ENV = "SENTINEL_TEST_WATCHES"

# Hypothesis judges time too: a 200 ms deadline per example and a health check on slow input
# generation, both of which fail tests whose assertions hold when a 2-core machine is busy (as
# test_records.py's round trip did on three workers). The suite runs without those two; what
# each test asserts, and how many examples it tries, are unchanged.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

# A test that starts a real server carries the ``integration`` marker, so that
# ``-m "not integration"`` starts none: one using these fixtures (directly or through another
# fixture) fails at set-up without it, and so does one that starts a ZooKeeper server or a
# LocalPostgres of its own (checked as the process is launched).
SERVER_FIXTURES = frozenset({"zookeeper", "postgres"})
_running: list[pytest.Item] = []  # the tests being run (a pytester run's inside its own)


def _unmarked(item: pytest.Item, what: str) -> None:
    if item.get_closest_marker("integration") is None:
        pytest.fail(
            f"{item.nodeid} {what} but has no integration marker "
            "(add `pytestmark = pytest.mark.integration` to its module)",
            pytrace=False,
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    used = SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    if used:
        _unmarked(item, f"uses the {' and '.join(sorted(used))} fixture")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.remove(item)


def _started_in_integration_tests(start: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(start)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _running:
            _unmarked(_running[-1], f"starts a {type(self).__name__}")
        return start(self, *args, **kwargs)

    return checked


# Tables printed after the run: a test adds a row as the user property ``(SUMMARY_ROW, (section,
# headers, row))``; rows travel in the test reports, so a run on xdist workers prints them too.
SUMMARY_ROW = "summary_row"
_TABLES: dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        for name, value in report.user_properties:
            if name == SUMMARY_ROW:
                section, headers, row = value
                _TABLES.setdefault(section, (tuple(headers), []))[1].append(tuple(row))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from sentinel.tables import format_table

    for section, (headers, rows) in _TABLES.items():
        terminalreporter.section(section)
        terminalreporter.write_line(format_table(rows, headers=headers))


# pytest-xdist (``./run.sh test`` runs the suite on several workers, ``--dist loadgroup
# --no-loadscope-reorder``): the tests of a module with a module- or class-scoped fixture (its
# own ensemble or server) run on one worker, so that fixture starts once; the Spark tests share
# one worker's SparkSession. xdist hands out the work in the order collected, so the longest
# goes first and the shortest fills the end: kazoo's suite's shards (minutes each), the groups,
# the fault and integration tests, the unit tests last.
FIRST = "tests/kazoo_suite/"
SHARED_SCOPES = frozenset({"module", "class", "package"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = {}
    for item in items:
        groups[item] = _worker_group(item)
        if groups[item] is not None:
            item.add_marker(pytest.mark.xdist_group(groups[item]))
            if getattr(config.option, "loadgroup", False):
                _name_group(item, groups[item])
    items.sort(
        key=lambda item: (
            not item.nodeid.startswith(FIRST),
            groups[item] is None,
            "/unit/" in item.nodeid,
        )
    )


def _name_group(item: pytest.Item, group: str) -> None:
    """On an xdist worker: the group as xdist's scheduler reads it, a suffix of the node id.

    pytest-xdist (3.8) adds it by setting ``item._nodeid``, which pytest 9.2 no longer reads
    (a node's id is ``item._id``), so that ``--dist loadgroup`` grouped nothing: each worker
    that ran one test of a module started that module's server, and the Spark tests started a
    SparkSession on several workers. Before pytest 9.2 (no ``_id``) xdist's own renaming works;
    where a fixed xdist has renamed it already, the id holds the group."""
    if "@" in item.nodeid or not hasattr(item, "_id"):
        return
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{group}")


def _worker_group(item: pytest.Item) -> str | None:
    if "spark" in getattr(item, "fixturenames", ()):
        return "spark"
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(defs[-1].scope in SHARED_SCOPES for defs in definitions.values() if defs):
        return item.nodeid.split("::")[0]
    return None


ZooKeeperServer.launch = _started_in_integration_tests(ZooKeeperServer.launch)  # type: ignore[method-assign]
# The suite's ZooKeeper servers live seconds to minutes (as sentinel.testing.spark's JVMs do).
zookeeper_launcher.JVM_OPTIONS = (
    *zookeeper_launcher.JVM_OPTIONS,
    *zookeeper_launcher.short_lived_jvm_options(),
)
LocalPostgres.start = _started_in_integration_tests(LocalPostgres.start)  # type: ignore[method-assign]
# The suite's Spark JVMs (the test clusters' daemons, drivers and executors, the SparkSession's
# driver, the demo's) skip the bytecode verifier for the class path's classes, Spark's thousands
# among them, which each JVM would verify again at every start (docs/testing-history.md, "One Spark
# cluster for both applications"). For the suite only: a cluster of sentinel.testing.spark may
# run an application's own jars, which the verifier should see.
spark_launcher.JVM_OPTIONS = (
    *spark_launcher.JVM_OPTIONS,
    "-XX:+UnlockDiagnosticVMOptions",
    "-XX:-BytecodeVerificationRemote",
)


@pytest.fixture(scope="session")
def zookeeper() -> Iterator[LocalZooKeeper]:
    """A standalone ZooKeeper server shared by the whole test session."""
    with LocalZooKeeper() as zk:
        yield zk


@pytest.fixture
def namespace() -> str:
    """A namespace root of its own, so tests on the shared server never see each other."""
    return f"/test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_client(zookeeper: LocalZooKeeper, namespace: str) -> Iterator[Callable[..., Sentinel]]:
    """Start Sentinel clients on the shared server and namespace; close them after the test."""
    clients: list[Sentinel] = []

    def make(
        client_id: str = "test-client", persistent_watches: bool | None = None, **kwargs: Any
    ) -> Sentinel:
        kwargs.setdefault("hosts", zookeeper.connect_string)
        kwargs.setdefault("namespace", namespace)
        # SENTINEL_TEST_WATCHES=one-shot runs the tests' clients in the fallback mode, except
        # where a test asks for a mode (which then wins over its cache=CacheConfig's).
        if persistent_watches is None:
            persistent_watches = os.environ.get(WATCHES_ENV) != "one-shot"
        cache = kwargs.get("cache") or CacheConfig()
        kwargs["cache"] = dataclasses.replace(cache, persistent_watches=persistent_watches)
        client = Sentinel(client_id=client_id, **kwargs).start()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def raw_zk(zookeeper: LocalZooKeeper, namespace: str) -> Iterator[KazooClient]:
    """A plain kazoo client rooted at the test's namespace, for looking behind the API."""
    zk = KazooClient(hosts=f"{zookeeper.connect_string}{namespace}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No chroot path exists")
        zk.start(timeout=10)
    zk.ensure_path("/")
    yield zk
    zk.stop()
    zk.close()


@pytest.fixture
def postgres() -> Iterator[LocalPostgres]:
    """A PostgreSQL primary of the test's own (``add_replica()`` streams from it)."""
    try:
        server = LocalPostgres()
    except PostgresNotInstalled as exc:
        pytest.skip(f"PostgreSQL is not installed here and could not be: {exc}")
    with server:
        yield server


SENTINEL = str(Path(sys.executable).with_name("sentinel"))


@pytest.fixture
def cli(zookeeper: LocalZooKeeper, namespace: str) -> Callable[..., subprocess.CompletedProcess]:
    """Run ``sentinel ARGS --zk ... --namespace ...``; returns the CompletedProcess."""

    def run(
        *args: str, namespace_override: str | None = None, timeout: float = 60, input: str = ""
    ) -> subprocess.CompletedProcess:
        command = [SENTINEL, *args, *_zk_arguments(zookeeper, namespace_override or namespace)]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, input=input
        )

    return run


def _zk_arguments(zookeeper: LocalZooKeeper, namespace: str) -> list[str]:
    return ["--zk", zookeeper.connect_string, "--namespace", namespace]


def sentinel_in_process(*args: str, input: str = "") -> subprocess.CompletedProcess:
    """``sentinel ARGS`` without the interpreter: ``sentinel.cli.main`` run in this process.

    The same parser, handlers and exit codes (``SystemExit`` from argparse included), with
    stdin, stdout and stderr as strings; it saves starting Python and importing the CLI (about
    half a second of a CI core per call). ``main`` configures logging as in a fresh process
    (its ``basicConfig`` handler writes to the captured stderr, so a secret logged at WARNING
    shows there as it would), and the root and kazoo loggers are put back afterwards. For tests
    of what a command does, not of the process (signals, the console script): those run
    ``SENTINEL``.
    """
    from sentinel.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    stdin, sys.stdin = sys.stdin, io.TextIOWrapper(io.BytesIO(input.encode()))
    root, kazoo = logging.getLogger(), logging.getLogger("kazoo")
    handlers, level, kazoo_level = root.handlers[:], root.level, kazoo.level
    root.handlers = []  # as in a fresh process, so that main's basicConfig takes effect
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.stdin = stdin
        root.handlers = handlers
        root.setLevel(level)
        kazoo.setLevel(kazoo_level)
    return subprocess.CompletedProcess(
        ["sentinel", *args], code, stdout.getvalue(), stderr.getvalue()
    )


@pytest.fixture
def cli_in_process(
    zookeeper: LocalZooKeeper, namespace: str
) -> Callable[..., subprocess.CompletedProcess]:
    """``cli``'s calls run by :func:`sentinel_in_process`."""

    def run(
        *args: str, namespace_override: str | None = None, input: str = ""
    ) -> subprocess.CompletedProcess:
        zk = _zk_arguments(zookeeper, namespace_override or namespace)
        return sentinel_in_process(*args, *zk, input=input)

    return run


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local SparkSession for every Spark test (starting one takes seconds).

    Two cores, no UI; the workers run this interpreter, so they import this checkout. The
    driver's JVM is tuned as the test clusters' are (the client compiler, one GC thread, no
    bytecode verifier).
    """
    from pyspark.sql import SparkSession

    from sentinel.testing.spark import JVM_OPTIONS as SPARK_JVM_OPTIONS

    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYSPARK_PYTHON", sys.executable)
        session = (
            SparkSession.builder.master("local[2]")
            .appName("sentinel-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.python.worker.reuse", "true")
            .config("spark.driver.extraJavaOptions", " ".join(SPARK_JVM_OPTIONS))
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        yield session
        session.stop()


@pytest.fixture(scope="session")
def curator_java(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The command that runs tests/peers/CuratorRegistry.java, compiled once against Debian's
    libcurator-discovery-java (real Java Curator, for the interop tests).

    Once for the run: the xdist workers share the directory above their own temporary ones,
    and the first to get there compiles (javac takes about 4 s of a core) into a directory
    named by the sources' digest, under a lock; the others use its classes."""
    from benchmarks.common import compile_peer
    from benchmarks.compare import INSTALL, JARS

    peers = Path(__file__).resolve().parent / "peers"
    digest = hashlib.sha256()
    for source in sorted(peers.rglob("*.java")):
        digest.update(source.relative_to(peers).as_posix().encode() + b"\0" + source.read_bytes())
    build = tmp_path_factory.getbasetemp().parent / f"curator-{digest.hexdigest()[:16]}"
    with open(f"{build}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        compiled = build / "command.json"  # written once the classes are all there
        if compiled.exists():
            java = json.loads(compiled.read_text())
        else:
            build.mkdir(exist_ok=True)
            java, why_not = compile_peer(
                build, peers / "CuratorRegistry.java", JARS, "CuratorRegistry", INSTALL
            )
            if java is None:  # not kept: the next run tries again
                pytest.skip(f"Java Curator cannot run here ({why_not})")
            compiled.write_text(json.dumps(java))
    # Short-lived JVMs, as the suite's ZooKeeper servers: the client compiler alone.
    return [java[0], CLIENT_COMPILER_ONLY, "-XX:+UseSerialGC", *java[1:]]


class CuratorPeer:
    """One Java Curator process and session serving the interop tests' commands
    (``CuratorRegistry.java``'s ``serve`` mode): ``ask("registry", base)``, ``ask("discover",
    base, service)``... each answered by its JSON. Started again if it has exited."""

    def __init__(self, java: list[str], hosts: str) -> None:
        self.java, self.hosts = java, hosts
        self.process: subprocess.Popen | None = None

    def ask(self, *words: str, timeout: float = 60) -> dict[str, Any]:
        """Send one command, return its answer; a command the peer failed raises."""
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [*self.java, self.hosts, "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        process = self.process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(" ".join(words) + "\n")
        process.stdin.flush()
        if not select.select([process.stdout], [], [], timeout)[0]:
            self.close(kill=True)  # its answer would be read as the next command's
            raise TimeoutError(f"the Curator peer did not answer {words} in {timeout} s")
        answer = json.loads(process.stdout.readline() or "null")
        if not isinstance(answer, dict) or "failed" in answer:
            raise RuntimeError(f"the Curator peer answered {words} with {answer}")
        return answer

    def close(self, kill: bool = False) -> None:
        """End the process (its registrations go with its session)."""
        if self.process is not None:
            if kill:
                self.process.kill()
            self.process.communicate(timeout=60)  # closes stdin: the peer closes and exits
            self.process = None


@pytest.fixture(scope="session")
def curator_peer(curator_java: list[str], zookeeper: LocalZooKeeper) -> Iterator[CuratorPeer]:
    """A Java Curator peer on the session's server, shared by the tests of one worker; each
    test registers under base paths of its own and closes them."""
    peer = CuratorPeer(curator_java, zookeeper.connect_string)
    yield peer
    peer.close()
