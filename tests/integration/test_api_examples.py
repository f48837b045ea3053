"""Every public method and property of the facade (`sentinel.Sentinel`) and of its role objects
(`client.shard_maps`, `client.credentials`) has an example, and every example runs.

The examples live in docs/api/examples/ (one file per class, ``## name`` per member); the
reference's Griffe extension adds each to its member's docstring as its Examples section. Here
they run as doctests, file by file in the reference's order and section by section in the
file's, in one namespace, against the real ZooKeeper the first example starts, as a reader
who typed them into one interpreter would.
"""

from __future__ import annotations

import doctest
import importlib.util
import inspect
from pathlib import Path

import pytest

from sentinel import Sentinel
from sentinel.auth.writer import CredentialWriter
from sentinel.shards.writer import ShardMapWriter

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLASSES = {
    "sentinel.Sentinel": Sentinel,
    "sentinel.shards.writer.ShardMapWriter": ShardMapWriter,
    "sentinel.auth.writer.CredentialWriter": CredentialWriter,
}


def reference():
    spec = importlib.util.spec_from_file_location("reference", ROOT / "docs/hooks/reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLES = reference().examples()


def public_members(cls: type) -> set[str]:
    """Methods and properties a user calls."""
    names = set()
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property) or inspect.isfunction(value):
            names.add(name)
    return names


@pytest.mark.parametrize("path", CLASSES)
def test_every_public_method_has_an_example(path):
    documented = {name.removeprefix(path + ".") for name in EXAMPLES if name.startswith(path + ".")}
    expected = public_members(CLASSES[path])
    assert sorted(expected - documented) == [], "members without an example"
    assert sorted(documented - expected) == [], "examples of members that do not exist"
    for name in expected:
        assert ">>> " in EXAMPLES[f"{path}.{name}"], f"{path}.{name}: no code to run"


def test_the_examples_run_as_written():
    globs: dict[str, object] = {}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    parser = doctest.DocTestParser()
    failed = []
    try:
        for name, text in EXAMPLES.items():
            test = parser.get_doctest(text, globs, name, f"docs/api/examples ({name})", 0)
            result = runner.run(test, clear_globs=False)
            globs = test.globs  # a DocTest runs in a copy: the next one continues from here
            if result.failed:
                failed.append(name)
    finally:  # what an example that failed left open
        for value in list(globs.values()):
            if isinstance(value, Sentinel):
                value.close()
        server = globs.get("zk")
        if server is not None:
            server.stop()
    assert failed == [], f"examples that do not print what they say: {failed}"
