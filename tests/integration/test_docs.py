"""The README's examples and every Python example of docs/*.md run as written.

A page's examples run in the test process, in the page's order and in one namespace (as a reader
who typed the page into one interpreter would), against a ZooKeeper server of this module's
whose connect string is ``$SENTINEL_ZK``: ``Sentinel(client_id=...)`` finds it as it finds the
reader's, and an example that starts a ``LocalZooKeeper`` of its own uses that one. Each page
starts on an empty server. An example fails if it raises, if an error is logged while it runs,
or if it prints other than the ```text block right after it, when there is one. Examples that
need more (a PostgreSQL server, the agent's bootstrap) are run by a test of their own, listed
below. An example that cannot run as shown says so on its first line, where the reader sees it
(``# Not run as shown (<why>): the example below runs as written.``), and an example it points
to runs and shares one of its calls; docs/testing.md ("The docs' examples") has the convention
and the counts.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import logging
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from sentinel import Sentinel
from sentinel.testing.zookeeper import LocalZooKeeper
from tests.conftest import SUMMARY_ROW

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
DOCS = README.parent / "docs"
# A ```python block, and the ```text block right after it if there is one: what it prints.
FENCE = re.compile(r"^```python\n(.*?)^```\n(?:\s*^```text\n(.*?)^```$)?", re.S | re.M)
MARKER = re.compile(
    r"# Not run as shown \((?P<reason>[^)]+)\): the example (?P<twin>above|below) runs as written\."
)
# Examples a test of their own runs, with what they need (a PostgreSQL server, the host agent's
# bootstrap, the names their page says are given, a dev server) and comparing what they print:
# (page, text of the example, or None for all the page's) -> that test, by node id.
RUN_BY_THEIR_OWN_TEST = {
    ("getting-started.md", None): "tests/integration/test_getting_started.py"
    "::test_the_first_hour_runs_as_written",
    ("grpc.md", 'grpc.insecure_channel("xds:///orders")'): "tests/integration/test_agent_xds.py"
    "::test_the_python_client_example_of_docs_grpc_runs",
    ("grpc.md", "LoopbackGRPCServer"): "tests/integration/test_integration_grpc.py"
    "::test_the_documented_examples_run_and_print_what_they_say",
    ("integrations.md", '(client, "orders-db"'): "tests/integration/test_integration_postgres.py"
    "::test_the_documented_examples_run",
    ("integrations.md", "LoopbackHTTPServer"): "tests/integration/test_integration_httpx.py"
    "::test_the_documented_examples_run_and_print_what_they_say",
    ("integrations.md", "AsyncSentinel(hosts"): "tests/integration/test_aio.py"
    "::test_the_documented_example_runs_and_prints_what_it_says",
    ("interop.md", "MinLag"): "tests/integration/test_docs.py"
    "::test_the_jvm_registry_example_runs_and_prints_what_it_says",
    ("resolution.md", "def application("): "tests/integration/test_fork.py"
    "::test_gunicorn_preload_workers_each_get_a_session_and_see_fresh_registrations",
}
# The reader's environment that would point an example elsewhere than this module's server.
ENVIRONMENT = ("SENTINEL_ZK_IDENTITY", "SENTINEL_REGIONS", "SENTINEL_REGION", "SENTINEL_AGENT")


@dataclass(frozen=True)
class Example:
    """One ```python block of a page: where it is, its code, and its marker if it has one."""

    page: str
    line: int
    code: str
    #: The ```text block right after it: what the page says it prints.
    output: str | None = None

    @property
    def marker(self) -> re.Match[str] | None:
        return MARKER.fullmatch(self.code.split("\n", 1)[0])

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    @property
    def run_by(self) -> str | None:
        """The test of its own that runs it, if one does."""
        for (page, text), test in RUN_BY_THEIR_OWN_TEST.items():
            if page == self.page and (text is None or text in self.code):
                return test
        return None

    def calls(self) -> set[str]:
        """The names it calls (``f(...)``, ``x.f(...)``), the built-ins left out."""
        called = set()
        for node in ast.walk(ast.parse(self.code, self.where)):
            if isinstance(node, ast.Call):
                if isinstance(node.func, ast.Name):
                    called.add(node.func.id)
                elif isinstance(node.func, ast.Attribute):
                    called.add(node.func.attr)
        return called - set(dir(builtins))


def examples(page: str) -> list[Example]:
    text = (DOCS / page).read_text()
    return [
        Example(page, text.count("\n", 0, match.start()) + 2, *match.groups())
        for match in FENCE.finditer(text)
    ]


PAGES = sorted(p.name for p in DOCS.glob("*.md") if examples(p.name))
ALL = [example for page in PAGES for example in examples(page)]
MARKED = [e for e in ALL if e.marker]
RUN_ELSEWHERE = [e for e in ALL if not e.marker and e.run_by]
RUN_HERE = [e for e in ALL if not e.marker and not e.run_by]


def quick_start() -> str:
    block = re.search(r"## Quick start\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README has no Quick start python block"
    return block.group(1)


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_readme_quick_start_runs_and_prints_what_it_says():
    assert run_python(quick_start()).strip() == "postgresql://10.0.0.5:5432"


def test_readme_quick_start_runs_twice_against_one_server(zookeeper, namespace):
    """As against ``sentinel zk start``: the second run finds what the first one created."""
    code = quick_start()
    # The test's server and a namespace of its own in place of the example's fresh server.
    edits = {
        "LocalZooKeeper() as zk": "contextlib.nullcontext(types.SimpleNamespace("
        f"connect_string={zookeeper.connect_string!r})) as zk",
        "hosts=zk.connect_string,": f"hosts=zk.connect_string, namespace={namespace!r},",
    }
    for old, new in edits.items():
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    code = "import contextlib, types\n" + code
    for _ in range(2):
        assert run_python(code).strip() == "postgresql://10.0.0.5:5432"


def test_the_jvm_registry_example_runs_and_prints_what_it_says():
    """docs/interop.md's example: Spring-shaped replicas in a Curator registry, routed by
    a shard map on their payload and the least lag."""
    doc = README.parent / "docs" / "interop.md"
    blocks = [b for b in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S) if "MinLag" in b]
    assert len(blocks) == 1, "docs/interop.md has one example with MinLag"
    assert run_python(blocks[0]).strip() == "postgresql://10.0.1.2:5432"


