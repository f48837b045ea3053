"""kazoo's test ids and what each test does with kazoo's ensemble, by the standard library alone
(the harness and ``kzplugin``, in ``.venv-kazoo``, both use it).

An id is the one ``--pyargs`` takes (``kazoo.tests.test_client::TestClient::test_create``); an
entry of a shard is an id or a part of one (``kazoo.tests.test_client::TestReconfig``, a
module) and selects every test under it. What a test does with the ensemble is read from
kazoo's source, because kazoo's test modules import what only ``.venv-kazoo`` has."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

# What a test's code does with kazoo's ensemble (:func:`ensemble_uses`).
MEMBER = "member"  # names one of its members: self.cluster[n]
RECONFIG = "reconfig"  # changes its membership: client.reconfig(...)


def within(test: str, entries: Iterable[str]) -> bool:
    """Whether ``test`` is one of ``entries`` or under one (its module or its class)."""
    return any(test == entry or test.startswith(f"{entry}::") for entry in entries)


def ensemble_uses(package: Path, tests: Iterable[str]) -> dict[str, set[str]]:
    """For each of ``tests`` (ids of kazoo's tests in ``package``, ``kazoo/tests``), what the
    code it runs does with the ensemble (:data:`MEMBER`, :data:`RECONFIG`): the test itself,
    its class's ``setUp`` and ``tearDown``, and every method (``self.name``, looked up from the
    test's class through its bases in the package) or function of the package's modules
    (``helper``, ``util.helper``) they name, in turn."""
    modules = {
        f"kazoo.tests.{path.stem}": _Module(f"kazoo.tests.{path.stem}", ast.parse(path.read_text()))
        for path in sorted(package.glob("*.py"))
    }
    return {test: _uses(modules, test) for test in tests}


class _Module:
    """A test module's functions and classes, and the package's names it imports."""

    def __init__(self, name: str, tree: ast.Module) -> None:
        self.name = name
        self.definitions = {
            node.name: node
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.ClassDef)
        }
        self.imported: dict[str, str] = {}  # local name -> "module" or "module::name"
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kazoo.tests"):
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = (
                        f"{node.module}.{alias.name}"
                        if node.module == "kazoo.tests"
                        else f"{node.module}::{alias.name}"
                    )


def _method(modules: dict[str, _Module], module: _Module, cls: ast.ClassDef, name: str):
    """``(module, FunctionDef)`` of method ``name`` as ``cls`` finds it (itself, then its bases
    in order), or None if the package does not define it."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return module, node
    for base in cls.bases:
        found = _defined(modules, module, base, ast.ClassDef)
        method = found and _method(modules, *found, name)
        if method:
            return method
    return None


def _uses(modules: dict[str, _Module], test: str) -> set[str]:
    name, *rest = test.split("[")[0].split("::")
    module = modules[name]
    if len(rest) == 1:
        cls, todo = None, [(module, module.definitions[rest[0]])]
    else:
        cls = (module, module.definitions[rest[0]])
        todo = [_method(modules, *cls, method) for method in (rest[1], "setUp", "tearDown")]
    uses: set[str] = set()
    seen: set[int] = set()
    while todo:
        found = todo.pop()
        if not found or id(found[1]) in seen:
            continue
        home, function = found
        seen.add(id(function))
        for node in ast.walk(function):
            if isinstance(node, ast.Subscript) and _named(node.value, "cluster"):
                uses.add(MEMBER)
            elif isinstance(node, ast.Call) and _named(node.func, "reconfig"):
                uses.add(RECONFIG)
            elif isinstance(node, ast.Attribute) and _is_self(node.value) and cls:
                todo.append(_method(modules, *cls, node.attr))
            elif isinstance(node, ast.Name | ast.Attribute):
                todo.append(_defined(modules, home, node, ast.FunctionDef))
    return uses


def _defined(modules: dict[str, _Module], module: _Module, node: ast.expr, kind: type):
    """``(module, definition)`` of the class or function (``kind``) of the package that ``node``
    names in ``module`` (``name``, an imported ``name`` or ``util.name``), or None."""
    if isinstance(node, ast.Name):
        target = module.imported.get(node.id, f"{module.name}::{node.id}")
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        target = f"{module.imported.get(node.value.id, '')}::{node.attr}"
    else:
        return None
    name, _, defined = target.partition("::")
    found = modules[name].definitions.get(defined) if name in modules else None
    return (modules[name], found) if isinstance(found, kind) else None


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _named(node: ast.expr, name: str) -> bool:
    """``name`` or ``something.name``."""
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute) and node.attr == name
    )