def test_every_example_is_python_that_parses():
    for example in ALL:
        example.calls()  # a SyntaxError names the page and line


@pytest.mark.parametrize("example", MARKED, ids=lambda e: e.where)
def test_an_example_not_run_says_why_and_a_twin_runs(example):
    """The twin is an example on that side that is not marked and calls at least one thing the
    marked one calls (not counting the built-ins): it shows the same API, runnable."""
    assert len(example.marker["reason"].split()) >= 2, f"{example.where}: say why"
    page = examples(example.page)
    index = page.index(example)
    side = page[:index] if example.marker["twin"] == "above" else page[index + 1 :]
    twins = [e for e in side if not e.marker and e.calls() & example.calls()]
    assert twins, f"{example.where}: no example {example.marker['twin']} runs what it shows"


@pytest.mark.parametrize("key", RUN_BY_THEIR_OWN_TEST, ids=str)
def test_an_example_run_by_its_own_test_is_there_and_so_is_the_test(key):
    page, text = key
    path, name = RUN_BY_THEIR_OWN_TEST[key].split("::")
    assert [e for e in examples(page) if text is None or text in e.code], (page, text)
    source = (README.parent / path).read_text()
    assert f"def {name}(" in source and page in source, f"{path} does not run docs/{page}"


# Session-scoped rather than module-scoped, so that pytest-xdist spreads the pages over its
# workers (a module-scoped fixture groups a module on one: tests/conftest.py) and each worker
# that runs one starts its own server (half a second).
@pytest.fixture(scope="session")
def docs_zookeeper() -> Iterator[LocalZooKeeper]:
    """The reader's ZooKeeper: a server of this module's, emptied before each page."""
    with LocalZooKeeper() as zk:
        yield zk


@pytest.fixture
def reader(docs_zookeeper, tmp_path, monkeypatch, request):
    """The environment of a reader whose ZooKeeper is ``$SENTINEL_ZK``, in an empty working
    directory, on an empty server: the function that runs a page's examples, each page's
    seconds added to the table printed after the run."""
    zk = KazooClient(docs_zookeeper.connect_string)
    zk.start(timeout=10)
    try:
        for child in zk.get_children("/"):
            if child != "zookeeper":
                zk.delete(f"/{child}", recursive=True)
    finally:
        zk.stop()
        zk.close()
    monkeypatch.setenv("SENTINEL_ZK", docs_zookeeper.connect_string)
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)

    def run(page: str) -> None:
        started = time.monotonic()
        ran = [e for e in RUN_HERE if e.page == page]
        run_page(ran)
        row = (page, len(ran), f"{time.monotonic() - started:.1f}")
        request.node.user_properties.append(
            (SUMMARY_ROW, ("docs examples run", ("page", "examples", "seconds"), row))
        )

    return run


class Errors(logging.Handler):
    """The errors logged while a page runs: a listener's exception is logged, not raised."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()}")


def run_page(page: list[Example]) -> None:
    """Each example in turn, in one namespace; a failure names the example and what it printed,
    and so does an error logged meanwhile."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    errors = Errors()
    logging.getLogger().addHandler(errors)
    try:
        for example in page:
            tree = ast.parse(example.code, example.where)
            ast.increment_lineno(tree, example.line - 1)  # a traceback names the page's line
            printed = io.StringIO()
            try:
                with contextlib.redirect_stdout(printed):
                    exec(compile(tree, f"docs/{example.page}", "exec"), namespace)
            except BaseException as exc:
                raise AssertionError(
                    f"{example.where} failed: {exc!r}; it printed {printed.getvalue()!r}"
                ) from exc
            assert errors.records == [], f"{example.where} logged errors: {errors.records}"
            if example.output is not None:
                assert printed.getvalue() == example.output, f"{example.where} printed otherwise"
    finally:  # what the page left open, as a reader's interpreter would at exit
        logging.getLogger().removeHandler(errors)
        for value in namespace.values():
            if isinstance(value, Sentinel):
                value.close()
            elif isinstance(value, LocalZooKeeper):
                value.stop()


SPARK_PAGES = {"spark.md"}  # on the suite's SparkSession (getOrCreate returns it)


@pytest.mark.parametrize("page", sorted({e.page for e in RUN_HERE} - SPARK_PAGES))
def test_the_examples_of_a_page_run_as_written(reader, page):
    reader(page)


@pytest.mark.parametrize("page", sorted(SPARK_PAGES))
def test_the_spark_examples_run_as_written(reader, spark, page):
    reader(page)


def test_docs_testing_md_gives_the_counts_as_they_are():
    """The counts docs/testing.md gives ("The docs' examples") are the pages' own."""
    stated = re.search(
        r"\*\*(\d+) Python examples: (\d+) run here, (\d+) by tests of their own, (\d+) marked\*\*",
        (DOCS / "testing.md").read_text(),
    )
    assert stated, "docs/testing.md does not count the docs' examples"
    counts = (len(ALL), len(RUN_HERE), len(RUN_ELSEWHERE), len(MARKED))
    assert tuple(map(int, stated.groups())) == counts
